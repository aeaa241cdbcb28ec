//! Stages 5, 6 and 9 across instances: the rebuild lease. The filler takes
//! the lease and its ticket in one script (`lua/lease.lua`, value
//! `<owner>@<ticket>`, a fresh owner token per attempt); others wait with
//! jittered sleeps, re-reading the entry, until the route's `wait` budget is
//! spent. Release is compare-and-delete, so a filler whose lease expired
//! cannot delete its successor's lease.
//!
//! Waiting is only for a fill that can still publish: a lease whose ticket
//! an invalidation has replaced is taken over at the next attempt, and so
//! is one whose fill took a route or tag ticket that is no longer current
//! (the fill records them beside its lease once it has taken them,
//! [`LeaseGuard::record_depends`]), because that fill's publish will be
//! refused and its answer predates the invalidation. Counted in
//! `sidecache_lease_superseded_total{route,reason}`. So there is still one
//! fill per object and generation across instances, and none that readers
//! after an invalidation wait for is older than it.
//!
//! A fill slower than its lease keeps it with [`LeaseGuard::renew_while`]:
//! every third of the lease, a compare-and-`PEXPIRE` (`lua/lease_renew.lua`)
//! sets it back to its full length while the upstream call runs (the call
//! itself ends by `upstream.timeout`), like the Bloom build lock. A filler
//! that crashes stops renewing, so the key is blocked for at most one lease.
//!
//! A won lease is a [`LeaseGuard`]: released on every path. A guard dropped
//! without [`LeaseGuard::release`] (the fill task panicked or was aborted)
//! is the pingora cache lock's "dangling" case: it is counted in
//! `sidecache_lease_abandoned_total{route}`, logged, and its
//! compare-and-delete is spawned onto the runtime, because `drop` cannot
//! await. If that spawned release cannot run (runtime shutting down, store
//! down) the lease simply expires after `lease`: waiters meanwhile spend
//! their `wait` budget and answer 503, never stale data.

use super::entry::Entry;
use super::lookup::lookup;
use crate::config::Route;
use crate::keys::CacheKey;
use crate::metrics::Metrics;
use crate::store::{FillDepends, GuardedStore, LeaseReply, StoreError};
use bytes::Bytes;
use prometheus::IntCounterVec;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How the wait for the lease ended.
#[derive(Debug)]
pub(crate) enum LeaseOutcome {
    /// We hold the lease.
    Won(LeaseGuard),
    /// Another filler published while we waited.
    Hit(Entry),
    /// The `wait` budget is spent (answer 503, never call upstream).
    WaitTimeout,
}

/// A fresh random owner token, prefixed with this instance's name
/// ([`instance`]) so an operator can tell who holds a lease.
pub(crate) fn owner_token() -> String {
    format!("{}/{:032x}", instance(), rand::rng().random::<u128>())
}

/// This process as `<hostname>:<pid>` (in Kubernetes the hostname is the
/// pod's name).
pub(crate) fn instance() -> &'static str {
    static INSTANCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
        #[allow(unsafe_code)]
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let host = if ok {
            String::from_utf8_lossy(&buf[..len]).into_owned()
        } else {
            "unknown".to_owned()
        };
        format!("{host}:{}", std::process::id())
    });
    &INSTANCE
}

/// Stage 5: acquire the lease or wait for someone else's fill of the
/// current generation. `gen_ttl` is for a generation the script creates.
pub(crate) async fn acquire(
    store: &Arc<GuardedStore>,
    key: &CacheKey,
    route: &Route,
    gen_ttl: Duration,
    metrics: &Metrics,
) -> Result<LeaseOutcome, StoreError> {
    let owner = owner_token();
    let budget_end = Instant::now() + route.wait;
    loop {
        if let Some(won) = attempt(store, key, route, &owner, gen_ttl, metrics).await? {
            return Ok(LeaseOutcome::Won(won));
        }
        let now = Instant::now();
        if now >= budget_end {
            return Ok(LeaseOutcome::WaitTimeout);
        }
        let nap = Duration::from_millis(rand::rng().random_range(15..=35));
        tokio::time::sleep(nap.min(budget_end - now)).await;
        // Only a fresh entry ends the wait: an expired one is what the
        // lease holder is replacing.
        if let Some(entry) = lookup(store, key, &route.name, metrics).await?.fresh() {
            return Ok(LeaseOutcome::Hit(entry));
        }
    }
}

/// One attempt, no waiting: a background refresh that finds the lease
/// taken leaves the object to whoever holds it (one refresh per object
/// across instances). `None`: someone else holds it.
pub(crate) async fn try_acquire(
    store: &Arc<GuardedStore>,
    key: &CacheKey,
    route: &Route,
    gen_ttl: Duration,
    metrics: &Metrics,
) -> Result<Option<LeaseGuard>, StoreError> {
    attempt(store, key, route, &owner_token(), gen_ttl, metrics).await
}

/// One `lua/lease.lua` call: the guard if won (a superseded fill counted).
async fn attempt(
    store: &Arc<GuardedStore>,
    key: &CacheKey,
    route: &Route,
    owner: &str,
    gen_ttl: Duration,
    metrics: &Metrics,
) -> Result<Option<LeaseGuard>, StoreError> {
    let nonce = format!("{:016x}", rand::rng().random::<u64>());
    let reply = store
        .take_lease(&key.keys, owner, &nonce, route.lease, gen_ttl)
        .await?;
    let LeaseReply::Won {
        value,
        ticket,
        superseded,
    } = reply
    else {
        return Ok(None);
    };
    if let Some(why) = superseded {
        metrics
            .lease_superseded
            .with_label_values(&[&route.name, why.as_str()])
            .inc();
        tracing::debug!(route = %route.name, key = %key.keys.lease(), reason = why.as_str(), "lease of a fill that can never publish superseded");
    }
    Ok(Some(LeaseGuard {
        store: Arc::clone(store),
        lease_key: key.keys.lease().to_owned(),
        owner: value,
        ticket,
        route: route.name.clone(),
        unlock_failed: metrics.unlock_failed.clone(),
        abandoned: metrics.lease_abandoned.clone(),
        released: false,
    }))
}

/// A lease this process holds (see the module doc for the drop rule).
#[must_use = "release the lease, or it is abandoned until it expires"]
pub(crate) struct LeaseGuard {
    store: Arc<GuardedStore>,
    lease_key: String,
    /// The lease value, `<owner>@<ticket>`.
    owner: String,
    ticket: Bytes,
    route: String,
    unlock_failed: IntCounterVec,
    abandoned: IntCounterVec,
    released: bool,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease_key", &self.lease_key)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl LeaseGuard {
    /// The lease value the publish script checks.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The generation this fill is for: taken with the lease, before the
    /// upstream call, so an invalidation after it refuses the publish.
    pub(crate) fn ticket(&self) -> &Bytes {
        &self.ticket
    }

    /// Records what this fill depends on beside its lease, so that a
    /// waiter takes it over once one of them moves (`lua/lease_depends.lua`).
    /// Failure only costs that: waiters wait for this fill as before.
    pub(crate) async fn record_depends(&self, depends: &FillDepends) {
        if depends.is_empty() {
            return;
        }
        let recorded = self
            .store
            .record_lease_depends(&self.lease_key, &self.owner, depends);
        match recorded.await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(route = %self.route, key = %self.lease_key, "lease lost before its dependencies were recorded");
            }
            Err(e) => {
                tracing::debug!(route = %self.route, key = %self.lease_key, error = %e, "could not record the fill's dependencies");
            }
        }
    }

    /// Runs `work` (the upstream fetch) while renewing the lease to `ttl`
    /// every `ttl / 3`, for at most `limit`. Renewal stops early if the
    /// lease is no longer ours (the publish will then be refused as
    /// `lease_lost`); a failed renewal call is retried at the next tick.
    pub(crate) async fn renew_while<F: std::future::Future>(
        &self,
        ttl: Duration,
        limit: Duration,
        work: F,
    ) -> F::Output {
        let period = ttl / 3;
        let stop_at = Instant::now() + limit;
        let mut next = Instant::now() + period;
        let mut renewing = true;
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = tokio::time::sleep_until(next), if renewing => {
                    if Instant::now() >= stop_at {
                        renewing = false;
                        continue;
                    }
                    match self.store.renew_lease(&self.lease_key, &self.owner, ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            renewing = false;
                            tracing::debug!(route = %self.route, key = %self.lease_key, "lease lost during the fill; not renewing");
                        }
                        Err(e) => {
                            tracing::debug!(route = %self.route, key = %self.lease_key, error = %e, "lease renewal failed; retrying");
                        }
                    }
                    next = Instant::now() + period;
                }
            }
        }
    }

    /// Stage 9: compare-and-delete. Failure is only counted: the lease
    /// expires by itself.
    pub(crate) async fn release(mut self) {
        self.released = true;
        unlock(
            &self.store,
            &self.lease_key,
            &self.owner,
            &self.route,
            &self.unlock_failed,
        )
        .await;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.abandoned.with_label_values(&[&self.route]).inc();
        tracing::warn!(route = %self.route, key = %self.lease_key, "fill lease abandoned without release; releasing in the background");
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left: the lease expires after `lease`
        };
        let store = Arc::clone(&self.store);
        let key = std::mem::take(&mut self.lease_key);
        let owner = std::mem::take(&mut self.owner);
        let route = std::mem::take(&mut self.route);
        let failed = self.unlock_failed.clone();
        runtime.spawn(async move { unlock(&store, &key, &owner, &route, &failed).await });
    }
}

async fn unlock(store: &GuardedStore, key: &str, owner: &str, route: &str, failed: &IntCounterVec) {
    match store.unlock(key, owner).await {
        Ok(true) => {}
        Ok(false) => {
            // The lease expired and maybe another filler holds it now: not
            // ours to delete.
            tracing::debug!(key = %key, "lease was no longer ours at release");
        }
        Err(e) => {
            failed.with_label_values(&[route]).inc();
            tracing::debug!(key = %key, error = %e, "lease release failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    const GEN_TTL: Duration = Duration::from_secs(60);

    fn setup() -> (Arc<GuardedStore>, Metrics, CacheKey, Arc<Route>) {
        let metrics = Metrics::new();
        let store = Arc::new(GuardedStore::new(
            Arc::new(MemoryStore::new()),
            None,
            Duration::from_secs(1),
            &metrics,
        ));
        let route = crate::config::testing::route(
            "  - { name: app, path: \"/a/{id}\", params: { id: \"[0-9]+\" }, ttl: 10s, lease: 5s }\n",
        );
        let key = crate::keys::cache_key("sc:", &route, &["1"], None, &[], &http::HeaderMap::new());
        (store, metrics, key, route)
    }

    async fn won(
        store: &Arc<GuardedStore>,
        key: &CacheKey,
        route: &Route,
        m: &Metrics,
    ) -> LeaseGuard {
        match acquire(store, key, route, GEN_TTL, m).await {
            Ok(LeaseOutcome::Won(lease)) => lease,
            other => panic!("expected to win the lease: {other:?}"),
        }
    }

    #[tokio::test]
    async fn released_lease_is_free_again_and_not_counted() {
        let (store, m, key, route) = setup();
        won(&store, &key, &route, &m).await.release().await;
        won(&store, &key, &route, &m).await.release().await;
        assert_eq!(m.lease_abandoned.with_label_values(&["app"]).get(), 0);
    }

    #[tokio::test]
    async fn dropped_lease_is_counted_and_released_in_the_background() {
        let (store, m, key, route) = setup();
        let lease = won(&store, &key, &route, &m).await;
        // A fill task that panics or is aborted drops its guard unreleased.
        let task = tokio::spawn(async move {
            let _held = lease;
            panic!("fill panicked");
        });
        assert!(task.await.is_err());
        assert_eq!(m.lease_abandoned.with_label_values(&["app"]).get(), 1);
        // The spawned compare-and-delete frees it long before `lease` (5 s).
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if matches!(
                store
                    .take_lease(&key.keys, "next", "n", route.lease, GEN_TTL)
                    .await,
                Ok(LeaseReply::Won { .. })
            ) {
                break;
            }
            assert!(Instant::now() < deadline, "abandoned lease not released");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn only_a_fill_of_the_current_generation_is_waited_for() {
        let (store, m, key, route) = setup();
        let old = won(&store, &key, &route, &m).await;
        let try_once = || try_acquire(&store, &key, &route, GEN_TTL, &m);
        assert!(
            try_once().await.unwrap().is_none(),
            "held for the current generation"
        );
        store
            .invalidate(key.keys.generation(), "inv", GEN_TTL)
            .await
            .unwrap();
        let new = try_once()
            .await
            .unwrap()
            .expect("an older generation's fill is superseded");
        assert_ne!(new.ticket(), old.ticket());
        assert_eq!(
            m.lease_superseded
                .with_label_values(&["app", "generation"])
                .get(),
            1
        );
        assert!(
            try_once().await.unwrap().is_none(),
            "the new fill is waited for"
        );
        // The superseded fill cannot release its successor's lease.
        old.release().await;
        assert!(try_once().await.unwrap().is_none());
        new.release().await;
        let free = try_once().await.unwrap().expect("released");
        free.release().await;
    }
}
