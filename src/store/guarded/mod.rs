//! [`GuardedStore`]: the only way the rest of sidecache calls the store.
//!
//! Every call goes: breaker admission -> `tokio::time::timeout(command_timeout)`
//! around the backend call -> outcome reported to the breaker, failures
//! counted in `sidecache_store_errors_total{op}`. The timeout is what bounds
//! a request's wait on a dead or paused Redis; the client's own reconnect
//! backoff never decides it (a killed server held commands for 8 s+ otherwise:
//! docs/architecture.md#redis-rs).
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
//! This file holds the guard itself: admission, timeout, outcome, and the
//! split of a multi-key call by master. The breakers are [`breaker`], one
//! per Redis Cluster master [`node_breakers`] (which also groups a call's
//! keys by master), and the invalidation feeds' own `feed_breakers`. The
//! calls it wraps are in one file per capability, as the traits are:
//! `object.rs`, `feeds.rs`, `tags.rs`, `bloom.rs`.

pub(crate) mod breaker;
pub(crate) mod node_breakers;

mod bloom;
mod feed_breakers;
mod feeds;
mod object;
mod tags;

use super::backend::Store;
use super::protocol::StoreError;
use crate::metrics::Metrics;
use breaker::Breaker;
use feed_breakers::FeedBreakers;
use futures_util::future::BoxFuture;
use node_breakers::{Breakers, Guard};
use prometheus::{IntCounter, IntGauge};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A [`Store`] behind the breaker and the command timeout. Built once by
/// [`super::open`] and shared (`Arc`) by the pipeline, admin and
/// invalidation.
pub struct GuardedStore {
    inner: Arc<dyn Store>,
    /// The request path's breaker (one per master on a cluster).
    breakers: Breakers,
    /// The feeds' breakers (one per master on a cluster, as `breakers`).
    feeds: FeedBreakers,
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
}

/// Store operations, as named in the `op` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
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
        GuardedStore {
            breakers: Breakers::new(
                slot_map.as_ref(),
                cooldown,
                &metrics.node_breaker_open,
                &metrics.breaker_open,
            ),
            // A dead master must not stop the invalidations of the others'
            // keys either.
            feeds: FeedBreakers::new(Breakers::new(
                slot_map.as_ref(),
                cooldown,
                &metrics.feed_node_breaker_open,
                &metrics.feed_breaker_open,
            )),
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
        }
    }

    /// Invalidations may take `wait` longer than other calls: they wait for
    /// replicas (`store.redis.replicas_timeout`).
    pub(crate) fn with_replicas_wait(mut self, wait: Duration) -> GuardedStore {
        self.replicas_wait = wait;
        self
    }

    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// True while the breaker is open or half-open (calls skip the store);
    /// on a cluster, while any master's is.
    pub fn breaker_is_open(&self) -> bool {
        self.breakers.is_open()
    }

    /// True while the breaker guarding `key` is open or half-open.
    pub fn breaker_is_open_for(&self, key: &str) -> bool {
        self.guard(key.as_bytes()).is_open()
    }

    /// Redis Cluster: the master (`host:port`) whose breaker guards `key`,
    /// once the slot table is known.
    pub fn node_of(&self, key: &str) -> Option<String> {
        self.breakers.node_of(key.as_bytes()).map(|n| n.to_string())
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

    /// One call on `key`'s slot, through the breaker guarding it.
    async fn call<'a, T>(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ObjectKeys;
    use crate::store::bloom::BloomStore;
    use crate::store::feeds::FeedStore;
    use crate::store::memory::MemoryStore;
    use crate::store::object::ObjectStore;
    use crate::store::protocol::{
        LeaseReply, PublishChecks, PublishOutcome, Snapshot, WitnessSlot,
    };
    use crate::store::tags::TagStore;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A store whose calls fail or hang on demand and are counted. Only the
    /// object protocol and the invalidations are wrapped: tags and Bloom
    /// filters keep the traits' defaults (unsupported).
    #[derive(Default)]
    pub(super) struct Faulty {
        pub(super) fail: AtomicBool,
        /// `PING` answers even while `fail` (a cluster with a dead master).
        pub(super) ping_answers: AtomicBool,
        pub(super) hang: AtomicBool,
        pub(super) calls: AtomicUsize,
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
    }

    impl ObjectStore for Faulty {
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
    }

    impl FeedStore for Faulty {
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

    impl TagStore for Faulty {}
    impl BloomStore for Faulty {}

    pub(super) const TIMEOUT: Duration = Duration::from_millis(300);
    pub(super) const COOLDOWN: Duration = Duration::from_secs(2);

    pub(super) fn guarded(metrics: &Metrics) -> (Arc<Faulty>, GuardedStore) {
        let faulty = Arc::new(Faulty::default());
        let store = GuardedStore::new(faulty.clone(), Some(TIMEOUT), COOLDOWN, metrics);
        (faulty, store)
    }

    fn errors(metrics: &Metrics, op: &str) -> u64 {
        metrics.store_errors.with_label_values(&[op]).get()
    }

    pub(super) fn keys() -> ObjectKeys {
        ObjectKeys::from_parts("e", "g", "l")
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
}
