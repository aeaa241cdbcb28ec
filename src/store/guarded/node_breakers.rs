//! One breaker per Redis Cluster master (docs/operations.md#redis-cluster): a
//! call is admitted by the breaker of the master serving its key's slot
//! ([`SlotMap`]), so a dead master degrades only the keys of its own slots
//! while the others go on being served.
//!
//! Breakers are made on first use per `host:port` and kept (a handful per
//! cluster; a failover adds one). Each has its own gauge
//! `sidecache_store_node_breaker_open{node}`; `sidecache_breaker_open`
//! counts the open ones, so it stays 0 when all is well, as on a single
//! node. A key whose slot no known master serves (before the first
//! `CLUSTER SLOTS`, or an uncovered slot) goes through the `unrouted`
//! breaker.
//!
//! Also how the guard picks a call's breaker from the set it keeps
//! (`Breakers`: one for the store, or these per master) and groups a
//! multi-key call's keys by breaker (`Breakers::groups`, `pick`).

use super::breaker::Breaker;
use crate::store::slot_map::SlotMap;
use arc_swap::ArcSwap;
use prometheus::{IntGauge, IntGaugeVec};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The label of the breaker for keys no known master serves.
pub(crate) const UNROUTED: &str = "unrouted";

pub(crate) struct NodeBreakers {
    map: Arc<SlotMap>,
    cooldown: Duration,
    gauges: IntGaugeVec,
    total: IntGauge,
    /// Copy-on-write: reads are lock-free, a new node (rare) copies it.
    by_node: ArcSwap<HashMap<Arc<str>, Arc<Breaker>>>,
    /// Serializes the copy-on-write insertions.
    grow: Mutex<()>,
    unrouted: Arc<Breaker>,
}

impl NodeBreakers {
    /// `gauges{node}` per breaker; `total` counts the open ones.
    pub(crate) fn new(
        map: Arc<SlotMap>,
        cooldown: Duration,
        gauges: IntGaugeVec,
        total: IntGauge,
    ) -> NodeBreakers {
        total.set(0);
        let unrouted = Arc::new(Breaker::counted(
            cooldown,
            gauges.with_label_values(&[UNROUTED]),
            total.clone(),
        ));
        NodeBreakers {
            map,
            cooldown,
            gauges,
            total,
            by_node: ArcSwap::default(),
            grow: Mutex::new(()),
            unrouted,
        }
    }

    /// The breaker guarding `key`.
    pub(crate) fn for_key(&self, key: &[u8]) -> Arc<Breaker> {
        match self.map.node_of(key) {
            Some(node) => self.for_node(node),
            None => self.unrouted.clone(),
        }
    }

    /// The master serving `key`, if known.
    pub(crate) fn node_of(&self, key: &[u8]) -> Option<Arc<str>> {
        self.map.node_of(key)
    }

    fn for_node(&self, node: Arc<str>) -> Arc<Breaker> {
        if let Some(breaker) = self.by_node.load().get(&node) {
            return breaker.clone();
        }
        let _grow = self.grow.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.by_node.load_full();
        if let Some(breaker) = current.get(&node) {
            return breaker.clone();
        }
        let breaker = Arc::new(Breaker::counted(
            self.cooldown,
            self.gauges.with_label_values(&[&*node]),
            self.total.clone(),
        ));
        let mut grown = (*current).clone();
        grown.insert(node, breaker.clone());
        self.by_node.store(Arc::new(grown));
        breaker
    }

    /// True while any breaker of the set is open.
    pub(crate) fn any_open(&self) -> bool {
        self.unrouted.is_open() || self.by_node.load().values().any(|b| b.is_open())
    }

    /// `None` while any master's breaker admits calls; else the earliest
    /// time one will (every master known so far refuses: the store as a
    /// whole is unavailable). Before any master is known, the `unrouted`
    /// breaker's answer.
    pub(crate) fn all_refuse_until(&self) -> Option<tokio::time::Instant> {
        let nodes = self.by_node.load();
        if nodes.is_empty() {
            return self.unrouted.admits_at();
        }
        let mut earliest = None;
        for breaker in nodes.values() {
            let at = breaker.admits_at()?;
            earliest = Some(earliest.map_or(at, |e: tokio::time::Instant| e.min(at)));
        }
        earliest
    }

    /// [`Breaker::close_early`] on every breaker of the set.
    pub(crate) fn close_all_early(&self) {
        self.unrouted.close_early();
        for breaker in self.by_node.load().values() {
            breaker.close_early();
        }
    }
}

/// A guard's breakers: one for the store, or one per Redis Cluster master
/// (a dead master degrades only its own slots).
pub(super) enum Breakers {
    One(Breaker),
    PerNode(NodeBreakers),
}

/// The breaker a call goes through.
pub(super) enum Guard<'a> {
    One(&'a Breaker),
    Node(Arc<Breaker>),
}

impl Breakers {
    /// One breaker per master of `slot_map` (`gauges{node}` each, `total`
    /// counting the open ones), or without a slot map one breaker, on
    /// `total`.
    pub(super) fn new(
        slot_map: Option<&Arc<SlotMap>>,
        cooldown: Duration,
        gauges: &IntGaugeVec,
        total: &IntGauge,
    ) -> Breakers {
        match slot_map {
            Some(map) => Breakers::PerNode(NodeBreakers::new(
                map.clone(),
                cooldown,
                gauges.clone(),
                total.clone(),
            )),
            None => Breakers::One(Breaker::new(cooldown, total.clone())),
        }
    }

    /// True while the breaker is open or half-open; of a set, while any is.
    pub(super) fn is_open(&self) -> bool {
        match self {
            Breakers::One(b) => b.is_open(),
            Breakers::PerNode(set) => set.any_open(),
        }
    }

    /// The master (`host:port`) whose breaker guards `key`, once the slot
    /// table is known; `None` for a single breaker.
    pub(super) fn node_of(&self, key: &[u8]) -> Option<Arc<str>> {
        match self {
            Breakers::One(_) => None,
            Breakers::PerNode(set) => set.node_of(key),
        }
    }

    /// `None` while a call would be let through somewhere; else when one
    /// will be. On a cluster, only while every master's breaker refuses.
    pub(super) fn refuse_until(&self) -> Option<tokio::time::Instant> {
        match self {
            Breakers::One(b) => b.admits_at(),
            Breakers::PerNode(set) => set.all_refuse_until(),
        }
    }

    /// [`Breaker::close_early`] on every breaker of the set.
    pub(super) fn close_early(&self) {
        match self {
            Breakers::One(b) => b.close_early(),
            Breakers::PerNode(set) => set.close_all_early(),
        }
    }

    /// The breaker guarding calls on `key`.
    pub(super) fn guard(&self, key: &[u8]) -> Guard<'_> {
        match self {
            Breakers::One(b) => Guard::One(b),
            Breakers::PerNode(set) => Guard::Node(set.for_key(key)),
        }
    }

    /// `keys`' indices grouped by the breaker guarding them: one group on a
    /// single node, one per master involved on a cluster.
    pub(super) fn groups<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<(Guard<'_>, Vec<usize>)> {
        let mut groups: Vec<(Guard<'_>, Vec<usize>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let guard = self.guard(key.as_ref());
            match groups.iter_mut().find(|(g, _)| g.same(&guard)) {
                Some((_, members)) => members.push(i),
                None => groups.push((guard, vec![i])),
            }
        }
        groups
    }
}

impl std::ops::Deref for Guard<'_> {
    type Target = Breaker;
    fn deref(&self) -> &Breaker {
        match self {
            Guard::One(b) => b,
            Guard::Node(b) => b,
        }
    }
}

impl Guard<'_> {
    pub(super) fn same(&self, other: &Guard<'_>) -> bool {
        std::ptr::eq::<Breaker>(&**self, &**other)
    }
}

/// `items` at `group`'s indices (those past its end skipped); `items`
/// itself, not copied, when the group is all of them, as on a single node.
pub(super) fn pick<'s, T: Clone>(items: &'s [T], group: &[usize]) -> Cow<'s, [T]> {
    if group.iter().copied().eq(0..items.len()) {
        return Cow::Borrowed(items);
    }
    Cow::Owned(
        group
            .iter()
            .filter_map(|&i| items.get(i).cloned())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::protocol::StoreError;
    use crate::store::slot_map::{slot_of, SlotRange};

    #[tokio::test(start_paused = true)]
    async fn a_failure_opens_only_its_nodes_breaker() {
        let map = Arc::new(SlotMap::default());
        let gauges = IntGaugeVec::new(prometheus::Opts::new("g", "g"), &["node"]).unwrap();
        let total = IntGauge::new("t", "t").unwrap();
        let set = NodeBreakers::new(
            map.clone(),
            Duration::from_secs(2),
            gauges.clone(),
            total.clone(),
        );

        // Before the first refresh every key shares the unrouted breaker.
        assert!(Arc::ptr_eq(&set.for_key(b"a"), &set.for_key(b"b")));

        let (a, b) = (b"{a}x".as_slice(), b"{b}x".as_slice());
        let (sa, sb) = (slot_of(a), slot_of(b));
        assert_ne!(sa, sb);
        let n = |s: &str| Arc::<str>::from(s);
        map.replace(vec![
            SlotRange {
                start: 0,
                end: sa.max(sb) - 1,
                node: n(if sa < sb { "A" } else { "B" }),
            },
            SlotRange {
                start: sa.max(sb),
                end: 16383,
                node: n(if sa < sb { "B" } else { "A" }),
            },
        ]);
        set.for_key(a)
            .admit()
            .unwrap()
            .failure(&StoreError::Timeout);
        assert!(set.for_key(a).is_open());
        assert!(!set.for_key(b).is_open());
        assert!(set.for_key(b).admit().is_ok());
        assert_eq!(gauges.with_label_values(&["A"]).get(), 1);
        assert_eq!(gauges.with_label_values(&["B"]).get(), 0);
        assert_eq!(total.get(), 1);
        assert!(set.any_open());

        tokio::time::advance(Duration::from_secs(2)).await;
        set.for_key(a).admit().unwrap().success();
        assert_eq!(total.get(), 0);
        assert!(!set.any_open());
    }

    #[test]
    fn pick_passes_a_whole_batch_through_and_copies_a_group() {
        let items = ["a", "b", "c"];
        assert!(matches!(pick(&items, &[0, 1, 2]), Cow::Borrowed(_)));
        assert!(matches!(pick(&items, &[1, 2]), Cow::Owned(ref v) if v[..] == ["b", "c"]));
        // Marks shorter than the keys: copied as before, not passed through.
        assert!(matches!(pick(&items[..2], &[0, 1, 2]), Cow::Owned(ref v) if v[..] == ["a", "b"]));
        assert!(pick(&[] as &[&str], &[0]).is_empty());
    }
}
