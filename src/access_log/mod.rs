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
//! that went away), so bytes and duration cover the whole answer: the
//! server's response body keeps the line's [`Tail`].
//!
//! What a logged request pays on its worker is kept small (the access
//! log's cost target, `bench/README.md`): one allocation (the boxed
//! [`Line`], its path, query and id inline unless long), two clock reads,
//! one pass over the request headers, one channel send of a pointer. The
//! formatting, and turning the start into wall-clock time, are the writer's.

pub mod format;
pub mod writer;

use crate::body::BoxError;
use crate::config::file::{FileLogFormat, FileRequestId};
use crate::config::{AccessLogConfig, Route};
use crate::metrics::Metrics;
use crate::pipeline::status::CacheStatus;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::Frame;
use prometheus::IntCounter;
use rand::Rng;
use smallvec::SmallVec;
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

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
    tx: SyncSender<Box<Line>>,
    dropped_full: IntCounter,
}

/// One request's line, filled in as the request goes. Boxed once per
/// logged request (the buffer holds pointers); what it holds is its own
/// copy, bounded (see [`Text`]), so a line waiting in the buffer keeps no
/// part of a request alive.
#[derive(Debug)]
pub struct Line {
    /// When the request started; the writer turns it into wall-clock time
    /// (one clock read per request saved: see `writer::Clock`).
    pub start: Instant,
    pub peer: SocketAddr,
    pub method: Method,
    pub format: FileLogFormat,
    pub status: u16,
    /// What the pipeline did (the `X-Cache` word) for requests on a cache
    /// route; `None` otherwise.
    pub cache: Option<CacheStatus>,
    pub route: Option<Arc<Route>>,
    pub duration: Duration,
    pub upstream: Option<Duration>,
    pub bytes: u64,
    pub text: Text,
}

/// Path and query are each cut to this many bytes in a line.
pub const MAX_TARGET: usize = 1024;

/// Bytes of path, query and id a line holds without a heap allocation of
/// its own: most API paths and a 32-digit id fit.
const INLINE_TEXT: usize = 112;

/// A line's client-sent text (path, the query, the id) in one buffer,
/// one after another: path and query cut at [`MAX_TARGET`] bytes (`…`
/// marks a cut), the id at [`format::MAX_ID`] + 1 (the writer escapes it
/// and marks the cut).
#[derive(Debug, Default)]
pub struct Text {
    buf: SmallVec<[u8; INLINE_TEXT]>,
    path_end: u16,
    /// `None`: no query logged.
    query_end: Option<u16>,
    id: IdKind,
}

/// What the id part of a [`Text`] is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    #[default]
    None,
    /// The trace id of a valid `traceparent` (32 hex digits).
    Trace,
    /// The raw `X-Request-Id` (escaped by the writer).
    Request,
}

impl Text {
    /// `path` and `query` (each cut at [`MAX_TARGET`]) and an id.
    pub fn new(path: &str, query: Option<&str>, id: Option<(IdKind, &[u8])>) -> Text {
        let mut text = Text::default();
        push_bounded(&mut text.buf, path);
        text.path_end = text.buf.len() as u16;
        if let Some(query) = query {
            push_bounded(&mut text.buf, query);
            text.query_end = Some(text.buf.len() as u16);
        }
        if let Some((kind, raw)) = id {
            let cut = match kind {
                IdKind::Request => raw.len().min(format::MAX_ID + 1),
                _ => raw.len(),
            };
            text.buf.extend_from_slice(&raw[..cut]);
            text.id = kind;
        }
        text
    }

    pub fn path(&self) -> &[u8] {
        &self.buf[..usize::from(self.path_end)]
    }

    pub fn query(&self) -> Option<&[u8]> {
        let end = usize::from(self.query_end?);
        Some(&self.buf[usize::from(self.path_end)..end])
    }

    /// The id and what it is.
    pub fn id(&self) -> (IdKind, &[u8]) {
        let from = usize::from(self.query_end.unwrap_or(self.path_end));
        (self.id, &self.buf[from..])
    }
}

/// Appends the first [`MAX_TARGET`] bytes of `s` (cut at a character
/// boundary), `…` if cut. Fits the `u16` ends of [`Text`].
fn push_bounded(buf: &mut SmallVec<[u8; INLINE_TEXT]>, s: &str) {
    if s.len() <= MAX_TARGET {
        return buf.extend_from_slice(s.as_bytes());
    }
    let mut end = MAX_TARGET;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    buf.extend_from_slice(&s.as_bytes()[..end]);
    buf.extend_from_slice("…".as_bytes());
}

impl AccessLog {
    /// The log of a running sidecache: the writer thread writes to stdout.
    pub fn start(capacity: usize, metrics: &Metrics) -> std::io::Result<Arc<AccessLog>> {
        let (log, rx) = AccessLog::new(capacity, metrics);
        // A file on stdout's descriptor: the writer writes whole batches,
        // which `Stdout`'s lock and line buffer would only scan again.
        let out: Box<dyn std::io::Write + Send> = {
            use std::os::fd::AsFd;
            match std::io::stdout().as_fd().try_clone_to_owned() {
                Ok(fd) => Box::new(std::fs::File::from(fd)),
                Err(_) => Box::new(std::io::stdout()),
            }
        };
        writer::spawn(rx, out, metrics)?;
        Ok(log)
    }

    /// A log whose lines arrive on the returned receiver (for a writer, or
    /// a test that looks at them).
    pub fn new(capacity: usize, metrics: &Metrics) -> (Arc<AccessLog>, Receiver<Box<Line>>) {
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
    pub fn submit(&self, line: Box<Line>) {
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
}

/// At the start of a request: applies `request_id` (a missing id is
/// generated and added to the request, so forwarding and fills send it
/// upstream) and decides whether this request is logged. Inline: with the
/// log off and ids passed through (the default) this is one branch.
#[inline]
pub fn begin<B>(
    log: &Arc<AccessLog>,
    cfg: &AccessLogConfig,
    req: &mut Request<B>,
    peer: SocketAddr,
) -> Begun {
    if !cfg.enabled && cfg.request_id == FileRequestId::Pass {
        return Begun {
            pending: None,
            request_id: None,
        };
    }
    begin_line(log, cfg, req, peer)
}

fn begin_line<B>(
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
    // Sampling first: a request left out costs nothing more.
    if !cfg.enabled || !sampled(cfg.sample, || rand::rng().random::<f64>()) {
        return Begun {
            pending: None,
            request_id,
        };
    }
    let id = line_id(req.headers());
    let uri = req.uri();
    let line = Line {
        start: Instant::now(),
        peer,
        method: req.method().clone(),
        format: cfg.format,
        status: 0,
        cache: None,
        route: None,
        duration: Duration::ZERO,
        upstream: None,
        bytes: 0,
        text: Text::new(uri.path(), uri.query().filter(|_| cfg.query), id),
    };
    Begun {
        pending: Some(Pending {
            log: Arc::clone(log),
            line: Box::new(line),
        }),
        request_id,
    }
}

/// The line's id: the trace id of the first `traceparent` if it is
/// valid, else the first `X-Request-Id`. One pass over the headers, not two
/// lookups: a lookup hashes the name, which costs more than comparing a
/// request's few names (bounded, like all of the head, by
/// `limits.max_header_bytes`).
fn line_id(headers: &http::HeaderMap) -> Option<(IdKind, &[u8])> {
    let (mut trace, mut request) = (None, None);
    for (name, value) in headers {
        if *name == TRACEPARENT {
            trace.get_or_insert(value);
        } else if *name == X_REQUEST_ID {
            request.get_or_insert(value);
        }
    }
    match trace.and_then(|v| format::trace_id(v.as_bytes())) {
        Some(trace) => Some((IdKind::Trace, trace.as_bytes())),
        None => request.map(|v| (IdKind::Request, v.as_bytes())),
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
    /// Takes the response head's facts; the line is written when the
    /// returned [`Tail`], which goes with the response body, sees the body
    /// end or is dropped. `cache`: what the pipeline did, for a read on a
    /// cache route (a forwarded answer's `X-Cache` is the upstream's, not
    /// logged); `upstream`: the request's upstream time
    /// (`proxy::timing::measured`).
    pub fn respond<B>(
        mut self,
        resp: &Response<B>,
        route: Option<Arc<Route>>,
        cache: Option<CacheStatus>,
        upstream: Option<Duration>,
    ) -> Tail {
        self.line.status = resp.status().as_u16();
        self.line.cache = cache;
        self.line.route = route;
        self.line.upstream = upstream;
        Tail(Some(self))
    }

    /// Writes the line (its `bytes` counted by the body).
    fn finish(mut self) {
        self.line.duration = self.line.start.elapsed();
        self.log.submit(self.line);
    }
}

/// The access log's part of a response body (kept by the server's body
/// type, so a logged response costs no body wrapper of its own): counts
/// the bytes handed out and writes the line when the body ends or is
/// dropped (a client that went away).
#[derive(Default)]
pub struct Tail(Option<Pending>);

impl Tail {
    /// After each poll of the body: counts a data frame's bytes, and
    /// writes the line once the body is over (`ended`: the body says it has
    /// nothing more after this frame).
    #[inline]
    pub fn polled(
        &mut self,
        polled: &Poll<Option<Result<Frame<Bytes>, BoxError>>>,
        ended: impl FnOnce() -> bool,
    ) {
        let Some(pending) = self.0.as_mut() else {
            return;
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    pending.line.bytes += data.len() as u64;
                }
                if ended() {
                    self.done();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.done(),
            Poll::Pending => {}
        }
    }

    fn done(&mut self) {
        if let Some(p) = self.0.take() {
            p.finish();
        }
    }
}

impl Drop for Tail {
    #[inline]
    fn drop(&mut self) {
        // Inline: every response body drops one, logged or not.
        if self.0.is_some() {
            self.done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{self, Body};
    use http_body::Body as _;
    use std::pin::Pin;

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

    /// Polls `body` to its end through `tail`, as the server's body does.
    async fn drain(mut body: Body, mut tail: Tail) -> Vec<u8> {
        let mut got = Vec::new();
        loop {
            let polled =
                std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx).map(Poll::Ready))
                    .await;
            tail.polled(&polled, || body.is_end_stream());
            match polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        got.extend_from_slice(data);
                    }
                }
                _ => return got,
            }
        }
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_waiting() {
        let metrics = Metrics::new();
        let (log, rx) = AccessLog::new(2, &metrics);
        for _ in 0..5 {
            let mut req = Request::new(());
            let begun = begin(&log, &cfg(true, FileRequestId::Pass), &mut req, peer());
            let pending = begun.pending.expect("logged");
            // Dropping the tail (its body never polled) writes the line.
            drop(pending.respond(&Response::new(()), None, None, None));
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
    async fn the_line_counts_body_bytes_and_is_written_when_the_body_ends() {
        let metrics = Metrics::new();
        let (log, rx) = AccessLog::new(8, &metrics);
        for cache in [Some(CacheStatus::Negative), None] {
            let mut req = Request::get("/a/b?secret=1")
                .header("x-request-id", "not this one")
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
            let tail = pending.respond(&resp, None, cache, None);
            assert!(rx.try_recv().is_err(), "no line before the body is done");
            let got = drain(resp.into_body(), tail).await;
            assert_eq!(&got[..], b"hello world");
            let line = rx.try_recv().expect("line written at the end of the body");
            assert_eq!((line.status, line.bytes), (404, 11));
            assert_eq!(line.text.path(), b"/a/b");
            assert_eq!(line.text.query(), None, "query off");
            assert_eq!(line.peer, peer());
            assert_eq!(
                line.text.id(),
                (IdKind::Trace, &b"4bf92f3577b34da6a3ce929d0e0e4736"[..])
            );
            assert_eq!(line.upstream, None);
            assert_eq!(line.cache, cache);
        }
    }

    #[test]
    fn the_id_is_the_first_valid_traceparent_else_the_first_request_id() {
        let id = |headers: &[(&str, &str)]| {
            let mut map = http::HeaderMap::new();
            for (name, value) in headers {
                map.append(
                    HeaderName::from_bytes(name.as_bytes()).expect("name"),
                    HeaderValue::from_str(value).expect("value"),
                );
            }
            line_id(&map).map(|(kind, raw)| (kind, String::from_utf8_lossy(raw).into_owned()))
        };
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = (IdKind::Trace, "4bf92f3577b34da6a3ce929d0e0e4736".to_owned());
        assert_eq!(id(&[]), None);
        assert_eq!(id(&[("traceparent", good)]), Some(trace.clone()));
        assert_eq!(
            id(&[("x-request-id", "r1"), ("host", "h"), ("traceparent", good)]),
            Some(trace)
        );
        let request = Some((IdKind::Request, "r1".to_owned()));
        assert_eq!(
            id(&[("x-request-id", "r1"), ("x-request-id", "r2")]),
            request
        );
        // Only the first traceparent counts; an invalid one falls back.
        assert_eq!(
            id(&[
                ("traceparent", "bad"),
                ("traceparent", good),
                ("x-request-id", "r1")
            ]),
            request
        );
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
        let pending = begun.pending.expect("logged");
        assert_eq!(pending.line.text.id(), (IdKind::Request, &b"client-1"[..]));
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
        let text = &pending.line.text;
        assert_eq!(text.path().len(), MAX_TARGET + '…'.len_utf8());
        assert!(text.path().ends_with("…".as_bytes()));
        assert_eq!(
            text.query().map(<[u8]>::len),
            Some(MAX_TARGET + '…'.len_utf8())
        );
        assert_eq!(text.id().1.len(), format::MAX_ID + 1);
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        // `é` is two bytes: a cut at MAX_TARGET would land inside one.
        let path = format!("/{}", "é".repeat(MAX_TARGET));
        let text = Text::new(&path, None, None);
        let cut = std::str::from_utf8(text.path()).expect("whole characters");
        assert!(cut.ends_with('…') && cut.len() <= MAX_TARGET + '…'.len_utf8());
    }

    #[test]
    fn sampling_draws_only_below_one() {
        assert!(sampled(1.0, || unreachable!("no draw at 1.0")));
        assert!(sampled(0.25, || 0.2));
        assert!(!sampled(0.25, || 0.25));
        assert!(!sampled(0.25, || 0.9));
    }
}
