//! The store protocol's vocabulary: the values its calls take and answer
//! (one object's read, [`Snapshot`], with the near cache's [`Memo`]; the
//! fill lease, [`LeaseReply`]; a publish, [`PublishChecks`] and
//! [`PublishOutcome`]; a feed's witness slot, [`WitnessSlot`];
//! `/admin/lookup`'s [`Inspection`]), why a call failed ([`StoreError`]),
//! and what the values the protocol writes say ([`lease_ticket`],
//! [`covers`]). Every backend and the guard speak it.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Why a store call failed. Every kind means "store unavailable" to the read
/// pipeline (degraded path); the kinds differ in logs and metrics, and in
/// one more way: [`StoreError::WriteRefused`] does not open the breaker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out")]
    Timeout,
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    #[error("circuit breaker open")]
    BreakerOpen,
    /// The store answered but refuses writes (Redis `OOM` at `maxmemory`
    /// with `noeviction`, `READONLY` replica, `NOREPLICAS`, `MISCONF`).
    /// Reads still work, so this one does not open the breaker: hits go on
    /// being served, and misses go to the origin without caching.
    #[error("store refuses writes: {0}")]
    WriteRefused(String),
    /// An invalidation was applied by the primary but fewer replicas than
    /// `store.redis.replicas_ack` confirmed it in time: a failover now could
    /// lose it, so its event stays pending and is retried. Not a store
    /// failure: the breaker stays closed.
    #[error(
        "invalidation reached {acked} of {wanted} replicas within store.redis.replicas_timeout"
    )]
    ReplicaShortfall { acked: i64, wanted: u32 },
}

/// Everything stored for one object variant, with remaining TTLs (`None`:
/// the key is missing; `Some(None)`: it has no TTL). For the operator's
/// `/admin/lookup`, never for serving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    pub entry: Option<(Bytes, Option<Duration>)>,
    pub generation: Option<(Bytes, Option<Duration>)>,
    pub lease: Option<(Bytes, Option<Duration>)>,
}

/// What one `read` round trip returned. Two snapshots are equal when
/// their entry and generation are: a memo never changes what they say.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub entry: Option<Bytes>,
    pub generation: Option<Bytes>,
    /// From the near cache: the slot kept with `entry`'s bytes for what a
    /// reader derives from them (see [`Memo`]).
    pub memo: Option<Memo>,
}

/// A value a reader derives from an entry's bytes (the pipeline's decoded
/// entry), made on first use and kept by the near cache beside the bytes
/// for as long as it keeps them, so a hit does not decode the same bytes
/// again. Opaque to the store.
#[derive(Clone, Default)]
pub struct Memo(Arc<OnceLock<Arc<dyn Any + Send + Sync>>>);

impl Memo {
    /// The value made from the bytes, `make`-ing it on first use; `None`
    /// when `make` gives none (nothing is kept: corrupt bytes are removed
    /// from the store, and with them from the near cache) or the slot
    /// holds another type.
    pub(crate) fn get_or_make<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> Option<T>,
    ) -> Option<Arc<T>> {
        if let Some(v) = self.0.get() {
            return Arc::clone(v).downcast::<T>().ok();
        }
        let made = Arc::new(make()?);
        // Two readers may both make it; the first one set is kept.
        let _ = self.0.set(made.clone());
        Some(made)
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Memo(made)"
        } else {
            "Memo(empty)"
        })
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.entry == other.entry && self.generation == other.generation
    }
}

impl Eq for Snapshot {}

/// What `take_lease` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// The lease is ours: `value` (`<owner>@<ticket>`) is what publish,
    /// renew and unlock compare; `ticket` the generation the fill is for.
    Won {
        value: String,
        ticket: Bytes,
        /// A fill held it that can never publish, and was taken over: why.
        superseded: Option<Superseded>,
    },
    /// A fill of the current generation holds it: wait for its answer.
    Held,
}

/// Why a held lease was taken over rather than waited for: its fill can
/// never publish, and its answer predates an invalidation the waiter must
/// not be handed an answer from before of
/// (docs/architecture.md#no-older-answer-after-an-invalidation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Superseded {
    /// The fill's ticket is no longer the object's generation.
    Generation,
    /// The route's generation moved since the fill took its ticket (a
    /// route-wide purge).
    Route,
    /// A tag the fill took a ticket for was invalidated since.
    Tag,
}

impl Superseded {
    /// The `reason` label of `sidecache_lease_superseded_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Superseded::Generation => "generation",
            Superseded::Route => "route",
            Superseded::Tag => "tag",
        }
    }
}

/// What a fill's answer depends on besides its object's generation, as it
/// took the tickets before its upstream call: the route's generation and
/// the tags' (key, ticket). Recorded beside its lease
/// ([`super::ObjectStore::record_lease_depends`]) so that a waiter sees a
/// fill one of these moved for as doomed and takes it over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FillDepends {
    /// (route generation key, ticket).
    pub route: Option<(String, Bytes)>,
    /// (tag generation key, ticket).
    pub tags: Vec<(String, Bytes)>,
}

impl FillDepends {
    /// The record kept beside the lease: the lease value on the first line,
    /// then one `<r|t> <key> <ticket>` line per dependency (generations
    /// hold no space or newline; the key is everything between the first
    /// and the last space). `lua/lease.lua` reads the same format.
    pub(crate) fn record(&self, lease_value: &str) -> String {
        let mut out = String::from(lease_value);
        let lines = self.route.iter().map(|d| ('r', d));
        for (kind, (key, ticket)) in lines.chain(self.tags.iter().map(|d| ('t', d))) {
            out.push('\n');
            out.push(kind);
            out.push(' ');
            out.push_str(key);
            out.push(' ');
            out.push_str(&String::from_utf8_lossy(ticket));
        }
        out
    }

    /// The lease value a record was made for and its dependencies, each
    /// (why a move supersedes the fill, key, ticket); `None` if malformed.
    pub(crate) fn parse(record: &[u8]) -> Option<(&[u8], Vec<Listed<'_>>)> {
        let mut lines = record.split(|b| *b == b'\n');
        let value = lines.next()?;
        let mut deps = Vec::new();
        for line in lines {
            let line = std::str::from_utf8(line).ok()?;
            let (kind, rest) = line.split_once(' ')?;
            let (key, ticket) = rest.rsplit_once(' ')?;
            let why = match kind {
                "r" => Superseded::Route,
                "t" => Superseded::Tag,
                _ => return None,
            };
            deps.push((why, key, ticket.as_bytes()));
        }
        Some((value, deps))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.route.is_none() && self.tags.is_empty()
    }
}

/// One dependency a record lists: (why its move supersedes the fill, its
/// generation key, the fill's ticket).
pub(crate) type Listed<'a> = (Superseded, &'a str, &'a [u8]);

/// The key of the record of what the fill holding `lease_key` depends on
/// (`…:l:<variant>:d`, in the object's slot).
pub(crate) fn lease_depends_key(lease_key: &str) -> String {
    format!("{lease_key}:d")
}

impl LeaseReply {
    /// The reply for a lease taken by `owner` for `ticket`. Generations are
    /// ASCII (built from server time and a hex nonce); a value someone else
    /// wrote that is not UTF-8 makes a value that never compares equal, so
    /// that fill's publish is refused: a miss, never a wrong answer.
    pub(crate) fn won(owner: &str, ticket: Bytes, superseded: Option<Superseded>) -> LeaseReply {
        LeaseReply::Won {
            value: format!("{owner}@{}", String::from_utf8_lossy(&ticket)),
            ticket,
            superseded,
        }
    }
}

/// Whether a generation value `current` was created by applying an event
/// marked `mark` or, for stream marks (`s:<ms>-<seq>`), a later entry of the
/// stream: then it was created after that event committed, and replacing it
/// again would only cost a miss. Mirrors `lua/invalidate_marked.lua`.
pub(crate) fn covers(current: &[u8], mark: &str) -> bool {
    let Some(seen) = lease_ticket(current) else {
        return false;
    };
    if seen == mark.as_bytes() {
        return true;
    }
    let (Some(seen), Some(mark)) = (stream_mark(seen), stream_mark(mark.as_bytes())) else {
        return false;
    };
    seen >= mark
}

/// `s:<ms>-<seq>` as comparable numbers (`None` if not a stream mark).
fn stream_mark(mark: &[u8]) -> Option<(u128, u128)> {
    let id = std::str::from_utf8(mark.strip_prefix(b"s:")?).ok()?;
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The ticket a lease value was taken for (`<owner>@<ticket>`), or the
/// mark a generation value carries (`<time>-<nonce>@<mark>`): what follows
/// the first `@`.
pub(crate) fn lease_ticket(value: &[u8]) -> Option<&[u8]> {
    let at = value.iter().position(|b| *b == b'@')?;
    Some(&value[at + 1..])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    Published,
    /// The lease expired or another filler holds it now.
    LeaseLost,
    /// The generation moved since the ticket (invalidated, or lost and recreated).
    GenerationChanged,
    /// The answer's version is below the object's floor (or it has none
    /// while a floor exists).
    BelowFloor,
    /// A tag generation moved since the filler read it (or was lost).
    TagChanged,
}

/// What [`super::ObjectStore::publish_checked`] checks besides generation and lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishChecks {
    /// The object's floor key, for routes with `version_from`.
    pub floor_key: Option<String>,
    /// The answer's version (`None`: it sent none).
    pub version: Option<i64>,
    /// (tag generation key, the generation read before the upstream call).
    pub tags: Vec<(String, Bytes)>,
}

/// No checks: a plain publish (generation and lease only).
pub(crate) static NO_CHECKS: PublishChecks = PublishChecks {
    floor_key: None,
    version: None,
    tags: Vec::new(),
};

impl PublishChecks {
    /// Nothing to check besides generation and lease (a version without a
    /// floor key is not compared with anything).
    pub(crate) fn is_none(&self) -> bool {
        self.floor_key.is_none() && self.tags.is_empty()
    }
}

/// What [`super::FeedStore::witness`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WitnessSlot {
    /// The slot held now (renewed or just taken); `None`: others hold all.
    pub held: Option<usize>,
    /// Held: the TTL. Not held: until the first slot expires (when trying
    /// again can succeed).
    pub free_in: Duration,
}

/// What a call a backend does not support answers (the optional
/// capabilities' defaults): a protocol error, never a silent success.
pub(super) fn unsupported<'a, T: Send + 'a>(
    what: &'static str,
) -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(async move { Err(StoreError::Protocol(what.into())) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_memo_keeps_what_was_made_and_nothing_that_failed() {
        let memo = Memo::default();
        assert_eq!(memo.get_or_make(|| None::<u32>), None);
        let a = memo.get_or_make(|| Some(7u32)).expect("made");
        let b = memo.get_or_make(|| Some(8u32)).expect("kept");
        assert!(Arc::ptr_eq(&a, &b));
        // Another type is not the value kept.
        assert_eq!(memo.get_or_make(|| Some("x")), None);
        // Clones share the slot (the near cache hands out clones).
        assert_eq!(memo.clone().get_or_make(|| Some(9u32)).as_deref(), Some(&7));
    }

    use super::*;

    #[test]
    fn marks_cover_the_same_event_and_later_stream_entries() {
        let g = |mark: &str| format!("1796118908.010000-abc@{mark}").into_bytes();
        assert!(covers(&g("s:100-1"), "s:100-1"));
        assert!(covers(&g("s:100-2"), "s:100-1"), "a later entry");
        assert!(covers(&g("s:101-0"), "s:100-9"), "a later millisecond");
        assert!(covers(&g("s:1000-0"), "s:999-0"), "numbers, not text");
        assert!(!covers(&g("s:100-1"), "s:100-2"), "an earlier entry");
        assert!(!covers(&g("s:99-9"), "s:100-0"));
        assert!(covers(&g("o:7:123"), "o:7:123"));
        assert!(
            !covers(&g("o:7:123"), "o:8:123"),
            "outbox rows: only the same row"
        );
        assert!(
            !covers(&g("o:7:123"), "o:7:124"),
            "a row id handed out again"
        );
        assert!(!covers(&g("o:7:123"), "s:1-0"));
        assert!(!covers(b"1796118908.010000-abc", "s:1-0"), "no mark");
        assert!(!covers(&g("s:x-1"), "s:1-0"));
    }

    #[test]
    fn dependency_records_read_back_as_written() {
        let deps = FillDepends {
            route: Some(("sc:r:{app}:g".into(), Bytes::from_static(b"1.000001-a"))),
            tags: vec![
                (
                    "sc:t:{x y}:g".into(),
                    Bytes::from_static(b"2.000002-b@o:1:2"),
                ),
                ("sc:t:{z}:g".into(), Bytes::from_static(b"3.000003-c")),
            ],
        };
        let record = deps.record("own/1@9.000009-g");
        let (value, parsed) = FillDepends::parse(record.as_bytes()).expect("well formed");
        assert_eq!(value, b"own/1@9.000009-g");
        assert_eq!(
            parsed,
            vec![
                (Superseded::Route, "sc:r:{app}:g", &b"1.000001-a"[..]),
                (Superseded::Tag, "sc:t:{x y}:g", &b"2.000002-b@o:1:2"[..]),
                (Superseded::Tag, "sc:t:{z}:g", &b"3.000003-c"[..]),
            ]
        );
        assert!(FillDepends::parse(b"v\nq k t").is_none(), "unknown kind");
        assert!(FillDepends::parse(b"v\nr k").is_none(), "no ticket");
    }

    #[test]
    fn lease_values_name_their_ticket() {
        let ticket = Bytes::from_static(b"1.000001-n@s:5-0");
        let LeaseReply::Won { value, .. } = LeaseReply::won("owner", ticket.clone(), None) else {
            panic!("won");
        };
        assert_eq!(value, "owner@1.000001-n@s:5-0");
        assert_eq!(lease_ticket(value.as_bytes()), Some(ticket.as_ref()));
    }
}
