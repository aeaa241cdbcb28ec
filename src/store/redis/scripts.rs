//! The Lua scripts of the generation protocol
//! (docs/architecture.md#lua-scripts), embedded from `lua/*.lua` at build time
//! so the binary and its scripts cannot drift.
//!
//! Each script is a [`redis::Script`]: `invoke_async` sends `EVALSHA` and, on
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`, failover to a replica that
//! never saw the script), loads it and retries once. The SHA-1 is computed
//! once per process when the static is first touched. On a Cluster,
//! redis-rs sends that `SCRIPT LOAD` to every master, so it fails while any
//! master hangs; there the store answers `NOSCRIPT` with `EVAL` of the
//! source instead ([`eval_of`]), on the key's own master, and loads a
//! pipelined batch's script on the batch's master only ([`source_of`]).
//!
//! KEYS, ARGV and return values are documented in each file's header.

use redis::{Arg, Cmd, Script};
use std::collections::HashMap;
use std::sync::LazyLock;

/// Declares each script's static and lists every source in [`SOURCES`].
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Script> =
                LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $file))));
        )*
        /// (file, source) of every script.
        const SOURCES: &[(&str, &str)] = &[$(($file, include_str!(concat!("../../../lua/", $file)))),*];
    };
}

scripts! {
    /// `ticket.lua`: current generation, created fresh if missing.
    TICKET = "ticket.lua";
    /// `lease.lua`: {1, ticket, ''} won, {2|3|4, ticket, ''} won by
    /// superseding a fill whose generation, route or tag moved, {0, ticket,
    /// record} held by a fill of the current generation.
    LEASE = "lease.lua";
    /// `lease_depends.lua`: 1 the fill's dependencies recorded beside its
    /// lease, 0 not the owner.
    LEASE_DEPENDS = "lease_depends.lua";
    /// `publish.lua`: 1 published, 0 lease lost, -1 generation changed.
    PUBLISH = "publish.lua";
    /// `publish_checked.lua`: publish.lua plus version floor (-2) and tag
    /// generations (-3).
    PUBLISH_CHECKED = "publish_checked.lua";
    /// `floor.lua`: raises a version floor, returns the floor in force.
    FLOOR = "floor.lua";
    /// `tag_tickets.lua`: the tags' generations, created where missing.
    TAG_TICKETS = "tag_tickets.lua";
    /// `tag_tickets_since.lua`: {'1', generations...} when no tag was
    /// replaced since the given clock, {'0'} otherwise.
    TAG_TICKETS_SINCE = "tag_tickets_since.lua";
    /// `invalidate.lua`: replaces the generation, returns the new value.
    INVALIDATE = "invalidate.lua";
    /// `invalidate_marked.lua`: 1 replaced, 0 already covered by the event's mark.
    INVALIDATE_MARKED = "invalidate_marked.lua";
    /// `witness.lua`: the index of the feed's witness slot the caller holds
    /// (renewed or taken), -1 if all are held by others.
    WITNESS = "witness.lua";
    /// `unlock.lua`: 1 deleted, 0 not the owner.
    UNLOCK = "unlock.lua";
    /// `lease_renew.lua`: 1 lease TTL extended, 0 not the owner.
    LEASE_RENEW = "lease_renew.lua";
    /// `compare_delete.lua`: 1 deleted, 0 value differs.
    COMPARE_DELETE = "compare_delete.lua";
    /// `inspect.lua`: entry, generation and lease with their PTTLs (read only).
    INSPECT = "inspect.lua";
    /// `bloom_check.lua`: 0 certainly absent, 1 maybe, -1 unknown.
    BLOOM_CHECK = "bloom_check.lua";
    /// `bloom_begin.lua`: 1 build lock taken and candidate created, 0 busy.
    BLOOM_BEGIN = "bloom_begin.lua";
    /// `bloom_activate.lua`: 1 candidate renamed over `bits` and `ready` set, 0 not the owner.
    BLOOM_ACTIVATE = "bloom_activate.lua";
    /// `bloom_renew.lua`: 1 lock and candidate TTLs extended, 0 not the owner.
    BLOOM_RENEW = "bloom_renew.lua";
    /// `bloom_add.lua`: 1 member's bits set, -1 lock owner changed (retry).
    BLOOM_ADD = "bloom_add.lua";
}

/// Each script's source by its SHA-1 (hex, as `EVALSHA` names it).
static BY_HASH: LazyLock<HashMap<String, &'static str>> = LazyLock::new(|| {
    SOURCES
        .iter()
        .map(|(_, src)| (Script::new(src).get_hash().to_owned(), *src))
        .collect()
});

/// The source of `script`, one of these.
pub(crate) fn source_of(script: &Script) -> Option<&'static str> {
    BY_HASH.get(script.get_hash()).copied()
}

/// `EVALSHA <sha> <numkeys> <keys and args>` of one of these scripts as
/// `EVAL <source> ...` (the same keys, so it is routed to the same node);
/// `None` for any other command.
pub(crate) fn eval_of(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    match args.next()? {
        Arg::Simple(name) if name.eq_ignore_ascii_case(b"EVALSHA") => {}
        _ => return None,
    }
    let Arg::Simple(sha) = args.next()? else {
        return None;
    };
    let source = BY_HASH.get(std::str::from_utf8(sha).ok()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(*source);
    for arg in args {
        let Arg::Simple(a) = arg else { return None };
        eval.arg(a);
    }
    Some(eval)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script documents KEYS, ARGV and its return values
    /// (docs/architecture.md#lua-scripts).
    #[test]
    fn scripts_have_contract_headers() {
        for (name, src) in SOURCES {
            assert!(src.contains("-- KEYS"), "{name}: header names KEYS");
            assert!(
                src.contains("-- ARGV[1]") || src.contains("-- ARGV     none"),
                "{name}: header names ARGV"
            );
            assert!(
                src.contains("Returns"),
                "{name}: header names return values"
            );
        }
        // Distinct scripts, distinct hashes (a copy-paste slip would collide).
        assert_eq!(BY_HASH.len(), SOURCES.len());
        // Every file in lua/ is loaded (none forgotten in the list above).
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/lua"))
            .expect("lua/ readable")
            .count();
        assert_eq!(SOURCES.len(), files);
    }

    #[test]
    fn evalsha_becomes_eval_of_the_same_keys_and_args() {
        let mut sha = redis::cmd("EVALSHA");
        sha.arg(UNLOCK.get_hash()).arg(1).arg("k").arg("owner");
        let eval = eval_of(&sha).expect("a known script");
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                Arg::Simple(a) => a.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let unlock = SOURCES
            .iter()
            .find(|(f, _)| *f == "unlock.lua")
            .expect("unlock")
            .1;
        let want: Vec<&[u8]> = vec![b"EVAL", unlock.as_bytes(), b"1", b"k", b"owner"];
        assert_eq!(args, want);
        assert!(eval_of(&redis::cmd("GET")).is_none());
        let mut unknown = redis::cmd("EVALSHA");
        unknown.arg("0000").arg(0);
        assert!(eval_of(&unknown).is_none());
    }
}
