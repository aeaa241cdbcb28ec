//! Request bodies on their way to the service. A forwarded request's body
//! is held (up to `limits.request_buffer`) before the upstream request
//! starts, so the service is only called for a request whose body is there
//! (or whose buffer is full, after which the rest streams), and a client
//! that trickles its upload ties up sidecache, which is cheap, instead of
//! a worker of the service. The held part must arrive within
//! `limits.body_timeout`. Every held body is charged to one process-wide
//! [`UploadBudget`] (`limits.request_buffer_budget`), so memory stays
//! bounded whatever the number of uploads
//! (docs/configuration.md#request-bodies).

use super::client::ClientBodyError;
use crate::body::BoxError;
use crate::config::UploadConfig;
use bytes::{Buf, Bytes};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus::IntGauge;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

/// Why a body was not forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UploadError {
    /// The budget has no room for this body's buffer (503).
    #[error("request buffer budget spent")]
    Budget,
    /// The held part did not arrive within `body_timeout` (408).
    #[error("request body not received within the body timeout")]
    TimedOut,
    /// The body failed while it arrived (bad chunked framing, the client
    /// went away): 400.
    #[error("request body failed: {0}")]
    Body(#[source] hyper::Error),
}

/// What all held request bodies may reserve together, for the whole
/// process (every worker's connections).
pub(crate) struct UploadBudget {
    reserved: AtomicUsize,
    /// Mirrors `reserved`, for `/metrics`.
    reserved_gauge: IntGauge,
    /// Bytes held in buffers now (arrived, not yet handed upstream).
    held_gauge: IntGauge,
}

impl UploadBudget {
    pub(crate) fn new(reserved_gauge: IntGauge, held_gauge: IntGauge) -> Arc<UploadBudget> {
        Arc::new(UploadBudget {
            reserved: AtomicUsize::new(0),
            reserved_gauge,
            held_gauge,
        })
    }

    /// Reserves `bytes` if that keeps the total within `limit` (the live
    /// config's budget, so a reload applies to the next upload).
    fn reserve(self: &Arc<Self>, bytes: usize, limit: usize) -> Option<Charge> {
        self.reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                now.checked_add(bytes).filter(|total| *total <= limit)
            })
            .ok()?;
        self.reserved_gauge.add(gauge_value(bytes));
        Some(Charge {
            budget: Arc::clone(self),
            reserved: bytes,
        })
    }
}

fn gauge_value(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// One body's reservation; given back when dropped.
struct Charge {
    budget: Arc<UploadBudget>,
    reserved: usize,
}

impl Charge {
    /// Keeps only `bytes` of the reservation.
    fn shrink_to(&mut self, bytes: usize) {
        let freed = self.reserved.saturating_sub(bytes);
        if freed > 0 {
            self.budget.reserved.fetch_sub(freed, Ordering::Relaxed);
            self.budget.reserved_gauge.sub(gauge_value(freed));
            self.reserved -= freed;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

/// A request body as it goes upstream: the frames held here first, then
/// (when the buffer filled before the body ended) the rest of the client's
/// body as it arrives. Errors of the client's body are [`ClientBodyError`]s,
/// so the upstream client tells them from the service's.
pub(crate) struct UploadBody {
    held: VecDeque<Frame<Bytes>>,
    /// Data bytes in `held`.
    held_bytes: usize,
    rest: Option<Incoming>,
    /// Present while `held` has frames.
    charge: Option<Charge>,
}

impl UploadBody {
    /// The client's body, unbuffered.
    pub(crate) fn streamed(body: Incoming) -> UploadBody {
        UploadBody {
            held: VecDeque::new(),
            held_bytes: 0,
            rest: Some(body),
            charge: None,
        }
    }

    fn push(&mut self, frame: Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.held_bytes += data.len();
            if let Some(charge) = &self.charge {
                charge.budget.held_gauge.add(gauge_value(data.len()));
            }
        }
        self.held.push_back(frame);
    }

    /// Frees what the held frames cost (all of it once none is left).
    fn handed_out(&mut self, bytes: usize) {
        self.held_bytes -= bytes;
        if let Some(charge) = &self.charge {
            charge.budget.held_gauge.sub(gauge_value(bytes));
        }
        if self.held.is_empty() {
            self.charge = None;
        }
    }
}

impl Drop for UploadBody {
    fn drop(&mut self) {
        if let Some(charge) = &self.charge {
            charge.budget.held_gauge.sub(gauge_value(self.held_bytes));
        }
    }
}

impl http_body::Body for UploadBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(frame) = this.held.pop_front() {
            let len = frame.data_ref().map_or(0, Buf::remaining);
            this.handed_out(len);
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(rest) = &mut this.rest else {
            return Poll::Ready(None);
        };
        Pin::new(rest)
            .poll_frame(cx)
            .map_err(|e| BoxError::from(ClientBodyError(e)))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held_bytes as u64;
        let rest = match &self.rest {
            Some(rest) => rest.size_hint(),
            // Held whole: sent with a `Content-Length`, unless trailers
            // follow, which only chunked coding carries.
            None if !self.held.back().is_some_and(Frame::is_trailers) => {
                return SizeHint::with_exact(held)
            }
            None => SizeHint::new(),
        };
        let mut hint = SizeHint::new();
        // Upper first: `set_lower` must not pass the upper bound.
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + held);
        }
        hint.set_lower(rest.lower() + held);
        hint
    }
}

/// Holds `body` until it has all arrived or `cfg.buffer` bytes of it have
/// (see the module doc), or streams it when it is empty, `stream` is set
/// (`limits.stream_uploads`) or buffering is off.
pub(crate) async fn hold(
    budget: &Arc<UploadBudget>,
    cfg: &UploadConfig,
    body: Incoming,
    stream: bool,
) -> Result<UploadBody, UploadError> {
    if stream || cfg.buffer == 0 || body.is_end_stream() {
        return Ok(UploadBody::streamed(body));
    }
    // A declared length is reserved exactly; a chunked body may need the
    // whole buffer, and gives back what it did not use once it ends.
    let cap = body.size_hint().exact().map_or(cfg.buffer, |n| {
        usize::try_from(n).unwrap_or(usize::MAX).min(cfg.buffer)
    });
    let charge = budget.reserve(cap, cfg.budget).ok_or(UploadError::Budget)?;
    let mut upload = UploadBody {
        held: VecDeque::new(),
        held_bytes: 0,
        rest: None,
        charge: Some(charge),
    };
    let deadline = Instant::now() + cfg.body_timeout;
    let mut body = body;
    // Created only when a frame is not there yet: a small body usually came
    // with its head, and then costs no timer.
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    loop {
        if body.is_end_stream() {
            break;
        }
        if upload.held_bytes >= cap {
            // Full: from here the rest streams (docs/configuration.md#request-bodies).
            upload.rest = Some(body);
            return Ok(upload);
        }
        let next = poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Ok(frame)),
            Poll::Pending => {
                let timer =
                    timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                timer.as_mut().poll(cx).map(|()| Err(UploadError::TimedOut))
            }
        })
        .await?;
        match next {
            None => break,
            Some(Err(e)) => return Err(UploadError::Body(e)),
            Some(Ok(frame)) => upload.push(frame),
        }
    }
    let held = upload.held_bytes;
    match &mut upload.charge {
        Some(charge) if !upload.held.is_empty() => charge.shrink_to(held),
        _ => upload.charge = None,
    }
    Ok(upload)
}
