//! Stages 5, 6 and 9 across instances: the rebuild lease. The filler holds
//! `SET lease owner NX PX lease` with a fresh owner token per attempt;
//! others wait with jittered sleeps, re-reading the entry, until the route's
//! `wait` budget is spent. Release is compare-and-delete, so a filler whose
//! lease expired cannot delete its successor's lease.

use super::entry::Entry;
use super::lookup::lookup;
use crate::config::Route;
use crate::keys::CacheKey;
use crate::metrics::Metrics;
use crate::store::{GuardedStore, StoreError};
use rand::Rng;
use std::time::Duration;
use tokio::time::Instant;

/// How the wait for the lease ended.
#[derive(Debug)]
pub enum LeaseOutcome {
    /// We hold the lease under this owner token.
    Won(String),
    /// Another filler published while we waited.
    Hit(Entry),
    /// The `wait` budget is spent (answer 503, never call upstream).
    WaitTimeout,
}

/// A fresh random owner token.
pub fn owner_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// Stage 5: acquire the lease or wait for someone else's fill.
pub async fn acquire(
    store: &GuardedStore,
    key: &CacheKey,
    route: &Route,
    metrics: &Metrics,
) -> Result<LeaseOutcome, StoreError> {
    let owner = owner_token();
    let budget_end = Instant::now() + route.wait;
    loop {
        if store
            .try_lease(&key.keys.lease, &owner, route.lease)
            .await?
        {
            return Ok(LeaseOutcome::Won(owner));
        }
        let now = Instant::now();
        if now >= budget_end {
            return Ok(LeaseOutcome::WaitTimeout);
        }
        let nap = Duration::from_millis(rand::rng().random_range(15..=35));
        tokio::time::sleep(nap.min(budget_end - now)).await;
        if let Some(entry) = lookup(store, key, &route.name, metrics).await? {
            return Ok(LeaseOutcome::Hit(entry));
        }
    }
}

/// Stage 9: compare-and-delete unlock. Failure is only counted: the lease
/// expires by itself.
pub async fn release(
    store: &GuardedStore,
    key: &CacheKey,
    owner: &str,
    route: &str,
    metrics: &Metrics,
) {
    match store.unlock(&key.keys.lease, owner).await {
        Ok(true) => {}
        Ok(false) => {
            // The lease expired and maybe another filler holds it now: not
            // ours to delete.
            tracing::debug!(key = %key.keys.lease, "lease was no longer ours at release");
        }
        Err(e) => {
            metrics.unlock_failed.with_label_values(&[route]).inc();
            tracing::debug!(key = %key.keys.lease, error = %e, "lease release failed");
        }
    }
}
