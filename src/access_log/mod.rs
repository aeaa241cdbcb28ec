//! The access log (`access_log` in the config): one line per client request
//! on stdout, text (logfmt) or JSON, with the time, peer, method, path (the
//! query only with `query: true`), status, cache result, route, total and
//! upstream duration, response bytes, and the W3C trace id of `traceparent`
//! (else the request's `X-Request-Id`).
//!
//! A request never waits for the log: its line goes into a bounded buffer
//! (`access_log.buffer` lines) with a non-blocking send, and one writer thread
//! formats and writes the lines ([`writer`]); a line that finds the buffer
//! full is dropped and counted (`sidecache_access_log_dropped_total`). A
//! thread, not a task: writes to a pipe whose reader is slow block, and
//! must not block a runtime worker.
//!
//! The settings are read per request from the config snapshot, so a reload
//! turns the log on or off, and changes its format or sampling, at once.
//! A line is written when its response body is done (or dropped: a client
//! that went away), so bytes and duration cover the whole answer.

pub mod format;
pub mod writer;

use crate::body::{self, Body};
use crate::config::file::{FileLogFormat, FileRequestId};
use crate::config::{AccessLogConfig, Route};
use crate::metrics::Metrics;
use crate::proxy::timing::UpstreamTime;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::{Frame, SizeHint};
use prometheus::IntCounter;
use rand::Rng;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// `reason` label values of `sidecache_access_log_dropped_total`.
pub mod dropped {
    /// The buffer was full (the writer cannot keep up with the output).
    pub const BUFFER_FULL: &str = "buffer_full";
    /// Writing to stdout failed.
    pub const WRITE_ERROR: &str = "write_error";
}

/// The process's access log: the sending side of the buffer. Shared by all
/// connections.
pub struct AccessLog {
    tx: SyncSender<Line>,
    dropped_full: IntCounter,
}

/// One request's line, filled in as the request goes.
#[derive(Debug)]
pub struct Line {
    pub time: SystemTime,
    pub peer: SocketAddr,
    pub method: Method,
    /// Copies, cut at [`MAX_TARGET`] bytes: a line waiting in the buffer
    /// must not keep a request's whole head alive.
    pub path: String,
    /// Only with `access_log.query`.
    pub query: Option<String>,
    pub format: FileLogFormat,
    pub status: u16,
    /// The `X-Cache` word for requests on a cache route; `None` otherwise.
    pub cache: Option<HeaderValue>,
    pub route: Option<Arc<Route>>,
    pub duration: Duration,
    pub upstream: Option<Duration>,
    pub bytes: u64,
    /// The trace id of a valid `traceparent`.
    pub trace_id: Option<String>,
    /// `X-Request-Id`, its first [`format::MAX_ID`] + 1 bytes (the writer
    /// escapes it and marks a cut).
    pub request_id: Option<Bytes>,
}

/// Path and query are each cut to this many bytes in a line.
pub const MAX_TARGET: usize = 1024;

/// The first [`MAX_TARGET`] bytes of `s` (URI text is ASCII), `…` if cut.
fn bounded(s: &str) -> String {
    match s.get(..MAX_TARGET) {
        Some(head) if s.len() > MAX_TARGET => format!("{head}…"),
        _ => s.to_owned(),
    }
}

impl AccessLog {
    /// The log of a running sidecache: the writer thread writes to stdout.
    pub fn start(capacity: usize, metrics: &Metrics) -> std::io::Result<Arc<AccessLog>> {
        let (log, rx) = AccessLog::new(capacity, metrics);
        writer::spawn(rx, Box::new(std::io::stdout()), metrics)?;
        Ok(log)
    }

    /// A log whose lines arrive on the returned receiver (for a writer, or
    /// a test that looks at them).
    pub fn new(capacity: usize, metrics: &Metrics) -> (Arc<AccessLog>, Receiver<Line>) {
        let (tx, rx) = sync_channel(capacity);
        let log = Arc::new(AccessLog {
            tx,
            dropped_full: metrics
                .access_log_dropped
                .with_label_values(&[dropped::BUFFER_FULL]),
        });
        (log, rx)
    }

    /// Hands `line` to the writer without waiting; full buffer: dropped.
    pub fn submit(&self, line: Line) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped_full.inc(),
            // The writer is gone (its thread ended): nothing to log to.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// What the start of a request decided for its line and its request id.
pub struct Begun {
    /// `None`: this request is not logged (log off, or not sampled).
    pub pending: Option<Pending>,
    /// The value the response's `X-Request-Id` gets (`request_id: generate`).
    pub request_id: Option<HeaderValue>,
}

/// A line waiting for its response.
pub struct Pending {
    log: Arc<AccessLog>,
    line: Box<Line>,
    started: Instant,
    upstream: Arc<UpstreamTime>,
}

/// At the start of a request: applies `request_id` (a missing id is
/// generated and added to the request, so forwarding and fills send it
/// upstream) and decides whether this request is logged.
pub fn begin<B>(
    log: &Arc<AccessLog>,
    cfg: &AccessLogConfig,
    req: &mut Request<B>,
    peer: SocketAddr,
) -> Begun {
    let request_id = match cfg.request_id {
        FileRequestId::Pass => None,
        FileRequestId::Generate => Some(
            req.headers_mut()
                .entry(&X_REQUEST_ID)
                .or_insert_with(new_request_id)
                .clone(),
        ),
    };
    if !cfg.enabled || !sampled(cfg.sample, || rand::rng().random::<f64>()) {
        return Begun {
            pending: None,
            request_id,
        };
    }
    let headers = req.headers();
    let line = Line {
        time: SystemTime::now(),
        peer,
        method: req.method().clone(),
        path: bounded(req.uri().path()),
        query: req.uri().query().filter(|_| cfg.query).map(bounded),
        format: cfg.format,
        status: 0,
        cache: None,
        route: None,
        duration: Duration::ZERO,
        upstream: None,
        bytes: 0,
        trace_id: headers
            .get(&TRACEPARENT)
            .and_then(|v| format::trace_id(v.as_bytes()))
            .map(str::to_owned),
        request_id: headers.get(&X_REQUEST_ID).map(|v| {
            let raw = v.as_bytes();
            Bytes::copy_from_slice(&raw[..raw.len().min(format::MAX_ID + 1)])
        }),
    };
    Begun {
        pending: Some(Pending {
            log: Arc::clone(log),
            line: Box::new(line),
            started: Instant::now(),
            upstream: Arc::default(),
        }),
        request_id,
    }
}

/// Whether a request is logged at rate `sample`; `draw` gives a uniform
/// number in [0, 1) and is only called when sampling.
pub fn sampled(sample: f64, draw: impl FnOnce() -> f64) -> bool {
    sample >= 1.0 || draw() < sample
}

/// 128 random bits as 32 lower-case hex digits.
fn new_request_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::rng().random();
    let mut text = [0u8; 32];
    for (i, b) in text.iter_mut().enumerate() {
        *b = HEX[((bits >> (4 * (31 - i))) & 0xf) as usize];
    }
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

impl Pending {
    /// The cell the upstream client adds this request's upstream time to.
    pub fn upstream_time(&self) -> Arc<UpstreamTime> {
        Arc::clone(&self.upstream)
    }

    /// Takes the response head's facts; the line is written when the
    /// returned response's body is done. `cached`: the request was a read
    /// on a cache route, so its `X-Cache` header is sidecache's own.
    pub fn respond(
        mut self,
        resp: Response<Body>,
        route: Option<Arc<Route>>,
        cached: bool,
    ) -> Response<Body> {
        self.line.status = resp.status().as_u16();
        if cached {
            self.line.cache = resp.headers().get("x-cache").cloned();
        }
        self.line.route = route;
        resp.map(|inner| {
            body::boxed(LoggedBody {
                inner,
                pending: Some(self),
            })
        })
    }

    /// Writes the line (its `bytes` counted by the body).
    fn finish(mut self) {
        self.line.duration = self.started.elapsed();
        self.line.upstream = self.upstream.get();
        self.log.submit(*self.line);
    }
}

/// A response body that counts what it hands out and writes its request's
/// line when it ends or is dropped.
struct LoggedBody {
    inner: Body,
    /// `None` once the line is written.
    pending: Option<Pending>,
}

impl LoggedBody {
    fn done(&mut self) {
        if let Some(p) = self.pending.take() {
            p.finish();
        }
    }
}

impl http_body::Body for LoggedBody {
    type Data = Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(p)) = (frame.data_ref(), this.pending.as_mut()) {
                    p.line.bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.done();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.done(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        self.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn cfg(enabled: bool, request_id: FileRequestId) -> AccessLogConfig {
        AccessLogConfig {
            enabled,
            format: FileLogFormat::Json,
            sample: 1.0,
            query: false,
            request_id,
            buffer: 8,
        }
    }

    fn peer() -> SocketAddr {
        "192.0.2.7:4711".parse().expect("addr")
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_waiting() {
        let metrics = Metrics::new();
        let (log, rx) = AccessLog::new(2, &metrics);
        for _ in 0..5 {
            let mut req = Request::new(());
            let begun = begin(&log, &cfg(true, FileRequestId::Pass), &mut req, peer());
            let pending = begun.pending.expect("logged");
            // Dropping the response (its body unpolled) writes the line.
            drop(pending.respond(Response::new(body::empty()), None, false));
        }
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(
            metrics
                .access_log_dropped
                .with_label_values(&[dropped::BUFFER_FULL])
                .get(),
            3
        );
    }

    #[tokio::test]
    async fn the_line_counts_body_bytes_and_takes_the_cache_word_only_on_cache_routes() {
        let metrics = Metrics::new();
        let (log, rx) = AccessLog::new(8, &metrics);
        for cached in [true, false] {
            let mut req = Request::get("/a/b?secret=1")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(())
                .expect("request");
            let pending = begin(&log, &cfg(true, FileRequestId::Pass), &mut req, peer())
                .pending
                .expect("logged");
            let mut resp = Response::new(body::full("hello world"));
            *resp.status_mut() = http::StatusCode::NOT_FOUND;
            resp.headers_mut()
                .insert("x-cache", HeaderValue::from_static("NEGATIVE"));
            let resp = pending.respond(resp, None, cached);
            let got = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&got[..], b"hello world");
            let line = rx.try_recv().expect("line written at the end of the body");
            assert_eq!((line.status, line.bytes), (404, 11));
            assert_eq!(line.path, "/a/b");
            assert_eq!(line.query, None, "query off");
            assert_eq!(line.peer, peer());
            assert_eq!(
                line.trace_id.as_deref(),
                Some("4bf92f3577b34da6a3ce929d0e0e4736")
            );
            assert_eq!(line.upstream, None);
            if cached {
                assert_eq!(
                    line.cache.as_ref().map(|v| v.as_bytes()),
                    Some(&b"NEGATIVE"[..])
                );
            } else {
                // A forwarded answer's X-Cache is the upstream's, not ours.
                assert_eq!(line.cache, None);
            }
        }
    }

    #[test]
    fn request_ids_are_passed_or_generated() {
        let metrics = Metrics::new();
        let (log, _rx) = AccessLog::new(8, &metrics);
        // pass: nothing added, nothing echoed.
        let mut req = Request::new(());
        let begun = begin(&log, &cfg(false, FileRequestId::Pass), &mut req, peer());
        assert!(begun.request_id.is_none() && begun.pending.is_none());
        assert!(req.headers().get(&X_REQUEST_ID).is_none());
        // generate: a missing id is made and put on the request.
        let mut req = Request::new(());
        let begun = begin(&log, &cfg(false, FileRequestId::Generate), &mut req, peer());
        let id = begun.request_id.expect("generated");
        assert_eq!(id.len(), 32);
        assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_eq!(req.headers().get(&X_REQUEST_ID), Some(&id));
        let mut again = Request::new(());
        let other = begin(
            &log,
            &cfg(false, FileRequestId::Generate),
            &mut again,
            peer(),
        );
        assert_ne!(other.request_id, Some(id), "ids are fresh per request");
        // generate with a client id: kept untouched and echoed.
        let mut req = Request::get("/")
            .header("x-request-id", "client-1")
            .body(())
            .expect("req");
        let begun = begin(&log, &cfg(true, FileRequestId::Generate), &mut req, peer());
        assert_eq!(
            begun.request_id.as_ref().map(|v| v.as_bytes()),
            Some(&b"client-1"[..])
        );
        assert_eq!(req.headers().get_all(&X_REQUEST_ID).iter().count(), 1);
    }

    #[test]
    fn what_a_line_holds_is_bounded() {
        let metrics = Metrics::new();
        let (log, _rx) = AccessLog::new(8, &metrics);
        let long = format!("/{}?{}", "p".repeat(30_000), "q".repeat(30_000));
        let mut req = Request::get(long.as_str())
            .header("x-request-id", "i".repeat(60_000))
            .body(())
            .expect("request");
        let mut cfg = cfg(true, FileRequestId::Pass);
        cfg.query = true;
        let pending = begin(&log, &cfg, &mut req, peer()).pending.expect("logged");
        let line = &pending.line;
        assert_eq!(line.path.len(), MAX_TARGET + '…'.len_utf8());
        assert_eq!(
            line.query.as_ref().map(String::len),
            Some(MAX_TARGET + '…'.len_utf8())
        );
        assert_eq!(
            line.request_id.as_ref().map(Bytes::len),
            Some(format::MAX_ID + 1)
        );
    }

    #[test]
    fn sampling_draws_only_below_one() {
        assert!(sampled(1.0, || unreachable!("no draw at 1.0")));
        assert!(sampled(0.25, || 0.2));
        assert!(!sampled(0.25, || 0.25));
        assert!(!sampled(0.25, || 0.9));
    }
}
