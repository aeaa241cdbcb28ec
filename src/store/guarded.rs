//! [`GuardedStore`]: the only way the rest of sidecache calls the store.
//!
//! Every call goes: breaker admission -> `tokio::time::timeout(command_timeout)`
//! around the backend call -> outcome reported to the breaker, failures
//! counted in `sidecache_store_errors_total{op}`. The timeout is what bounds
//! a request's wait on a dead or paused Redis; the client's own reconnect
//! backoff never decides it (CRATES.md: a killed server held commands for
//! 8 s+ otherwise).
//!
//! A business "no" (lease taken, publish rejected, compare-and-delete
//! mismatch) is a successful call. So, for the breaker, is a write the store
//! refuses ([`StoreError::WriteRefused`]: Redis at `maxmemory`, a read-only
//! replica): the store answers, reads work, and opening the breaker would
//! stop hits too. Refusals are counted per op instead, and
//! `sidecache_store_writes_refused` is 1 from a refusal until a write
//! succeeds (logged once each way). A call skipped because the breaker is open
//! returns [`StoreError::BreakerOpen`] without touching the store and is not
//! counted as a store error (the failure that opened the breaker was).
//!
//! The invalidation feeds (outbox, stream) keep a breaker of their own
//! (issue 20): a request-path breaker opened by one slow read must not stop
//! invalidations that would succeed, and a feed needs to know whether *its*
//! calls reach the store to decide whether to take events at all
//! ([`GuardedStore::feeds_ready_at`]).

use super::breaker::Breaker;
use super::memory::MemoryStore;
use super::node_breakers::NodeBreakers;
use super::redis::RedisStore;
use super::{
    BoxFuture, Inspection, LeaseReply, PublishChecks, PublishOutcome, Snapshot, Store, StoreError,
    WitnessSlot,
};
use crate::config::StoreConfig;
use crate::keys::ObjectKeys;
use crate::metrics::Metrics;
use bytes::Bytes;
use prometheus::{IntCounter, IntGauge};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a feed waiting for its breaker pings the store
/// ([`GuardedStore::feeds_ready`]).
const FEEDS_PROBE_EVERY: Duration = Duration::from_millis(25);

/// A [`Store`] behind the breaker and the command timeout. Built once by
/// [`open`] and shared (`Arc`) by the pipeline, admin and invalidation.
pub struct GuardedStore {
    inner: Arc<dyn Store>,
    /// The request path's breaker (one per master on a cluster).
    breakers: Breakers,
    /// The feeds' breakers (one per master on a cluster, as `breakers`):
    /// invalidations, floors and witness beats of the feeds.
    feeds: Breakers,
    /// `None` for backends that cannot block (the embedded store).
    timeout: Option<Duration>,
    /// `store_errors{op}` handles, resolved once instead of per call.
    errors: [IntCounter; Op::COUNT],
    /// `store_write_refusals{op}` handles.
    refusals: [IntCounter; Op::COUNT],
    /// True from a refused write until a write succeeds.
    refusing_writes: AtomicBool,
    refusing_gauge: IntGauge,
    /// Added to `timeout` for invalidations (`store.redis.replicas_timeout`).
    replicas_wait: Duration,
    shortfalls: IntCounter,
    /// Early probes answered since a feed's invalidation last succeeded:
    /// each doubles the wait for the next ([`GuardedStore::feeds_ready`]).
    early_closes: AtomicU32,
    /// When the last early probe started: the pace is kept across callers,
    /// and across a caller's `feeds_ready` futures (the outbox worker makes
    /// a new one each time a NOTIFY wakes it, every few milliseconds while
    /// writes go on; a pace counted from each call would never probe).
    probed_at: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// The request path's breakers: one for the store, or one per Redis
/// Cluster master (a dead master degrades only its own slots).
enum Breakers {
    One(Breaker),
    PerNode(NodeBreakers),
}

/// The breaker a call goes through.
enum Guard<'a> {
    One(&'a Breaker),
    Node(Arc<Breaker>),
}

impl Breakers {
    /// `None` while a call would be let through somewhere; else when one
    /// will be. On a cluster, only while every master's breaker refuses.
    fn refuse_until(&self) -> Option<tokio::time::Instant> {
        match self {
            Breakers::One(b) => b.admits_at(),
            Breakers::PerNode(set) => set.all_refuse_until(),
        }
    }

    /// [`Breaker::close_early`] on every breaker of the set.
    fn close_early(&self) {
        match self {
            Breakers::One(b) => b.close_early(),
            Breakers::PerNode(set) => set.close_all_early(),
        }
    }

    /// The breaker guarding calls on `key`.
    fn guard(&self, key: &[u8]) -> Guard<'_> {
        match self {
            Breakers::One(b) => Guard::One(b),
            Breakers::PerNode(set) => Guard::Node(set.for_key(key)),
        }
    }

    /// `keys`' indices grouped by the breaker guarding them: one group on a
    /// single node, one per master involved on a cluster.
    fn groups<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<(Guard<'_>, Vec<usize>)> {
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
    fn same(&self, other: &Guard<'_>) -> bool {
        std::ptr::eq::<Breaker>(&**self, &**other)
    }
}

/// Store operations, as named in the `op` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    TakeLease,
    Ticket,
    Publish,
    RenewLease,
    Unlock,
    DeleteIfEquals,
    Invalidate,
    BloomCheck,
    BloomBuild,
    BloomAdd,
    Inspect,
    Witness,
}

impl Op {
    const COUNT: usize = 13;
    const ALL: [Op; Op::COUNT] = [
        Op::Read,
        Op::TakeLease,
        Op::Ticket,
        Op::Publish,
        Op::RenewLease,
        Op::Unlock,
        Op::DeleteIfEquals,
        Op::Invalidate,
        Op::BloomCheck,
        Op::BloomBuild,
        Op::BloomAdd,
        Op::Inspect,
        Op::Witness,
    ];

    /// The writes a fill needs: a success shows the store accepts writes
    /// again (deletes, and the invalidate script, succeed even at
    /// `maxmemory`).
    fn writes(self) -> bool {
        matches!(self, Op::TakeLease | Op::Ticket | Op::Publish)
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::TakeLease => "take_lease",
            Op::Ticket => "ticket",
            Op::Publish => "publish",
            Op::RenewLease => "renew_lease",
            Op::Unlock => "unlock",
            Op::DeleteIfEquals => "delete_if_equals",
            Op::Invalidate => "invalidate",
            Op::BloomCheck => "bloom_check",
            Op::BloomBuild => "bloom_build",
            Op::BloomAdd => "bloom_add",
            Op::Inspect => "inspect",
            Op::Witness => "witness",
        }
    }
}

impl GuardedStore {
    /// Wraps `inner`. `timeout` bounds every call (`None`: unbounded, for
    /// stores that cannot block); `cooldown` is the breaker's open period.
    /// Also the seam for tests that inject a failing or slow store.
    pub fn new(
        inner: Arc<dyn Store>,
        timeout: Option<Duration>,
        cooldown: Duration,
        metrics: &Metrics,
    ) -> GuardedStore {
        let slot_map = inner.slot_map();
        let set = |gauges: &prometheus::IntGaugeVec, total: &IntGauge| match &slot_map {
            Some(map) => Breakers::PerNode(NodeBreakers::new(
                map.clone(),
                cooldown,
                gauges.clone(),
                total.clone(),
            )),
            None => Breakers::One(Breaker::new(cooldown, total.clone())),
        };
        GuardedStore {
            breakers: set(&metrics.node_breaker_open, &metrics.breaker_open),
            // A dead master must not stop the invalidations of the others'
            // keys either.
            feeds: set(&metrics.feed_node_breaker_open, &metrics.feed_breaker_open),
            inner,
            timeout,
            errors: Op::ALL.map(|op| metrics.store_errors.with_label_values(&[op.as_str()])),
            refusals: Op::ALL.map(|op| {
                metrics
                    .store_write_refusals
                    .with_label_values(&[op.as_str()])
            }),
            refusing_writes: AtomicBool::new(false),
            refusing_gauge: metrics.store_writes_refused.clone(),
            replicas_wait: Duration::ZERO,
            shortfalls: metrics.replica_ack_shortfalls.clone(),
            early_closes: AtomicU32::new(0),
            probed_at: std::sync::Mutex::new(None),
        }
    }

    /// Invalidations may take `wait` longer than other calls: they wait for
    /// replicas (`store.redis.replicas_timeout`).
    pub fn with_replicas_wait(mut self, wait: Duration) -> GuardedStore {
        self.replicas_wait = wait;
        self
    }

    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// True while the breaker is open or half-open (calls skip the store);
    /// on a cluster, while any master's is.
    pub fn breaker_is_open(&self) -> bool {
        match &self.breakers {
            Breakers::One(b) => b.is_open(),
            Breakers::PerNode(set) => set.any_open(),
        }
    }

    /// True while the breaker guarding `key` is open or half-open.
    pub fn breaker_is_open_for(&self, key: &str) -> bool {
        self.guard(key.as_bytes()).is_open()
    }

    /// Redis Cluster: the master (`host:port`) whose breaker guards `key`,
    /// once the slot table is known.
    pub fn node_of(&self, key: &str) -> Option<String> {
        match &self.breakers {
            Breakers::One(_) => None,
            Breakers::PerNode(set) => set.node_of(key.as_bytes()).map(|n| n.to_string()),
        }
    }

    /// The breaker guarding calls on `key` (all keys of one object share a
    /// slot, so any of them names the object's master).
    fn guard(&self, key: &[u8]) -> Guard<'_> {
        self.breakers.guard(key)
    }

    /// A multi-key call split by master: each group through its own breaker,
    /// concurrently; one value per key, in `keys`' order. `call` gets the
    /// group's keys.
    async fn per_node<'a, K, T>(
        &'a self,
        op: Op,
        keys: &'a [K],
        call: impl Fn(&'a dyn Store, Vec<&'a K>) -> BoxFuture<'a, Result<Vec<T>, StoreError>>,
    ) -> Result<Vec<T>, StoreError>
    where
        K: AsRef<[u8]> + Sync,
        T: Send,
    {
        let groups = self
            .each_group(&self.breakers, op, keys, |s, members| {
                call(s, members.iter().map(|&i| &keys[i]).collect())
            })
            .await;
        let mut out: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
        for (members, result) in groups {
            let values = result?;
            if values.len() != members.len() {
                return Err(StoreError::Protocol("one value per key expected".into()));
            }
            for (i, value) in members.into_iter().zip(values) {
                out[i] = Some(value);
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| StoreError::Protocol("a key without a value".into())))
            .collect()
    }

    /// A feed's multi-key call split by master (one group on a single
    /// node), each group through its feeds' breaker, concurrently: one
    /// result per key, its group's, so a dead master fails only its own
    /// keys. `call` gets the group's indices into `keys` (see [`pick`]).
    async fn feeds_each<'a, K: AsRef<[u8]>>(
        &'a self,
        keys: &[K],
        call: impl Fn(&'a dyn Store, &[usize]) -> BoxFuture<'a, Result<(), StoreError>>,
    ) -> Vec<Result<(), StoreError>> {
        let mut out = vec![Ok(()); keys.len()];
        for (members, result) in self
            .each_group(&self.feeds, Op::Invalidate, keys, call)
            .await
        {
            for i in members {
                out[i] = result.clone();
            }
        }
        out
    }

    /// `keys`' indices grouped by the breaker of `set` guarding them, and
    /// each group's result: `call` runs once per group, with the group's
    /// indices (ascending), through its breaker, all groups concurrently.
    async fn each_group<'a, K: AsRef<[u8]>, T>(
        &'a self,
        set: &Breakers,
        op: Op,
        keys: &[K],
        call: impl Fn(&'a dyn Store, &[usize]) -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Vec<(Vec<usize>, Result<T, StoreError>)> {
        let groups = set.groups(keys);
        let calls = groups.iter().map(|(guard, members)| {
            let call = &call;
            self.call_through(guard, op, move |s| call(s, members))
        });
        let results = futures_util::future::join_all(calls).await;
        groups
            .into_iter()
            .map(|(_, members)| members)
            .zip(results)
            .collect()
    }

    /// `None` if a feed's store call would be let through now, else when
    /// it will be: until then the feed's store is unavailable to it, and it
    /// leaves events to instances whose store works. On a cluster, only
    /// while every master's feeds' breaker is open: with one master dead,
    /// events still flow, and those of its keys fail and are retried.
    pub fn feeds_ready_at(&self) -> Option<tokio::time::Instant> {
        self.feeds.refuse_until()
    }

    /// Resolves when a feed's store call would be let through: at the end
    /// of the feeds' breaker's cooldown, or as soon as a `PING` (one per
    /// [`FEEDS_PROBE_EVERY`] at most) is answered, which closes the breaker. A
    /// Redis that restarts in 30 ms is back for the request path (a read
    /// that fails opens only its own breaker, the near cache's connection
    /// reconnects at once) long before the cooldown ends, and every event
    /// committed meanwhile would wait for it while fills of the old
    /// version are served.
    ///
    /// A store that answers the `PING` but still fails the invalidations
    /// (a dead master of a cluster, whose slots `PING` does not reach)
    /// would make this a loop at the probe's pace: each answered probe
    /// doubles the next one's wait until an invalidation succeeds, so it
    /// falls back to the cooldown's pace.
    pub async fn feeds_ready(&self) {
        while let Some(at) = self.feeds_ready_at() {
            let doublings = self.early_closes.load(Ordering::Relaxed).min(16);
            let every = FEEDS_PROBE_EVERY.saturating_mul(1 << doublings);
            let now = tokio::time::Instant::now();
            let due = self.last_probe().map_or(now, |t| (t + every).max(now));
            let next = at.min(due);
            tokio::time::sleep_until(next).await;
            if next < at && self.last_probe().is_none_or(|t| t + every <= next) {
                self.probe_feeds().await;
            }
        }
    }

    fn last_probe(&self) -> Option<tokio::time::Instant> {
        *self
            .probed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One early probe of the feeds' breaker: made beside it (the
    /// breaker's own probe still comes at the cooldown's end), it only
    /// closes the breaker when answered.
    async fn probe_feeds(&self) {
        *self
            .probed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tokio::time::Instant::now());
        let ping = self.inner.ping();
        let answered = match self.timeout {
            Some(limit) => matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(()))),
            None => ping.await.is_ok(),
        };
        if answered {
            self.feeds.close_early();
            self.early_closes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One call on `key`'s slot, through the breaker guarding it.
    pub(super) async fn call<'a, T>(
        &'a self,
        op: Op,
        key: &str,
        call: impl FnOnce(&'a dyn Store) -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let guard = self.guard(key.as_bytes());
        self.call_through(&guard, op, call).await
    }

    async fn call_through<'a, T>(
        &'a self,
        breaker: &Breaker,
        op: Op,
        call: impl FnOnce(&'a dyn Store) -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let permit = breaker.admit()?;
        let future = call(self.inner.as_ref());
        let limit = match op {
            Op::Invalidate => self.timeout.map(|t| t + self.replicas_wait),
            _ => self.timeout,
        };
        let result = match limit {
            Some(limit) => tokio::time::timeout(limit, future)
                .await
                .unwrap_or(Err(StoreError::Timeout)),
            None => future.await,
        };
        match &result {
            Ok(_) => {
                permit.success();
                if op.writes() && self.refusing_writes.load(Ordering::Relaxed) {
                    self.writes_refused(false, op, None);
                }
            }
            // Redis answered; only the replicas are behind.
            Err(StoreError::ReplicaShortfall { .. }) => {
                permit.success();
                self.shortfalls.inc();
            }
            Err(error @ StoreError::WriteRefused(_)) => {
                permit.success();
                self.refusals[op as usize].inc();
                self.writes_refused(true, op, Some(error));
            }
            Err(error) => {
                self.errors[op as usize].inc();
                tracing::debug!(op = op.as_str(), %error, probe = permit.is_probe(), "store call failed");
                permit.failure(error);
            }
        }
        result
    }

    /// Records whether the store refuses writes; logs the change once.
    fn writes_refused(&self, refused: bool, op: Op, error: Option<&StoreError>) {
        if self.refusing_writes.swap(refused, Ordering::Relaxed) == refused {
            return;
        }
        self.refusing_gauge.set(i64::from(refused));
        match error {
            Some(error) => tracing::warn!(
                op = op.as_str(),
                %error,
                "the store refuses writes: hits are still served, misses go to the upstream uncached"
            ),
            None => tracing::info!(op = op.as_str(), "the store accepts writes again"),
        }
    }

    pub async fn read(&self, keys: &ObjectKeys) -> Result<Snapshot, StoreError> {
        // A near-cache answer is coherent with Redis by construction (its
        // tracked connection is alive) and costs no round trip: no breaker
        // admission or timeout needed.
        if let Some(snapshot) = self.inner.read_near(keys) {
            return Ok(snapshot);
        }
        self.call(Op::Read, keys.generation(), |s| s.read(keys))
            .await
    }

    /// What the near cache holds for `keys`, counted as a near-cache hit
    /// or miss; never waits.
    pub fn read_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.inner.read_near(keys)
    }

    /// Whether there is a near cache for [`Self::read_near`] to ask.
    pub fn has_near(&self) -> bool {
        self.inner.has_near()
    }

    /// [`Self::read`] after [`Self::read_near`] found nothing: not counted
    /// as a second near-cache lookup.
    pub async fn read_far(&self, keys: &ObjectKeys) -> Result<Snapshot, StoreError> {
        self.call(Op::Read, keys.generation(), |s| s.read(keys))
            .await
    }

    /// Whether every stamped tag generation is current, from the near cache
    /// alone (`None`: it does not hold them all).
    pub fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        self.inner.tags_current_near(stamped)
    }

    /// Everything stored for one variant, with TTLs (`/admin/lookup`).
    pub async fn inspect(&self, keys: &ObjectKeys) -> Result<Inspection, StoreError> {
        self.call(Op::Inspect, keys.generation(), |s| s.inspect(keys))
            .await
    }

    /// What the near cache holds for `keys`, not counted as a lookup.
    pub fn peek_near(&self, keys: &ObjectKeys) -> Option<Snapshot> {
        self.inner.peek_near(keys)
    }

    pub async fn take_lease(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        nonce: &str,
        ttl: Duration,
        gen_ttl: Duration,
    ) -> Result<LeaseReply, StoreError> {
        self.call(Op::TakeLease, keys.lease(), |s| {
            s.take_lease(keys, owner, nonce, ttl, gen_ttl)
        })
        .await
    }

    pub async fn ticket(
        &self,
        gen_key: &str,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Bytes, StoreError> {
        self.call(Op::Ticket, gen_key, |s| s.ticket(gen_key, nonce, gen_ttl))
            .await
    }

    pub async fn publish(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        ticket: &[u8],
        entry: Bytes,
        ttl: Duration,
    ) -> Result<PublishOutcome, StoreError> {
        self.call(Op::Publish, keys.entry(), |s| {
            s.publish(keys, owner, ticket, entry, ttl)
        })
        .await
    }

    pub async fn publish_checked(
        &self,
        keys: &ObjectKeys,
        owner: &str,
        ticket: &[u8],
        entry: Bytes,
        ttl: Duration,
        checks: &PublishChecks,
    ) -> Result<PublishOutcome, StoreError> {
        if matches!(self.breakers, Breakers::PerNode(_)) && !checks.tags.is_empty() {
            // Tag keys live on other masters: compared just before, each
            // through its master's breaker (the hit check covers a change
            // in between), then the object's script on its own master.
            let tag_keys: Vec<&str> = checks.tags.iter().map(|(k, _)| k.as_str()).collect();
            let current = self.read_tags_as(Op::Publish, &tag_keys).await?;
            if current
                .iter()
                .zip(&checks.tags)
                .any(|(now, (_, then))| now.as_ref() != Some(then))
            {
                return Ok(PublishOutcome::TagChanged);
            }
            let rest = PublishChecks {
                floor_key: checks.floor_key.clone(),
                version: checks.version,
                tags: Vec::new(),
            };
            return self
                .call(Op::Publish, keys.entry(), |s| {
                    s.publish_checked(keys, owner, ticket, entry, ttl, &rest)
                })
                .await;
        }
        self.call(Op::Publish, keys.entry(), |s| {
            s.publish_checked(keys, owner, ticket, entry, ttl, checks)
        })
        .await
    }

    /// The tags' current generations, created where missing (a fill's
    /// tag tickets).
    pub async fn tag_tickets(
        &self,
        tag_keys: &[String],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Vec<Bytes>, StoreError> {
        self.per_node(Op::Ticket, tag_keys, |s, group| {
            let group: Vec<String> = group.into_iter().cloned().collect();
            Box::pin(async move { s.tag_tickets(&group, nonce, gen_ttl).await })
        })
        .await
    }

    /// The current value of each key (tag generations, an object's tag
    /// list), from the near cache where it holds them all.
    pub async fn read_tags(&self, tag_keys: &[&str]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.read_tags_as(Op::Read, tag_keys).await
    }

    /// `read_tags` counted as `op`; split by master on a cluster, so a tag
    /// on a dead master fails the call (nothing is served whose tags cannot
    /// be shown current) without opening a healthy master's breaker.
    async fn read_tags_as(
        &self,
        op: Op,
        tag_keys: &[&str],
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if let Breakers::One(b) = &self.breakers {
            return self.call_through(b, op, |s| s.read_tags(tag_keys)).await;
        }
        self.per_node(op, tag_keys, |s, group| {
            let group: Vec<&str> = group.into_iter().copied().collect();
            Box::pin(async move { s.read_tags(&group).await })
        })
        .await
    }

    /// Whether every `(tag generation key, stamped generation)` is still
    /// current: the hit check of a tagged entry. Answered from the near
    /// cache without allocating where it holds them (like `read`, no
    /// admission or timeout needed), else with one `read_tags`.
    pub async fn tags_current(&self, stamped: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        if let Some(current) = self.inner.tags_current_near(stamped) {
            return Ok(current);
        }
        let Some(keys) = stamped
            .iter()
            .map(|(k, _)| std::str::from_utf8(k).ok())
            .collect::<Option<Vec<&str>>>()
        else {
            return Ok(false);
        };
        let current = self.read_tags(&keys).await?;
        Ok(current.len() == stamped.len()
            && current
                .iter()
                .zip(stamped)
                .all(|(now, (_, then))| now.as_ref() == Some(then)))
    }

    pub async fn remember_tags(
        &self,
        list_key: &str,
        tags: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.call(Op::Publish, list_key, |s| {
            s.remember_tags(list_key, tags, ttl)
        })
        .await
    }

    /// Raises version floors; counted and timed as one `invalidate` call.
    /// `feed`: for the feeds' events, through the feeds' breaker (as
    /// `invalidate_marked`).
    pub async fn raise_floors(
        &self,
        floors: &[(String, i64)],
        gen_ttl: Duration,
        feed: bool,
    ) -> Vec<Result<(), StoreError>> {
        if floors.is_empty() {
            return Vec::new();
        }
        let keys: Vec<&str> = floors.iter().map(|(k, _)| k.as_str()).collect();
        if feed {
            return self
                .feeds_each(&keys, |s, group| {
                    let group = pick(floors, group);
                    Box::pin(async move { s.raise_floors(&group, gen_ttl).await })
                })
                .await;
        }
        let result = self
            .per_node(Op::Invalidate, &keys, |s, group| {
                let group: Vec<(String, i64)> = floors
                    .iter()
                    .filter(|(k, _)| group.iter().any(|g| **g == k.as_str()))
                    .cloned()
                    .collect();
                let n = group.len();
                Box::pin(async move {
                    s.raise_floors(&group, gen_ttl).await?;
                    Ok(vec![(); n])
                })
            })
            .await
            .map(drop);
        vec![result; floors.len()]
    }

    pub async fn renew_lease(
        &self,
        lease_key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(Op::RenewLease, lease_key, |s| {
            s.renew_lease(lease_key, owner, ttl)
        })
        .await
    }

    pub async fn unlock(&self, lease_key: &str, owner: &str) -> Result<bool, StoreError> {
        self.call(Op::Unlock, lease_key, |s| s.unlock(lease_key, owner))
            .await
    }

    pub async fn delete_if_equals(&self, key: &str, expected: &[u8]) -> Result<bool, StoreError> {
        self.call(Op::DeleteIfEquals, key, |s| {
            s.delete_if_equals(key, expected)
        })
        .await
    }

    pub async fn invalidate(
        &self,
        gen_key: &str,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Bytes, StoreError> {
        self.call(Op::Invalidate, gen_key, |s| {
            s.invalidate(gen_key, nonce, gen_ttl)
        })
        .await
    }

    /// [`Store::invalidate_marked`], counted and timed as one `invalidate`
    /// call. The feeds' call: through the feeds' breaker.
    pub async fn invalidate_marked(
        &self,
        gen_keys: &[String],
        marks: &[String],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Vec<Result<(), StoreError>> {
        let results = self
            .feeds_each(gen_keys, |s, group| {
                let (keys, marks) = (pick(gen_keys, group), pick(marks, group));
                Box::pin(async move { s.invalidate_marked(&keys, &marks, nonce, gen_ttl).await })
            })
            .await;
        if results.iter().any(Result::is_ok) {
            self.early_closes.store(0, Ordering::Relaxed);
        }
        results
    }

    /// [`Store::witness`], through the feeds' breaker: it is feed work,
    /// and a witness whose feeds' store fails should not hold its slot.
    pub async fn witness(
        &self,
        slots: &[String],
        owner: &str,
        ttl: Duration,
    ) -> Result<WitnessSlot, StoreError> {
        let Some(first) = slots.first() else {
            return Err(StoreError::Protocol("no witness slot".into()));
        };
        // The slots share one hash tag: one master's breaker.
        let guard = self.feeds.guard(first.as_bytes());
        self.call_through(&guard, Op::Witness, |s| s.witness(slots, owner, ttl))
            .await
    }

    /// Invalidates every key in one call (one round trip on a single Redis
    /// node). Counted and timed as one `invalidate` call.
    pub async fn invalidate_many(
        &self,
        gen_keys: &[String],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<(), StoreError> {
        if gen_keys.is_empty() {
            return Ok(());
        }
        self.per_node(Op::Invalidate, gen_keys, |s, group| {
            let group: Vec<String> = group.into_iter().cloned().collect();
            Box::pin(async move {
                s.invalidate_many(&group, nonce, gen_ttl).await?;
                Ok(vec![(); group.len()])
            })
        })
        .await
        .map(drop)
    }
}

/// `items` at `group`'s indices (those past its end skipped); `items`
/// itself, not copied, when the group is all of them, as on a single node.
fn pick<'s, T: Clone>(items: &'s [T], group: &[usize]) -> Cow<'s, [T]> {
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

/// Builds the configured backend wrapped in a `GuardedStore`. Must not fail
/// because Redis is unreachable at start: sidecache starts degraded and the
/// connection is (re)established in the background.
pub async fn open(cfg: &StoreConfig, metrics: &Metrics) -> Result<Arc<GuardedStore>, StoreError> {
    let cooldown = cfg.breaker_cooldown;
    let guarded = match &cfg.redis {
        None => GuardedStore::new(Arc::new(MemoryStore::new()), None, cooldown, metrics),
        Some(redis) => {
            // Ping often enough that a recovered Redis is reconnected before
            // the breaker's next probe.
            let heartbeat =
                (cooldown / 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
            let store = RedisStore::connect(redis, heartbeat, metrics)?;
            tracing::info!(
                kind = store.kind(),
                "store configured (connecting in the background)"
            );
            GuardedStore::new(
                Arc::new(store),
                Some(redis.command_timeout),
                cooldown,
                metrics,
            )
            .with_replicas_wait(redis.replicas_ack.map_or(Duration::ZERO, |a| a.timeout))
        }
    };
    Ok(Arc::new(guarded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A store whose calls fail or hang on demand and are counted.
    #[derive(Default)]
    struct Faulty {
        fail: AtomicBool,
        /// `PING` answers even while `fail` (a cluster with a dead master).
        ping_answers: AtomicBool,
        hang: AtomicBool,
        calls: AtomicUsize,
        inner: MemoryStore,
    }

    impl Faulty {
        fn gate<'a, T: Send + 'a>(
            &'a self,
            f: BoxFuture<'a, Result<T, StoreError>>,
        ) -> BoxFuture<'a, Result<T, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let fail = self.fail.load(Ordering::SeqCst);
            let hang = self.hang.load(Ordering::SeqCst);
            Box::pin(async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                if fail {
                    return Err(StoreError::Unavailable("injected".into()));
                }
                f.await
            })
        }
    }

    impl Store for Faulty {
        fn kind(&self) -> &'static str {
            "faulty"
        }
        fn read<'a>(&'a self, k: &'a ObjectKeys) -> BoxFuture<'a, Result<Snapshot, StoreError>> {
            self.gate(self.inner.read(k))
        }
        fn take_lease<'a>(
            &'a self,
            k: &'a ObjectKeys,
            o: &'a str,
            n: &'a str,
            t: Duration,
            g: Duration,
        ) -> BoxFuture<'a, Result<LeaseReply, StoreError>> {
            self.gate(self.inner.take_lease(k, o, n, t, g))
        }
        fn ticket<'a>(
            &'a self,
            k: &'a str,
            n: &'a str,
            t: Duration,
        ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
            self.gate(self.inner.ticket(k, n, t))
        }
        fn publish_checked<'a>(
            &'a self,
            k: &'a ObjectKeys,
            o: &'a str,
            tk: &'a [u8],
            e: Bytes,
            t: Duration,
            c: &'a PublishChecks,
        ) -> BoxFuture<'a, Result<PublishOutcome, StoreError>> {
            self.gate(self.inner.publish_checked(k, o, tk, e, t, c))
        }
        fn renew_lease<'a>(
            &'a self,
            k: &'a str,
            o: &'a str,
            t: Duration,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.renew_lease(k, o, t))
        }
        fn unlock<'a>(&'a self, k: &'a str, o: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.unlock(k, o))
        }
        fn delete_if_equals<'a>(
            &'a self,
            k: &'a str,
            e: &'a [u8],
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.delete_if_equals(k, e))
        }
        fn invalidate<'a>(
            &'a self,
            k: &'a str,
            n: &'a str,
            t: Duration,
        ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
            self.gate(self.inner.invalidate(k, n, t))
        }
        fn witness<'a>(
            &'a self,
            k: &'a [String],
            o: &'a str,
            t: Duration,
        ) -> BoxFuture<'a, Result<WitnessSlot, StoreError>> {
            self.gate(self.inner.witness(k, o, t))
        }
        fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
            match self.ping_answers.load(Ordering::SeqCst) {
                true => Box::pin(std::future::ready(Ok(()))),
                false => self.gate(Box::pin(std::future::ready(Ok(())))),
            }
        }
    }

    impl crate::store::bloom::BloomStore for Faulty {
        fn bloom_check<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            sig: &'a str,
            m: u64,
            p: &'a [u64],
        ) -> BoxFuture<'a, Result<crate::store::bloom::BloomAnswer, StoreError>> {
            self.gate(self.inner.bloom_check(k, sig, m, p))
        }
        fn bloom_begin<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            o: &'a str,
            lt: Duration,
            m: u64,
            ct: Duration,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.bloom_begin(k, o, lt, m, ct))
        }
        fn bloom_set_bits<'a>(
            &'a self,
            c: &'a str,
            p: &'a [u64],
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.gate(self.inner.bloom_set_bits(c, p))
        }
        fn bloom_activate<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            o: &'a str,
            sig: &'a str,
            m: u64,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.bloom_activate(k, o, sig, m))
        }
        fn bloom_renew<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            o: &'a str,
            lt: Duration,
            ct: Duration,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.bloom_renew(k, o, lt, ct))
        }
        fn bloom_add<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            p: &'a [u64],
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.gate(self.inner.bloom_add(k, p))
        }
        fn bloom_disable<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            o: Option<&'a str>,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.gate(self.inner.bloom_disable(k, o))
        }
        fn bloom_bitcount<'a>(&'a self, b: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
            self.gate(self.inner.bloom_bitcount(b))
        }
        fn bloom_claim_interval<'a>(
            &'a self,
            k: &'a crate::keys::BloomKeys,
            o: &'a str,
            i: Duration,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.gate(self.inner.bloom_claim_interval(k, o, i))
        }
    }

    const TIMEOUT: Duration = Duration::from_millis(300);
    const COOLDOWN: Duration = Duration::from_secs(2);

    fn guarded(metrics: &Metrics) -> (Arc<Faulty>, GuardedStore) {
        let faulty = Arc::new(Faulty::default());
        let store = GuardedStore::new(faulty.clone(), Some(TIMEOUT), COOLDOWN, metrics);
        (faulty, store)
    }

    /// The result of a one-key feed call.
    fn one(mut results: Vec<Result<(), StoreError>>) -> Result<(), StoreError> {
        assert_eq!(results.len(), 1);
        results.remove(0)
    }

    fn errors(metrics: &Metrics, op: &str) -> u64 {
        metrics.store_errors.with_label_values(&[op]).get()
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

    #[tokio::test(start_paused = true)]
    async fn business_no_is_success_and_keeps_the_breaker_closed() {
        let metrics = Metrics::new();
        let (_, store) = guarded(&metrics);
        let k = crate::keys::object_keys("sc:", "app:1", "v");
        let take = |owner: &'static str| store.take_lease(&k, owner, "n", COOLDOWN, COOLDOWN);
        assert!(matches!(take("a").await, Ok(LeaseReply::Won { .. })));
        assert_eq!(take("b").await.unwrap(), LeaseReply::Held);
        assert!(!store.unlock(k.lease(), "b").await.unwrap());
        assert!(!store.breaker_is_open());
        assert_eq!(errors(&metrics, "take_lease"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn hung_store_times_out_opens_breaker_then_one_probe_closes_it() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        faulty.hang.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        assert!(matches!(
            store.ticket("g", "n", COOLDOWN).await,
            Err(StoreError::Timeout)
        ));
        assert_eq!(started.elapsed(), TIMEOUT);
        assert!(store.breaker_is_open());
        assert_eq!(metrics.breaker_open.get(), 1);
        assert_eq!(errors(&metrics, "ticket"), 1);

        // Open: skipped at once, the store is not called, no error counted.
        let calls = faulty.calls.load(Ordering::SeqCst);
        assert!(matches!(
            store.read(&keys()).await,
            Err(StoreError::BreakerOpen)
        ));
        assert_eq!(faulty.calls.load(Ordering::SeqCst), calls);
        assert_eq!(errors(&metrics, "read"), 0);

        faulty.hang.store(false, Ordering::SeqCst);
        tokio::time::advance(COOLDOWN).await;
        store.read(&keys()).await.unwrap();
        assert!(!store.breaker_is_open());
        assert_eq!(metrics.breaker_open.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn only_one_probe_while_half_open() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        faulty.fail.store(true, Ordering::SeqCst);
        assert!(store.read(&keys()).await.is_err());
        tokio::time::advance(COOLDOWN).await;

        // The probe hangs; meanwhile everyone else skips the store.
        faulty.fail.store(false, Ordering::SeqCst);
        faulty.hang.store(true, Ordering::SeqCst);
        let k = keys();
        let probe = store.read(&k);
        tokio::pin!(probe);
        // Drive the probe until it is parked inside the hung store.
        let parked = tokio::time::timeout(Duration::from_millis(10), probe.as_mut()).await;
        assert!(parked.is_err(), "probe should still be in flight");
        faulty.hang.store(false, Ordering::SeqCst);
        let calls = faulty.calls.load(Ordering::SeqCst);
        for _ in 0..10 {
            assert!(matches!(store.read(&k).await, Err(StoreError::BreakerOpen)));
        }
        assert_eq!(faulty.calls.load(Ordering::SeqCst), calls);
        // The probe times out: open again for a full cooldown.
        assert!(matches!(probe.await, Err(StoreError::Timeout)));
        assert!(store.breaker_is_open());
        tokio::time::advance(COOLDOWN).await;
        store.read(&k).await.unwrap();
        assert!(!store.breaker_is_open());
    }

    /// Issue 20: one slow read opens the request path's breaker; the
    /// feeds' invalidations still reach the store, and a feed failure opens
    /// only the feeds' breaker.
    #[tokio::test(start_paused = true)]
    async fn feeds_keep_their_own_breaker() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        let (gens, marks) = (["g".to_owned()], ["s:1-0".to_owned()]);
        let marked = || async { one(store.invalidate_marked(&gens, &marks, "n", COOLDOWN).await) };
        faulty.hang.store(true, Ordering::SeqCst);
        assert!(matches!(
            store.read(&keys()).await,
            Err(StoreError::Timeout)
        ));
        assert!(store.breaker_is_open());
        faulty.hang.store(false, Ordering::SeqCst);
        assert_eq!(store.feeds_ready_at(), None);
        marked()
            .await
            .expect("the feeds' call is not stopped by the request breaker");

        faulty.fail.store(true, Ordering::SeqCst);
        tokio::time::advance(COOLDOWN).await;
        assert!(marked().await.is_err());
        assert_eq!(
            store.feeds_ready_at(),
            Some(tokio::time::Instant::now() + COOLDOWN)
        );
        assert_eq!(metrics.feed_breaker_open.get(), 1);
        faulty.fail.store(false, Ordering::SeqCst);
        store
            .read(&keys())
            .await
            .expect("the request path probes and closes its own breaker");
        assert!(!store.breaker_is_open());
        assert!(matches!(marked().await, Err(StoreError::BreakerOpen)));
    }

    /// A store that answers again is seen by a waiting feed within one
    /// probe period, not at the end of the cooldown; while it fails, the
    /// waiter keeps probing and does not resolve.
    #[tokio::test(start_paused = true)]
    async fn feeds_ready_resolves_when_a_probe_is_answered() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        let (gens, marks) = (["g".to_owned()], ["s:1-0".to_owned()]);
        faulty.fail.store(true, Ordering::SeqCst);
        assert!(store.invalidate_marked(&gens, &marks, "n", COOLDOWN).await[0].is_err());
        let opened = tokio::time::Instant::now();
        assert_eq!(store.feeds_ready_at(), Some(opened + COOLDOWN));

        let calls = faulty.calls.load(Ordering::SeqCst);
        let wait = tokio::time::timeout(COOLDOWN / 4, store.feeds_ready()).await;
        assert!(wait.is_err(), "resolved while every probe fails");
        let probes = faulty.calls.load(Ordering::SeqCst) - calls;
        assert!(probes >= 10, "{probes} probes in a quarter cooldown");
        assert_eq!(metrics.feed_breaker_open.get(), 1);

        faulty.fail.store(false, Ordering::SeqCst);
        let back = tokio::time::Instant::now();
        store.feeds_ready().await;
        assert!(back.elapsed() <= FEEDS_PROBE_EVERY, "{:?}", back.elapsed());
        assert_eq!(store.feeds_ready_at(), None);
        assert_eq!(metrics.feed_breaker_open.get(), 0);
        one(store.invalidate_marked(&gens, &marks, "n", COOLDOWN).await)
            .expect("the feeds' calls go through again");
    }

    /// A store that answers `PING` but fails every invalidation: each
    /// answered early probe doubles the wait for the next, so a feed does
    /// not retry at the probe's pace for as long as that lasts; a
    /// successful invalidation restores the pace.
    #[tokio::test(start_paused = true)]
    async fn early_probes_slow_down_while_invalidations_still_fail() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        let (gens, marks) = (["g".to_owned()], ["s:1-0".to_owned()]);
        let marked = || async { one(store.invalidate_marked(&gens, &marks, "n", COOLDOWN).await) };
        faulty.fail.store(true, Ordering::SeqCst);
        faulty.ping_answers.store(true, Ordering::SeqCst);
        assert!(marked().await.is_err());
        let mut waits = Vec::new();
        for _ in 0..5 {
            let from = tokio::time::Instant::now();
            store.feeds_ready().await;
            waits.push(from.elapsed());
            assert!(marked().await.is_err(), "the breaker let the call through");
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        // The first probe at once: none was made within the last 25 ms.
        assert_eq!(ms, [0, 50, 100, 200, 400]);

        faulty.fail.store(false, Ordering::SeqCst);
        store.feeds_ready().await;
        marked().await.expect("the store works again");
        faulty.fail.store(true, Ordering::SeqCst);
        assert!(marked().await.is_err());
        let from = tokio::time::Instant::now();
        store.feeds_ready().await;
        assert_eq!(from.elapsed(), FEEDS_PROBE_EVERY, "the pace is restored");
    }

    /// The outbox worker drops its `feeds_ready` future whenever a NOTIFY
    /// wakes it (every few milliseconds while writes go on): the probes
    /// keep their pace across such futures, and the store's return is
    /// still seen within one probe period.
    #[tokio::test(start_paused = true)]
    async fn probes_keep_their_pace_across_dropped_waits() {
        let metrics = Metrics::new();
        let (faulty, store) = guarded(&metrics);
        let (gens, marks) = (["g".to_owned()], ["s:1-0".to_owned()]);
        faulty.fail.store(true, Ordering::SeqCst);
        assert!(one(store.invalidate_marked(&gens, &marks, "n", COOLDOWN).await).is_err());
        let calls = faulty.calls.load(Ordering::SeqCst);
        for _ in 0..20 {
            let wait = tokio::time::timeout(Duration::from_millis(10), store.feeds_ready());
            assert!(wait.await.is_err(), "resolved while every probe fails");
        }
        let probes = faulty.calls.load(Ordering::SeqCst) - calls;
        assert!(probes >= 6, "{probes} probes in 200 ms of 10 ms waits");
        faulty.fail.store(false, Ordering::SeqCst);
        let back = tokio::time::Instant::now();
        loop {
            let wait = tokio::time::timeout(Duration::from_millis(10), store.feeds_ready());
            if wait.await.is_ok() {
                break;
            }
        }
        assert!(back.elapsed() <= FEEDS_PROBE_EVERY, "{:?}", back.elapsed());
    }

    #[tokio::test]
    async fn open_without_redis_is_the_memory_store() {
        let metrics = Metrics::new();
        let cfg = StoreConfig {
            redis: None,
            namespace: "sc:".into(),
            breaker_cooldown: COOLDOWN,
        };
        let store = open(&cfg, &metrics).await.unwrap();
        assert_eq!(store.inner().kind(), "memory");
        assert!(store.ticket("g", "n", COOLDOWN).await.is_ok());
    }

    fn keys() -> ObjectKeys {
        ObjectKeys::from_parts("e", "g", "l")
    }
}
