//! What one shard of the embedded store drops when it is over its byte
//! budget (docs/architecture.md#embedded-store): which keys are cached
//! answers and which are the protocol's anchors, and the queues that pick
//! the victim.
//!
//! Entries (`…:e:…`) are evicted first, by S3-FIFO: a new entry enters a
//! small probationary FIFO (a tenth of the entry bytes); one read again
//! before it reaches the head moves to the main FIFO, one never read again
//! leaves and is remembered in a ghost list (hashes only), so that a key
//! that comes back soon goes straight to main. Main is a CLOCK: a read
//! entry at the head is reinserted with its frequency decremented. A scan
//! of one-off ids therefore only cycles the small queue and leaves the hot
//! keys in main alone.
//!
//! An object's tag and vary lists are hints (losing one costs a fill) and
//! are cached like entries. Everything else (generations, tag generations,
//! leases, floors, Bloom keys) is an anchor, in one FIFO. The order is:
//! 1. an object generation nothing in the shard depends on (each object
//!    generation counts its object's entries and leases; a crawler leaves
//!    one per id, and losing it costs nothing: the next ticket makes a
//!    fresh one), looked for among the few oldest anchors;
//! 2. entries and hints, by S3-FIFO;
//! 3. the oldest anchor, only once the shard holds no entry at all.
//!
//! An object's generation and lease share its entries' shard (one hash
//! tag), so they are never evicted before an entry that depends on them. A
//! tag generation lives in its tag's shard; evicting it is as safe (the
//! entries stamped with it become misses) but not ordered against entries
//! of other shards.
//!
//! Queues hold `(key, id)` tickets and are cleaned lazily: a ticket whose
//! key was since removed or rewritten under a new id is skipped when it
//! reaches the head, and the queues are compacted when stale tickets
//! outnumber live keys.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Which queue a key is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queue {
    /// Entries not read since they were written.
    Small,
    /// Entries read at least once while in `Small`, or back from the ghost.
    Main,
    /// Keys entries depend on; evicted only when no entry is left.
    Anchor,
}

/// What a key is, for the eviction order and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Entry,
    Generation,
    Lease,
    Floor,
    /// An object's hints (`:t` tag list, `:n` vary names) and keys outside
    /// the object layout (Bloom, witness slots).
    Other,
}

impl Kind {
    /// The kind of a key of docs/architecture.md#key-layout, from what
    /// follows its hash tag: `:e:` entry, `:g` generation (an object's or a
    /// tag's), `:l:` lease, `:f` floor.
    pub(super) fn of(key: &str) -> Kind {
        let Some(open) = key.find('{') else {
            return Kind::Other;
        };
        let Some(close) = key[open..].find('}') else {
            return Kind::Other;
        };
        let suffix = &key[open + close + 1..];
        if suffix.starts_with(":e:") {
            Kind::Entry
        } else if suffix == ":g" {
            Kind::Generation
        } else if suffix.starts_with(":l:") {
            Kind::Lease
        } else if suffix == ":f" {
            Kind::Floor
        } else {
            Kind::Other
        }
    }

    /// Metric label of `sidecache_memory_store_evictions_total`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Kind::Entry => "entry",
            Kind::Generation => "generation",
            Kind::Lease => "lease",
            Kind::Floor => "floor",
            Kind::Other => "other",
        }
    }

    pub(crate) const ALL: [Kind; 5] = [
        Kind::Entry,
        Kind::Generation,
        Kind::Lease,
        Kind::Floor,
        Kind::Other,
    ];

    /// Where a new key of this kind goes: answers and an object's hints
    /// (losing a hint costs one fill) are cached; the rest are anchors.
    pub(super) fn queue(key: &str, kind: Kind) -> Queue {
        let hint = kind == Kind::Other && (key.ends_with("}:t") || key.ends_with("}:n"));
        if kind == Kind::Entry || hint {
            Queue::Small
        } else {
            Queue::Anchor
        }
    }
}

/// The generation key of the object an entry or lease key belongs to:
/// `<ns>o:{<identity>}:e:…` → `<ns>o:{<identity>}:g`.
pub(super) fn generation_of(key: &str) -> Option<String> {
    let close = key.find('}')?;
    let mut generation = String::with_capacity(close + 3);
    generation.push_str(&key[..=close]);
    generation.push_str(":g");
    Some(generation)
}

/// Whether `key` is an object's generation (not a tag's): only those count
/// the entries that depend on them.
pub(super) fn is_object_generation(key: &str) -> bool {
    key.find('{')
        .is_some_and(|open| key[..open].ends_with("o:") && key.ends_with("}:g"))
}

impl Kind {}

/// A queue's reference to a key as it was when queued.
pub(super) struct Ticket {
    pub(super) key: Arc<str>,
    pub(super) id: u64,
}

/// The three FIFOs and the ghost list of one shard.
#[derive(Default)]
pub(super) struct Queues {
    pub(super) small: VecDeque<Ticket>,
    pub(super) main: VecDeque<Ticket>,
    pub(super) anchors: VecDeque<Ticket>,
    ghost: HashSet<u64>,
    ghost_order: VecDeque<u64>,
}

impl Queues {
    pub(super) fn push(&mut self, queue: Queue, ticket: Ticket) {
        match queue {
            Queue::Small => self.small.push_back(ticket),
            Queue::Main => self.main.push_back(ticket),
            Queue::Anchor => self.anchors.push_back(ticket),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.small.len() + self.main.len() + self.anchors.len()
    }

    /// Where a new entry goes: main if it was evicted from small recently.
    pub(super) fn admit(&mut self, key: &str) -> Queue {
        if self.ghost.remove(&ghost_hash(key)) {
            Queue::Main
        } else {
            Queue::Small
        }
    }

    /// Remembers an entry evicted from small, keeping at most `cap` hashes.
    pub(super) fn remember(&mut self, key: &str, cap: usize) {
        let hash = ghost_hash(key);
        if self.ghost.insert(hash) {
            self.ghost_order.push_back(hash);
        }
        while self.ghost_order.len() > cap.max(1) {
            if let Some(old) = self.ghost_order.pop_front() {
                self.ghost.remove(&old);
            }
        }
    }

    /// Keeps only the tickets `live` accepts.
    pub(super) fn compact(&mut self, live: impl Fn(Queue, &Ticket) -> bool) {
        self.small.retain(|t| live(Queue::Small, t));
        self.main.retain(|t| live(Queue::Main, t));
        self.anchors.retain(|t| live(Queue::Anchor, t));
    }
}

/// The ghost list's hash of a key (a collision only misplaces one entry).
fn ghost_hash(key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_key_layout() {
        assert_eq!(Kind::of("sc:o:{r:1}:e:v3:abc"), Kind::Entry);
        assert_eq!(Kind::of("sc:o:{r:1}:g"), Kind::Generation);
        assert_eq!(Kind::of("sc:t:{user:1}:g"), Kind::Generation);
        assert_eq!(Kind::of("sc:o:{r:1}:l:abc"), Kind::Lease);
        assert_eq!(Kind::of("sc:o:{r:1}:f"), Kind::Floor);
        assert_eq!(Kind::of("sc:o:{r:1}:t"), Kind::Other);
        assert_eq!(Kind::of("sc:b:{r:s}:ready"), Kind::Other);
        // A param value cannot hold `}` (percent-encoded), so the first
        // `}` closes the tag.
        assert_eq!(Kind::of("plain"), Kind::Other);
        assert_eq!(
            generation_of("sc:o:{r:1}:e:v3:abc").as_deref(),
            Some("sc:o:{r:1}:g")
        );
        assert!(is_object_generation("sc:o:{r:1}:g"));
        assert!(!is_object_generation("sc:t:{user:1}:g"));
        assert_eq!(Kind::queue("sc:o:{r:1}:t", Kind::Other), Queue::Small);
        assert_eq!(Kind::queue("sc:b:{r:s}:ready", Kind::Other), Queue::Anchor);
    }
}
