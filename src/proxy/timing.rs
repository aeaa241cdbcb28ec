//! How long a client request waited for the upstream, for its access log
//! line. A logged request's handler runs inside [`measured`], which
//! returns the time with the answer; the upstream client adds each
//! exchange's time to the response head ([`record`]) to the request it runs
//! for. A cache fill runs in a task of its own, so the request that starts
//! it hands it a shared cell ([`current`] + [`handed`]); requests that join
//! a running fill called no upstream themselves and record nothing.
//!
//! The request's own time lives in its task-local slot, not behind an
//! `Arc`: a logged hit allocates nothing here. The shared cell is made
//! only when a fill is handed one.

use futures_util::future::Either;
use std::cell::{Cell, OnceCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

tokio::task_local! {
    static UPSTREAM: Slot;
}

/// Where the current task's upstream exchanges are added.
enum Slot {
    /// A measured request: microseconds plus one (0: no exchange), and the
    /// cell handed to a fill it started, made on first use.
    Own {
        micros_plus_one: Cell<u64>,
        handed: OnceCell<Arc<UpstreamTime>>,
    },
    /// A task that works for a measured request.
    Handed(Arc<UpstreamTime>),
}

impl Slot {
    /// The request's upstream time: its own exchanges and its fill's.
    fn total(&self) -> Option<Duration> {
        match self {
            Slot::Own {
                micros_plus_one,
                handed,
            } => {
                let own = from_plus_one(micros_plus_one.get());
                let fill = handed.get().and_then(|cell| cell.get());
                match (own, fill) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                }
            }
            Slot::Handed(cell) => cell.get(),
        }
    }
}

/// `v` microseconds plus one, the first exchange adding the one that
/// marks "called".
fn add_plus_one(v: u64, elapsed: Duration) -> u64 {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX / 2);
    v.saturating_add(micros + u64::from(v == 0))
}

fn from_plus_one(v: u64) -> Option<Duration> {
    v.checked_sub(1).map(Duration::from_micros)
}

/// Upstream time of one client request, shared with a task that works for
/// it, summed over its exchanges.
#[derive(Debug, Default)]
pub(crate) struct UpstreamTime {
    /// Microseconds, plus one: 0 means no upstream exchange.
    micros_plus_one: AtomicU64,
}

impl UpstreamTime {
    pub(crate) fn add(&self, elapsed: Duration) {
        let _ = self
            .micros_plus_one
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(add_plus_one(v, elapsed))
            });
    }

    /// `None` if no upstream exchange was recorded.
    pub(crate) fn get(&self) -> Option<Duration> {
        from_plus_one(self.micros_plus_one.load(Ordering::Acquire))
    }
}

/// Runs `fut` as a measured request, and returns its output with the
/// upstream time it recorded (`None`: no exchange). A request that is not
/// logged runs without it: no task-local scope to enter on every poll.
pub(crate) fn measured<F: Future>(fut: F) -> impl Future<Output = (F::Output, Option<Duration>)> {
    let slot = Slot::Own {
        micros_plus_one: Cell::new(0),
        handed: OnceCell::new(),
    };
    Measured {
        scoped: UPSTREAM.scope(slot, fut),
    }
}

pin_project_lite::pin_project! {
    /// A request in its task-local slot; takes the slot back when done.
    /// A struct, not an `async fn`: that would keep the request's future
    /// twice (as its argument and inside the scope).
    struct Measured<F: Future> {
        #[pin]
        scoped: tokio::task::futures::TaskLocalFuture<Slot, F>,
    }
}

impl<F: Future> Future for Measured<F> {
    type Output = (F::Output, Option<Duration>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut scoped = self.project().scoped;
        let out = std::task::ready!(scoped.as_mut().poll(cx));
        let time = scoped.take_value().and_then(|slot| slot.total());
        Poll::Ready((out, time))
    }
}

/// Runs `fut` (a task that works for a request) adding its exchanges to
/// `cell`; without a cell, `fut` itself.
pub(crate) fn handed<F: Future>(
    cell: Option<Arc<UpstreamTime>>,
    fut: F,
) -> impl Future<Output = F::Output> {
    match cell {
        Some(cell) => Either::Left(UPSTREAM.scope(Slot::Handed(cell), fut)),
        None => Either::Right(fut),
    }
}

/// The current request's shared cell, to hand to a task that works for it.
pub(crate) fn current() -> Option<Arc<UpstreamTime>> {
    UPSTREAM
        .try_with(|slot| match slot {
            Slot::Own { handed, .. } => Arc::clone(handed.get_or_init(Arc::default)),
            Slot::Handed(cell) => Arc::clone(cell),
        })
        .ok()
}

/// Adds one upstream exchange to the current request, if it is measured.
pub(crate) fn record(elapsed: Duration) {
    let _ = UPSTREAM.try_with(|slot| match slot {
        Slot::Own {
            micros_plus_one, ..
        } => micros_plus_one.set(add_plus_one(micros_plus_one.get(), elapsed)),
        Slot::Handed(cell) => cell.add(elapsed),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_only_inside_a_measured_request_and_follows_handed_cells() {
        // Outside: nothing to record into, and no panic.
        record(Duration::from_millis(5));
        assert!(current().is_none());

        let ((), time) = measured(async {
            record(Duration::from_micros(1500));
            // A task started for this request and handed the cell.
            let handed_cell = current();
            tokio::spawn(handed(handed_cell, async {
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
        assert_eq!(time, Some(Duration::from_micros(2000)));

        // Only a fill's time, or none at all.
        let ((), time) = measured(async {
            tokio::spawn(handed(current(), async {
                record(Duration::from_micros(700));
            }))
            .await
            .expect("task");
        })
        .await;
        assert_eq!(time, Some(Duration::from_micros(700)));
        let ((), time) = measured(async {}).await;
        assert_eq!(time, None);

        // A zero-length exchange still counts as "called".
        let ((), time) = measured(async { record(Duration::ZERO) }).await;
        assert_eq!(time, Some(Duration::ZERO));
    }
}
