//! Which Redis Cluster master serves a key: the cluster's slot table
//! (slot ranges → master address) as the Redis backend last read it
//! (`CLUSTER SLOTS`, [`super::redis::slots`]). [`super::GuardedStore`] uses it
//! to pick the breaker of the node a call goes to, so a dead master
//! degrades only the keys of its own slots.
//!
//! The table is a copy for routing decisions on our side only; redis-rs
//! keeps its own and follows `MOVED`/`ASK` itself. A stale table can only
//! charge a failure to the wrong node's breaker until the next refresh,
//! never change what is served: a call that fails is degraded either way.

use arc_swap::ArcSwap;
use std::sync::Arc;

/// Hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// One contiguous range of slots served by one master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub start: u16,
    /// Inclusive, as in `CLUSTER SLOTS`.
    pub end: u16,
    /// `host:port` of the master.
    pub node: Arc<str>,
}

/// The slot table, replaced whole on every refresh (lock-free reads).
#[derive(Default)]
pub struct SlotMap {
    /// Sorted by `start`, non-overlapping.
    ranges: ArcSwap<Vec<SlotRange>>,
}

impl SlotMap {
    /// Replaces the table (`ranges` in any order); true if it changed.
    pub(crate) fn replace(&self, mut ranges: Vec<SlotRange>) -> bool {
        ranges.sort_by_key(|r| r.start);
        let old = self.ranges.swap(Arc::new(ranges));
        **old != **self.ranges.load()
    }

    /// The master serving `key`'s slot; `None` before the first refresh or
    /// for a slot no master covers.
    pub(crate) fn node_of(&self, key: &[u8]) -> Option<Arc<str>> {
        self.node_of_slot(slot_of(key))
    }

    pub(crate) fn node_of_slot(&self, slot: u16) -> Option<Arc<str>> {
        let ranges = self.ranges.load();
        let i = ranges.partition_point(|r| r.start <= slot);
        let range = ranges.get(i.checked_sub(1)?)?;
        (slot <= range.end).then(|| range.node.clone())
    }

    /// The first slot of every master's first range: a route to each master.
    pub(crate) fn first_slots(&self) -> Vec<u16> {
        let ranges = self.ranges.load();
        let mut seen: Vec<&str> = Vec::new();
        let mut slots = Vec::new();
        for range in ranges.iter() {
            if !seen.contains(&&*range.node) {
                seen.push(&range.node);
                slots.push(range.start);
            }
        }
        slots
    }

    /// Every master in the table, once each.
    pub(crate) fn nodes(&self) -> Vec<Arc<str>> {
        let mut nodes: Vec<Arc<str>> = self.ranges.load().iter().map(|r| r.node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, if not empty) or of the whole key.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).unwrap_or(key)) % SLOTS
}

pub(crate) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|b| *b == b'{')?;
    let len = key[open + 1..].iter().position(|b| *b == b'}')?;
    let tag = &key[open + 1..open + 1 + len];
    (!tag.is_empty()).then_some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag_rule() {
        // Values from the Redis Cluster specification / `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(
            slot_of(b"foo{}{bar}"),
            slot_of(b"foo{}{bar}"),
            "empty tag: whole key"
        );
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    #[test]
    fn node_of_finds_the_range() {
        let map = SlotMap::default();
        assert_eq!(map.node_of_slot(0), None, "empty before the first refresh");
        let n = |s: &str| Arc::<str>::from(s);
        map.replace(vec![
            SlotRange {
                start: 10923,
                end: 16383,
                node: n("c"),
            },
            SlotRange {
                start: 0,
                end: 5460,
                node: n("a"),
            },
            SlotRange {
                start: 5461,
                end: 10000,
                node: n("b"),
            },
        ]);
        assert_eq!(map.node_of_slot(0).as_deref(), Some("a"));
        assert_eq!(map.node_of_slot(5460).as_deref(), Some("a"));
        assert_eq!(map.node_of_slot(5461).as_deref(), Some("b"));
        assert_eq!(map.node_of_slot(10500), None, "uncovered");
        assert_eq!(map.node_of_slot(16383).as_deref(), Some("c"));
        assert_eq!(map.nodes().len(), 3);
    }
}
