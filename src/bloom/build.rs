//! One build of one filter (docs/bloom.md#builds): take the build lock and
//! create the empty candidate (one script, so growth never misses a running
//! build), stream the members from the source into the candidate in bounded
//! pipelined batches, then activate: the script checks that the lock is
//! still ours, renames the candidate over `bits` and writes `ready`.
//!
//! Safety argument (no false negatives):
//! - A reader never sees a partial bitmap: the candidate is only renamed
//!   over `bits` once complete; before that the old filter answers.
//! - A member created before the lock was taken is committed before the
//!   source query starts (its `create` event is applied after the commit),
//!   so the query returns it.
//! - A member created while the lock is held is added by `bloom_add` to the
//!   candidate as well as to the active bitmap, so activation keeps it.
//! - A builder that lost its lock (paused past the lease, or the store was
//!   unreachable for its renewals) cannot activate; its candidate expires
//!   after [`CANDIDATE_TTL`].
//! - More members than `capacity`: the filter would exceed its false-
//!   positive target, so `ready` is deleted and the filter answers unknown.

use super::hash;
use super::source::{IdSource, SourceError};
use crate::config::bloom::BloomConfig;
use crate::keys::BloomKeys;
use crate::store::{GuardedStore, StoreError};
use futures_util::StreamExt;
use rand::Rng;
use std::time::Duration;

/// Build lock lease, renewed every [`RENEW_EVERY`] while the build runs: a
/// crashed builder blocks the next build for at most this long.
pub const LOCK_TTL: Duration = Duration::from_secs(15);
/// How often a running build renews its lock and candidate.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);
/// A crashed build's candidate disappears after this.
pub const CANDIDATE_TTL: Duration = Duration::from_secs(600);
/// Ids per `SETBIT` pipeline: with k ≤ 32 at most 8192 commands, well
/// inside one command timeout, and never a script that blocks Redis.
pub(crate) const BATCH_IDS: usize = 256;

/// How a build that ran to a decision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildOutcome {
    /// The candidate is the active filter now.
    Activated { members: u64 },
    /// Another build holds the lock (here or on another instance).
    Busy,
    /// The lock expired during the build; nothing was activated.
    LockLost,
    /// More members than `capacity`: `ready` deleted, filter unknown.
    CapacityExceeded { members: u64 },
}

impl BuildOutcome {
    /// Metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BuildOutcome::Activated { .. } => "activated",
            BuildOutcome::Busy => "busy",
            BuildOutcome::LockLost => "lock_lost",
            BuildOutcome::CapacityExceeded { .. } => "capacity_exceeded",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BuildError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Source(#[from] SourceError),
}

/// A fresh owner token (128 random bits, hex): names the lock holder and
/// the candidate key `build:<owner>`.
pub(crate) fn owner_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// Builds and activates the filter of `route_name` / `scope`.
pub(crate) async fn build(
    store: &GuardedStore,
    source: &dyn IdSource,
    keys: &BloomKeys,
    route_name: &str,
    bloom: &BloomConfig,
    scope: &str,
) -> Result<BuildOutcome, BuildError> {
    let size = bloom.sizing;
    let owner = owner_token();
    if !store
        .bloom_begin(keys, &owner, LOCK_TTL, size.m, CANDIDATE_TTL)
        .await?
    {
        return Ok(BuildOutcome::Busy);
    }
    let result = renewing(
        store,
        keys,
        &owner,
        fill_and_activate(store, source, keys, route_name, bloom, scope, &owner),
    )
    .await;
    // Release whatever happened; a failed release only delays the next
    // build until the lease expires.
    if let Err(e) = store.unlock(&keys.lock, &owner).await {
        tracing::debug!(route = route_name, error = %e, "bloom build lock release failed");
    }
    result
}

/// Runs the build while renewing its lock; stops early once the lock is
/// known to be lost (activation would be refused anyway).
async fn renewing(
    store: &GuardedStore,
    keys: &BloomKeys,
    owner: &str,
    work: impl std::future::Future<Output = Result<BuildOutcome, BuildError>>,
) -> Result<BuildOutcome, BuildError> {
    tokio::pin!(work);
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
    loop {
        tokio::select! {
            result = &mut work => return result,
            _ = ticks.tick() => match store.bloom_renew(keys, owner, LOCK_TTL, CANDIDATE_TTL).await {
                Ok(true) => {}
                Ok(false) => return Ok(BuildOutcome::LockLost),
                // Transient: the next tick retries; the lease covers two misses.
                Err(e) => tracing::debug!(error = %e, "bloom build lock renewal failed"),
            },
        }
    }
}

async fn fill_and_activate(
    store: &GuardedStore,
    source: &dyn IdSource,
    keys: &BloomKeys,
    route_name: &str,
    bloom: &BloomConfig,
    scope: &str,
    owner: &str,
) -> Result<BuildOutcome, BuildError> {
    let size = bloom.sizing;
    let candidate = keys.candidate(owner);
    let mut ids = source.ids(&bloom.source, scope).await?;
    let mut members: u64 = 0;
    let mut batch: Vec<u64> = Vec::with_capacity(BATCH_IDS * size.k as usize);
    let mut in_batch = 0;
    while let Some(id) = ids.next().await {
        let id = id?;
        members += 1;
        if members > bloom.capacity {
            // Counting on would read the whole (too large) catalogue for
            // nothing: the decision is made.
            drop(ids);
            store.bloom_disable(keys, Some(owner)).await?;
            return Ok(BuildOutcome::CapacityExceeded { members });
        }
        hash::push_positions(route_name, scope, &id, size, &mut batch);
        in_batch += 1;
        if in_batch == BATCH_IDS {
            store.bloom_set_bits(&candidate, &batch).await?;
            batch.clear();
            in_batch = 0;
        }
    }
    store.bloom_set_bits(&candidate, &batch).await?;
    let signature = hash::signature(size);
    if store
        .bloom_activate(keys, owner, &signature, size.m)
        .await?
    {
        Ok(BuildOutcome::Activated { members })
    } else {
        Ok(BuildOutcome::LockLost)
    }
}
