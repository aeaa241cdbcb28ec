//! Serving expired entries (docs/caching.md#serving-stale): grace
//! (stale-while-revalidate) and stale-if-error. Only an entry that
//! [`super::lookup`] returned as `Found::Expired` is ever considered here, i.e.
//! one that decodes, names this object and variant, and carries the *current*
//! generation: an invalidated entry, or one whose generation cannot be read,
//! never reaches this module (docs/architecture.md#the-serving-rule).
//!
//! - grace: the expired entry answers at once and one background refresh
//!   starts, unless one is running in this process for the same generation
//!   (single-flight on [`FlightKey::Refresh`]) or anywhere (the lease, tried
//!   once, never waited for; a refresh of an older generation is superseded).
//! - stale-if-error: an expired entry answers instead of a failed refill
//!   (upstream error or 5xx, fill permits full, lease wait spent), read
//!   again after the failure: the refill took time, and an invalidation
//!   meanwhile makes the entry read at the start unservable.

use super::entry::Entry;
use super::filler::{fill_holding_lease, Fill};
use super::flight::{Answer, FlightKey, Herald};
use super::lease;
use super::lookup::Found;
use crate::error::{ProxyError, UpstreamError, LEASE_WAIT_SPENT};
use crate::outcome::CacheOutcome;
use bytes::Bytes;

/// Why an expired entry was served: the `reason` label of
/// `sidecache_stale_served_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaleReason {
    /// Within grace; a refresh runs (or is running) in the background.
    Revalidating,
    /// The refill failed upstream: connect error, timeout, a 5xx.
    UpstreamError,
    /// The fill permits were exhausted (instead of the 503).
    Permits,
    /// The lease wait budget ran out (instead of the 503).
    LeaseWait,
}

impl StaleReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StaleReason::Revalidating => "revalidating",
            StaleReason::UpstreamError => "upstream_error",
            StaleReason::Permits => "permits",
            StaleReason::LeaseWait => "lease_wait",
        }
    }
}

/// What a background refresh did: the `outcome` label of
/// `sidecache_background_refresh_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefreshOutcome {
    /// Upstream answered and the answer went to stage 8 (whether it was
    /// stored is counted in `sidecache_publish_total`).
    Fetched,
    /// Another refresh or fill holds the lease: nothing to do.
    Busy,
    /// Another filler published while we took the lease.
    AlreadyFresh,
    /// Upstream failed or answered 5xx; nothing was stored.
    Failed,
    /// The store failed (lease or read); nothing was fetched.
    StoreError,
}

impl RefreshOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefreshOutcome::Fetched => "fetched",
            RefreshOutcome::Busy => "busy",
            RefreshOutcome::AlreadyFresh => "already_fresh",
            RefreshOutcome::Failed => "failed",
            RefreshOutcome::StoreError => "store_error",
        }
    }
}

/// The flight key of the background refresh of an expired entry of
/// `generation`: distinct from the foreground fill's, so a foreground miss
/// never joins (and inherits the "busy" answer of) a refresh that found the
/// lease taken; and per generation, so a refresh of an invalidated entry
/// still running never stands in for one of the current entry.
pub(crate) fn refresh_flight_key(entry_key: &str, generation: Bytes) -> FlightKey {
    FlightKey::Refresh {
        entry: entry_key.to_owned(),
        generation,
    }
}

/// Why a refill's answer counts as failed for stale-if-error, if it does.
/// The origin's 5xx is never cached: stage 8 stores only listed statuses.
pub(crate) fn failure_reason(answer: &Answer) -> Option<StaleReason> {
    match answer {
        Answer::Failed(_, ProxyError::Overloaded(why)) if *why == LEASE_WAIT_SPENT => {
            Some(StaleReason::LeaseWait)
        }
        Answer::Failed(_, ProxyError::Overloaded(_)) => Some(StaleReason::Permits),
        Answer::Failed(
            _,
            ProxyError::Upstream(
                UpstreamError::Connect(_) | UpstreamError::Timeout | UpstreamError::Other(_),
            ),
        ) => Some(StaleReason::UpstreamError),
        Answer::Failed(..) => None,
        Answer::Shared(_, entry, _) | Answer::Starter(_, entry) if entry.status >= 500 => {
            Some(StaleReason::UpstreamError)
        }
        // Streamed only below 500.
        Answer::Shared(..) | Answer::Starter(..) | Answer::Streaming(..) => None,
        Answer::Exclusive(_, slot) => {
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.as_ref()
                .filter(|r| r.status().is_server_error())
                .map(|_| StaleReason::UpstreamError)
        }
    }
}

/// The grace refresh: stages 5-9 with a lease taken once or not at all.
/// Its answer goes to no client (the flight is never awaited).
pub(super) async fn refresh(fill: &Fill) -> Answer {
    let sh = &fill.shared;
    let (outcome, answer) = match lease::try_acquire(
        &sh.store,
        &fill.key,
        &fill.route,
        fill.cfg.gen_ttl,
        &sh.metrics,
    )
    .await
    {
        Ok(Some(lease)) => {
            let answer = fill_holding_lease(fill, &lease, &Herald::silent()).await;
            lease.release().await;
            (refresh_outcome(&answer), answer)
        }
        Ok(None) => (RefreshOutcome::Busy, busy()),
        Err(_) => (RefreshOutcome::StoreError, busy()),
    };
    sh.metrics
        .background_refresh
        .with_label_values(&[&fill.route.name, outcome.as_str()])
        .inc();
    tracing::debug!(route = %fill.route.name, outcome = outcome.as_str(), "background refresh");
    answer
}

fn busy() -> Answer {
    Answer::Failed(
        CacheOutcome::Miss,
        ProxyError::Overloaded("refresh running elsewhere"),
    )
}

fn refresh_outcome(answer: &Answer) -> RefreshOutcome {
    if failure_reason(answer).is_some() {
        return RefreshOutcome::Failed;
    }
    match answer {
        Answer::Shared(CacheOutcome::Hit | CacheOutcome::Negative, ..) => {
            RefreshOutcome::AlreadyFresh
        }
        Answer::Shared(CacheOutcome::Degraded, ..) | Answer::Failed(CacheOutcome::Degraded, _) => {
            RefreshOutcome::StoreError
        }
        _ => RefreshOutcome::Fetched,
    }
}

/// What may answer a failed refill, judged on the object as read again
/// after the failure (`found`, at `now_ms`): never the entry the request
/// read before its refill, whose generation may have been replaced since.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Another fill published meanwhile: a hit.
    Fresh(Entry),
    /// Expired, of the current generation, within its `stale_if_error`.
    Stale(Entry),
}

pub(crate) fn usable_after_failure(found: Found, now_ms: u64) -> Option<AfterFailure> {
    match found {
        Found::Fresh(e) => Some(AfterFailure::Fresh(e)),
        Found::Expired(e) if e.within_stale_if_error(now_ms) => Some(AfterFailure::Stale(e)),
        Found::Expired(_) | Found::Miss(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn entry(status: u16) -> Arc<Entry> {
        Arc::new(Entry {
            status,
            negative: false,
            stored_at_ms: 0,
            fresh_until_ms: 1_000,
            grace_ms: 0,
            stale_if_error_ms: 500,
            generation: bytes::Bytes::from_static(b"g"),
            identity: "app:1".into(),
            variant: "v".into(),
            headers: vec![],
            body: bytes::Bytes::new(),
            tags: vec![],
        })
    }

    #[test]
    fn which_failures_may_be_answered_stale() {
        let failed = |e| failure_reason(&Answer::Failed(CacheOutcome::Miss, e));
        assert_eq!(
            failed(ProxyError::Overloaded(LEASE_WAIT_SPENT)),
            Some(StaleReason::LeaseWait)
        );
        assert_eq!(
            failed(ProxyError::Overloaded("fill permits exhausted")),
            Some(StaleReason::Permits)
        );
        assert_eq!(
            failed(ProxyError::Upstream(UpstreamError::Timeout)),
            Some(StaleReason::UpstreamError)
        );
        assert_eq!(
            failed(ProxyError::Upstream(UpstreamError::Connect(
                "refused".into()
            ))),
            Some(StaleReason::UpstreamError)
        );
        // The client's own fault is not the origin failing.
        assert_eq!(
            failed(ProxyError::Upstream(UpstreamError::ClientBody("x".into()))),
            None
        );
        let shared = |s| {
            failure_reason(&Answer::Shared(
                CacheOutcome::Miss,
                entry(s),
                Default::default(),
            ))
        };
        assert_eq!(shared(503), Some(StaleReason::UpstreamError));
        assert_eq!(shared(200), None);
        assert_eq!(shared(404), None);
        let mut resp = http::Response::new(crate::body::empty());
        *resp.status_mut() = http::StatusCode::BAD_GATEWAY;
        let exclusive = Answer::Exclusive(CacheOutcome::Miss, Mutex::new(Some(resp)));
        assert_eq!(failure_reason(&exclusive), Some(StaleReason::UpstreamError));
    }

    #[test]
    fn stale_if_error_window_is_checked_when_the_refill_fails() {
        let e = || Entry::clone(&entry(200));
        let at = |now| usable_after_failure(super::super::lookup::by_freshness(e(), now), now);
        assert_eq!(at(999), Some(AfterFailure::Fresh(e())), "still fresh");
        assert_eq!(at(1_000), Some(AfterFailure::Stale(e())));
        assert_eq!(at(1_499), Some(AfterFailure::Stale(e())));
        assert_eq!(at(1_500), None, "window over");
        // Invalidated (or lost) meanwhile: the read-again finds no entry of
        // the current generation, and nothing stale is served.
        assert_eq!(usable_after_failure(Found::Miss(None), 1_200), None);
    }
}
