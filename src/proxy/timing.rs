//! How long a client request waited for the upstream, for its access log
//! line. The request's handler runs inside [`measured`]; the upstream client
//! adds each exchange's time to the response head ([`record`]) to the
//! [`UpstreamTime`] of the request it runs for. A cache fill runs in a task
//! of its own, so the request that starts it passes its cell along
//! ([`current`] + [`measured`]); requests that join a running fill called
//! no upstream themselves and record nothing.

use futures_util::future::Either;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

tokio::task_local! {
    static UPSTREAM: Arc<UpstreamTime>;
}

/// Upstream time of one client request, summed over its exchanges.
#[derive(Debug, Default)]
pub struct UpstreamTime {
    /// Microseconds, plus one: 0 means no upstream exchange.
    micros_plus_one: AtomicU64,
}

impl UpstreamTime {
    pub fn add(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX / 2);
        // The first exchange also adds the 1 that marks "called".
        let _ = self
            .micros_plus_one
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_add(micros + u64::from(v == 0)))
            });
    }

    /// `None` if no upstream exchange was recorded.
    pub fn get(&self) -> Option<Duration> {
        match self.micros_plus_one.load(Ordering::Acquire) {
            0 => None,
            v => Some(Duration::from_micros(v - 1)),
        }
    }
}

/// Runs `fut` with `cell` as the current request's upstream time; without
/// a cell, `fut` itself (no task-local scope to enter on every poll). Not
/// an `async fn`: one with two awaiting branches would hold room for both.
pub fn measured<F: Future>(
    cell: Option<Arc<UpstreamTime>>,
    fut: F,
) -> Either<tokio::task::futures::TaskLocalFuture<Arc<UpstreamTime>, F>, F> {
    match cell {
        Some(cell) => Either::Left(UPSTREAM.scope(cell, fut)),
        None => Either::Right(fut),
    }
}

/// The current request's cell, to hand to a task that works for it.
pub fn current() -> Option<Arc<UpstreamTime>> {
    UPSTREAM.try_with(Arc::clone).ok()
}

/// Adds one upstream exchange to the current request, if it is measured.
pub fn record(elapsed: Duration) {
    let _ = UPSTREAM.try_with(|t| t.add(elapsed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_only_inside_a_measured_request_and_follows_handed_cells() {
        // Outside: nothing to record into, and no panic.
        record(Duration::from_millis(5));
        assert!(current().is_none());

        let cell = Arc::new(UpstreamTime::default());
        assert_eq!(cell.get(), None);
        measured(Some(cell.clone()), async {
            record(Duration::from_micros(1500));
            // A task started for this request and handed the cell.
            let handed = current();
            tokio::spawn(measured(handed, async {
                record(Duration::from_micros(500));
            }))
            .await
            .expect("task");
            // A task that was not handed it records nothing here.
            tokio::spawn(async { record(Duration::from_secs(1)) })
                .await
                .expect("task");
        })
        .await;
        assert_eq!(cell.get(), Some(Duration::from_micros(2000)));

        // A zero-length exchange still counts as "called".
        let zero = Arc::new(UpstreamTime::default());
        measured(Some(zero.clone()), async { record(Duration::ZERO) }).await;
        assert_eq!(zero.get(), Some(Duration::ZERO));
    }
}
