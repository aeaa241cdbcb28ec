//! The Lua scripts of the generation protocol (SPEC §5.3), embedded from
//! `lua/*.lua` at build time so the binary and its scripts cannot drift.
//!
//! Each script is a [`redis::Script`]: `invoke_async` sends `EVALSHA` and, on
//! `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`, failover to a replica that
//! never saw the script), loads it and retries once. The SHA-1 is computed
//! once per process when the static is first touched.
//!
//! KEYS, ARGV and return values are documented in each file's header.

use redis::Script;
use std::sync::LazyLock;

/// `ticket.lua`: current generation, created fresh if missing.
pub static TICKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/ticket.lua")));

/// `lease.lua`: {1, ticket} won, {2, ticket} won by superseding an older
/// generation's fill, {0, ticket} held by a fill of the current generation.
pub static LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/lease.lua")));

/// `publish.lua`: 1 published, 0 lease lost, -1 generation changed.
pub static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/publish.lua")));

/// `publish_checked.lua`: publish.lua plus version floor (-2) and tag
/// generations (-3).
pub static PUBLISH_CHECKED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/publish_checked.lua")));

/// `floor.lua`: raises a version floor, returns the floor in force.
pub static FLOOR: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/floor.lua")));

/// `tag_tickets.lua`: the tags' generations, created where missing.
pub static TAG_TICKETS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/tag_tickets.lua")));

/// `invalidate.lua`: replaces the generation, returns the new value.
pub static INVALIDATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/invalidate.lua")));

/// `invalidate_marked.lua`: 1 replaced, 0 already covered by the event's mark.
pub static INVALIDATE_MARKED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/invalidate_marked.lua")));

/// `witness.lua`: the index of the feed's witness slot the caller holds
/// (renewed or taken), -1 if all are held by others.
pub static WITNESS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/witness.lua")));

/// `unlock.lua`: 1 deleted, 0 not the owner.
pub static UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/unlock.lua")));

/// `lease_renew.lua`: 1 lease TTL extended, 0 not the owner.
pub static LEASE_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/lease_renew.lua")));

/// `compare_delete.lua`: 1 deleted, 0 value differs.
pub static COMPARE_DELETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/compare_delete.lua")));

/// `inspect.lua`: entry, generation and lease with their PTTLs (read only).
pub static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/inspect.lua")));

/// `bloom_check.lua`: 0 certainly absent, 1 maybe, -1 unknown.
pub static BLOOM_CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/bloom_check.lua")));

/// `bloom_begin.lua`: 1 build lock taken and candidate created, 0 busy.
pub static BLOOM_BEGIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/bloom_begin.lua")));

/// `bloom_activate.lua`: 1 candidate renamed over `bits` and `ready` set, 0 not the owner.
pub static BLOOM_ACTIVATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/bloom_activate.lua")));

/// `bloom_renew.lua`: 1 lock and candidate TTLs extended, 0 not the owner.
pub static BLOOM_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/bloom_renew.lua")));

/// `bloom_add.lua`: 1 member's bits set, -1 lock owner changed (retry).
pub static BLOOM_ADD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/bloom_add.lua")));

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §5.3: every script documents KEYS, ARGV and its return values.
    #[test]
    fn scripts_have_contract_headers() {
        for (name, src) in [
            ("ticket", include_str!("../../lua/ticket.lua")),
            ("lease", include_str!("../../lua/lease.lua")),
            ("publish", include_str!("../../lua/publish.lua")),
            ("invalidate", include_str!("../../lua/invalidate.lua")),
            (
                "invalidate_marked",
                include_str!("../../lua/invalidate_marked.lua"),
            ),
            ("unlock", include_str!("../../lua/unlock.lua")),
            ("lease_renew", include_str!("../../lua/lease_renew.lua")),
            (
                "compare_delete",
                include_str!("../../lua/compare_delete.lua"),
            ),
            ("bloom_check", include_str!("../../lua/bloom_check.lua")),
            ("bloom_begin", include_str!("../../lua/bloom_begin.lua")),
            (
                "bloom_activate",
                include_str!("../../lua/bloom_activate.lua"),
            ),
            ("bloom_add", include_str!("../../lua/bloom_add.lua")),
        ] {
            assert!(src.contains("-- KEYS[1]"), "{name}: header names KEYS");
            assert!(src.contains("-- ARGV[1]"), "{name}: header names ARGV");
            assert!(
                src.contains("Returns"),
                "{name}: header names return values"
            );
        }
        let inspect = include_str!("../../lua/inspect.lua");
        assert!(inspect.contains("-- KEYS[3]") && inspect.contains("-- ARGV     none"));
        assert!(inspect.contains("Returns"));
        // Distinct scripts, distinct hashes (a copy-paste slip would collide).
        let mut hashes: Vec<&str> = [
            &TICKET,
            &PUBLISH,
            &INVALIDATE,
            &UNLOCK,
            &LEASE_RENEW,
            &COMPARE_DELETE,
            &BLOOM_CHECK,
            &BLOOM_BEGIN,
            &BLOOM_ACTIVATE,
            &BLOOM_ADD,
            &BLOOM_RENEW,
            &INSPECT,
        ]
        .iter()
        .map(|s| s.get_hash())
        .collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 12);
    }
}
