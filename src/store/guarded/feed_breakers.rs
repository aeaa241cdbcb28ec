//! The invalidation feeds' breakers and their early probe.
//!
//! The invalidation feeds (outbox, stream) keep a breaker of their own
//! (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events): a
//! request-path breaker opened by one slow read must not stop invalidations
//! that would succeed, and a feed needs to know whether *its* calls reach the
//! store to decide whether to take events at all
//! ([`super::GuardedStore::feeds_ready_at`]). One per master on a cluster,
//! as on the request path: a dead master must not stop the invalidations of
//! the others' keys either.

use super::node_breakers::Breakers;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How often a feed waiting for its breaker pings the store
/// ([`FeedBreakers::ready`]).
pub(super) const FEEDS_PROBE_EVERY: Duration = Duration::from_millis(25);

/// The feeds' breakers: invalidations, floors and witness beats of the
/// feeds go through them.
pub(super) struct FeedBreakers {
    breakers: Breakers,
    /// Early probes answered since a feed's invalidation last succeeded:
    /// each doubles the wait for the next ([`FeedBreakers::ready`]).
    early_closes: AtomicU32,
    /// When the last early probe started: the pace is kept across callers,
    /// and across a caller's `feeds_ready` futures (the outbox worker makes
    /// a new one each time a NOTIFY wakes it, every few milliseconds while
    /// writes go on; a pace counted from each call would never probe).
    probed_at: Mutex<Option<Instant>>,
}

impl FeedBreakers {
    pub(super) fn new(breakers: Breakers) -> FeedBreakers {
        FeedBreakers {
            breakers,
            early_closes: AtomicU32::new(0),
            probed_at: Mutex::new(None),
        }
    }

    pub(super) fn breakers(&self) -> &Breakers {
        &self.breakers
    }

    /// `None` if a feed's store call would be let through now, else when
    /// it will be: until then the feed's store is unavailable to it, and it
    /// leaves events to instances whose store works. On a cluster, only
    /// while every master's feeds' breaker is open: with one master dead,
    /// events still flow, and those of its keys fail and are retried.
    pub(super) fn ready_at(&self) -> Option<Instant> {
        self.breakers.refuse_until()
    }

    /// Resolves when a feed's store call would be let through: at the end
    /// of the feeds' breaker's cooldown, or as soon as a `PING` (`ping`:
    /// whether the store answered it; one per [`FEEDS_PROBE_EVERY`] at
    /// most) is answered, which closes the breaker. A
    /// Redis that restarts in 30 ms is back for the request path (a read
    /// that fails opens only its own breaker, the near cache's connection
    /// reconnects at once) long before the cooldown ends, and every event
    /// committed meanwhile would wait for it while fills of the old
    /// version are served.
    ///
    /// A store that answers the `PING` but still fails the invalidations
    /// (a dead master of a cluster, whose slots `PING` does not reach)
    /// would make this a loop at the probe's pace: each answered probe
    /// doubles the next one's wait until an invalidation succeeds
    /// ([`FeedBreakers::invalidated`]), so it falls back to the cooldown's
    /// pace.
    pub(super) async fn ready<F: Future<Output = bool>>(&self, ping: impl Fn() -> F) {
        while let Some(at) = self.ready_at() {
            let doublings = self.early_closes.load(Ordering::Relaxed).min(16);
            let every = FEEDS_PROBE_EVERY.saturating_mul(1 << doublings);
            let now = Instant::now();
            let due = self.last_probe().map_or(now, |t| (t + every).max(now));
            let next = at.min(due);
            tokio::time::sleep_until(next).await;
            if next < at && self.last_probe().is_none_or(|t| t + every <= next) {
                self.probe(&ping).await;
            }
        }
    }

    /// A feed's invalidation succeeded: early probes keep their pace again.
    pub(super) fn invalidated(&self) {
        self.early_closes.store(0, Ordering::Relaxed);
    }

    fn last_probe(&self) -> Option<Instant> {
        *self
            .probed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One early probe of the feeds' breaker: made beside it (the
    /// breaker's own probe still comes at the cooldown's end), it only
    /// closes the breaker when answered.
    async fn probe<F: Future<Output = bool>>(&self, ping: impl Fn() -> F) {
        *self
            .probed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if ping().await {
            self.breakers.close_early();
            self.early_closes.fetch_add(1, Ordering::Relaxed);
        }
    }
}
