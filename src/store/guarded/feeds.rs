//! The invalidations' calls behind the breaker and the timeout. The
//! feeds' calls (`invalidate_marked`, `witness`, and floors raised for a
//! feed) go through the feeds' breakers (`feed_breakers.rs`), the
//! others through the request path's.

use super::node_breakers::pick;
use super::{GuardedStore, Op};
use crate::store::backend::Store;
use crate::store::protocol::{StoreError, WitnessSlot};
use futures_util::future::BoxFuture;
use std::time::Duration;

/// Invalidations behind the breaker and the timeout.
impl GuardedStore {
    /// `None` if a feed's store call would be let through now, else when
    /// it will be (`FeedBreakers::ready_at`).
    pub(crate) fn feeds_ready_at(&self) -> Option<tokio::time::Instant> {
        self.feeds.ready_at()
    }

    /// Resolves when a feed's store call would be let through: at the end
    /// of the feeds' breaker's cooldown, or as soon as the store answers a
    /// `PING`, bounded by the command timeout
    /// (`FeedBreakers::ready`).
    pub(crate) async fn feeds_ready(&self) {
        self.feeds
            .ready(|| async {
                let ping = self.inner.ping();
                match self.timeout {
                    Some(limit) => matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(()))),
                    None => ping.await.is_ok(),
                }
            })
            .await
    }

    /// A feed's multi-key call split by master (one group on a single
    /// node), each group through its feeds' breaker, concurrently: one
    /// result per key, its group's, so a dead master fails only its own
    /// keys. `call` gets the group's indices into `keys` (see [`pick`]).
    pub(super) async fn feeds_each<'a, K: AsRef<[u8]>>(
        &'a self,
        keys: &[K],
        call: impl Fn(&'a dyn Store, &[usize]) -> BoxFuture<'a, Result<(), StoreError>>,
    ) -> Vec<Result<(), StoreError>> {
        let mut out = vec![Ok(()); keys.len()];
        for (members, result) in self
            .each_group(self.feeds.breakers(), Op::Invalidate, keys, call)
            .await
        {
            for i in members {
                out[i] = result.clone();
            }
        }
        out
    }

    /// One object's invalidation, for the pipeline's tests (sources go
    /// through `invalidate_many` and `invalidate_marked`).
    #[cfg(test)]
    pub(crate) async fn invalidate(
        &self,
        gen_key: &str,
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<bytes::Bytes, StoreError> {
        self.call(Op::Invalidate, gen_key, |s| {
            s.invalidate(gen_key, nonce, gen_ttl)
        })
        .await
    }

    /// [`crate::store::FeedStore::invalidate_marked`], counted and timed as one `invalidate`
    /// call. The feeds' call: through the feeds' breaker.
    pub(crate) async fn invalidate_marked(
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
            self.feeds.invalidated();
        }
        results
    }

    /// [`crate::store::FeedStore::witness`], through the feeds' breaker: it is feed work,
    /// and a witness whose feeds' store fails should not hold its slot.
    pub(crate) async fn witness(
        &self,
        slots: &[String],
        owner: &str,
        ttl: Duration,
    ) -> Result<WitnessSlot, StoreError> {
        let Some(first) = slots.first() else {
            return Err(StoreError::Protocol("no witness slot".into()));
        };
        // The slots share one hash tag: one master's breaker.
        let guard = self.feeds.breakers().guard(first.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::super::feed_breakers::FEEDS_PROBE_EVERY;
    use super::super::tests::{guarded, keys, COOLDOWN};
    use super::*;
    use crate::metrics::Metrics;
    use std::sync::atomic::Ordering;

    /// The result of a one-key feed call.
    fn one(mut results: Vec<Result<(), StoreError>>) -> Result<(), StoreError> {
        assert_eq!(results.len(), 1);
        results.remove(0)
    }

    /// One slow read opens the request path's breaker; the feeds' invalidations
    /// still reach the store, and a feed failure opens only the feeds' breaker
    /// (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events).
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
}
