//! The access log (`access_log` in the config): one line per client request
//! on stdout, text (logfmt) or JSON, with the time, peer, method, path (the
//! query only with `query: true`), status, cache result, route, total and
//! upstream duration, response bytes, and the W3C trace id of `traceparent`
//! (else the request's `X-Request-Id`).
//!
//! A request never waits for the log: when its response is done, its line
//! is formatted on the request's own thread into that thread's shard of a
//! bounded buffer ([`Shard`]: one per CPU, an uncontended lock, room for
//! about `access_log.buffer` lines in all), and one writer thread takes
//! each shard's bytes every few milliseconds and writes them with one
//! `write` ([`writer`]). A line that finds its shard full is dropped and
//! counted (`sidecache_access_log_dropped_total`). Lines are in order
//! within a shard; lines of different threads can be a few milliseconds
//! out of order (each has its time). A thread, not a task:
//! writes to a pipe whose reader is slow block, and must not block a
//! runtime worker.
//!
//! The settings are read per request from the config snapshot, so a reload
//! turns the log on or off, and changes its format or sampling, at once.
//! A line is written when its response body is done (or dropped: a client
//! that went away), so bytes and duration cover the whole answer: the
//! server's response body keeps the line's [`Tail`].
//!
//! What a logged request pays is kept small (the access log's cost target,
//! `bench/README.md`): one allocation (the boxed [`Line`], its path, query
//! and id inline unless long; freed on the thread that made it), two clock
//! reads, one pass over the request headers, and the line's formatting
//! into its shard: no channel, no per-line wakeup, no cross-thread free.

// std's clock, not tokio's: a line's start becomes wall-clock time next to
// `SystemTime` (`writer::Clock`), on a writer thread outside the runtime.
#![allow(clippy::disallowed_types)]

pub(crate) mod format;
pub(crate) mod writer;

use crate::body::BoxError;
use crate::config::file::{FileLogFormat, FileRequestId};
use crate::config::{AccessLogConfig, Route};
use crate::metrics::Metrics;
use crate::outcome::CacheOutcome;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::Frame;
use prometheus::IntCounter;
use rand::Rng;
use smallvec::SmallVec;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// `reason` label values of `sidecache_access_log_dropped_total`.
pub(crate) mod dropped {
    /// The line's shard was full (the writer cannot keep up with the
    /// output).
    pub(crate) const BUFFER_FULL: &str = "buffer_full";
    /// Writing to stdout failed.
    pub(crate) const WRITE_ERROR: &str = "write_error";
}

/// The process's access log: the shards lines are formatted into, shared
/// by all connections and the writer thread.
pub(crate) struct AccessLog {
    shards: Box<[Padded<Mutex<Shard>>]>,
    /// Bytes one shard holds at most.
    room: usize,
    dropped_full: IntCounter,
    /// The writer is parked (or about to) and waits for a line.
    writer_idle: AtomicBool,
    /// The writer thread, to wake it (none in tests that take the lines).
    writer: OnceLock<std::thread::Thread>,
}

/// A cache line of its own for each shard's lock: threads on different
/// CPUs do not contend for one line.
#[repr(align(128))]
struct Padded<T>(T);

/// One thread's (or a few threads') part of the buffer: formatted lines
/// waiting for the writer, and what formatting needs.
pub(crate) struct Shard {
    buf: Vec<u8>,
    /// Lines in `buf` (to count them if their write fails).
    lines: u64,
    formatter: format::Formatter,
    clock: writer::Clock,
}

/// Bytes of the buffer per line of `access_log.buffer`: about a JSON
/// line of an API request.
pub(crate) const LINE_ROOM: usize = 256;

/// A shard's room at least: a line of the longest path, query and id,
/// every byte escaped, fits.
const MIN_SHARD_ROOM: usize = 16 * 1024;

/// Bytes a line's variable parts take at most once escaped (`\u00XX`).
const MAX_ESCAPE: usize = 6;

/// Bytes of a line besides its path, query, id and route, at most: keys,
/// time, an IPv6 peer, method, numbers.
const FIXED_ROOM: usize = 384;

/// One request's line, filled in as the request goes and formatted into
/// a shard when the response is done. Boxed once per logged request (the
/// response body carries a pointer); what it holds is its own copy,
/// bounded (see [`Text`]).
#[derive(Debug)]
pub(crate) struct Line {
    /// When the request started; its shard turns it into wall-clock time
    /// (one clock read per request saved: see `writer::Clock`).
    pub start: Instant,
    pub peer: SocketAddr,
    pub method: Method,
    pub format: FileLogFormat,
    pub status: u16,
    /// What the pipeline did (the `X-Cache` word) for requests on a cache
    /// route; `None` otherwise.
    pub cache: Option<CacheOutcome>,
    pub route: Option<Arc<Route>>,
    pub duration: Duration,
    pub upstream: Option<Duration>,
    pub bytes: u64,
    pub text: Text,
}

/// Path and query are each cut to this many bytes in a line.
pub(crate) const MAX_TARGET: usize = 1024;

/// Bytes of path, query and id a line holds without a heap allocation of
/// its own: most API paths and a 32-digit id fit.
const INLINE_TEXT: usize = 112;

/// A line's client-sent text (path, the query, the id) in one buffer,
/// one after another: path and query cut at [`MAX_TARGET`] bytes (`…`
/// marks a cut), the id at [`format::MAX_ID`] + 1 (formatting escapes
/// it and marks the cut).
#[derive(Debug, Default)]
pub(crate) struct Text {
    buf: SmallVec<[u8; INLINE_TEXT]>,
    path_end: u16,
    /// `None`: no query logged.
    query_end: Option<u16>,
    id: IdKind,
}

/// What the id part of a [`Text`] is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdKind {
    #[default]
    None,
    /// The trace id of a valid `traceparent` (32 hex digits).
    Trace,
    /// The raw `X-Request-Id` (escaped when formatted).
    Request,
}

impl Text {
    /// `path` and `query` (each cut at [`MAX_TARGET`]) and an id.
    pub(crate) fn new(path: &str, query: Option<&str>, id: Option<(IdKind, &[u8])>) -> Text {
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

    pub(crate) fn path(&self) -> &[u8] {
        &self.buf[..usize::from(self.path_end)]
    }

    pub(crate) fn query(&self) -> Option<&[u8]> {
        let end = usize::from(self.query_end?);
        Some(&self.buf[usize::from(self.path_end)..end])
    }

    /// The id and what it is.
    pub(crate) fn id(&self) -> (IdKind, &[u8]) {
        let from = usize::from(self.query_end.unwrap_or(self.path_end));
        (self.id, &self.buf[from..])
    }
}

impl Line {
    /// Bytes this line takes in a shard at most (see [`MAX_ESCAPE`]).
    fn room(&self) -> usize {
        let route = self.route.as_ref().map_or(0, |r| r.name.len());
        FIXED_ROOM + MAX_ESCAPE * (self.text.buf.len() + route)
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
    /// The log of a running sidecache: room for about `lines` lines, in
    /// one shard per CPU; the writer thread writes to stdout.
    pub(crate) fn start(lines: usize, metrics: &Metrics) -> std::io::Result<Arc<AccessLog>> {
        let shards = std::thread::available_parallelism().map_or(1, usize::from);
        let log = AccessLog::new(shards, lines.saturating_mul(LINE_ROOM) / shards, metrics);
        // A file on stdout's descriptor: the writer writes whole batches,
        // which `Stdout`'s lock and line buffer would only scan again.
        let out: Box<dyn std::io::Write + Send> = {
            use std::os::fd::AsFd;
            match std::io::stdout().as_fd().try_clone_to_owned() {
                Ok(fd) => Box::new(std::fs::File::from(fd)),
                Err(_) => Box::new(std::io::stdout()),
            }
        };
        writer::spawn(&log, out, metrics)?;
        Ok(log)
    }

    /// A log of `shards` shards of `room` bytes each (at least
    /// [`MIN_SHARD_ROOM`]), without a writer: [`writer::spawn`] starts
    /// one, a test takes the lines itself ([`AccessLog::take`]).
    pub(crate) fn new(shards: usize, room: usize, metrics: &Metrics) -> Arc<AccessLog> {
        let room = room.max(MIN_SHARD_ROOM);
        let shards = (0..shards.max(1))
            .map(|_| Padded(Mutex::new(Shard::new(room))))
            .collect();
        Arc::new(AccessLog {
            shards,
            room,
            dropped_full: metrics
                .access_log_dropped
                .with_label_values(&[dropped::BUFFER_FULL]),
            writer_idle: AtomicBool::new(false),
            writer: OnceLock::new(),
        })
    }

    /// Formats `line`, which ended at `end`, into the calling thread's
    /// shard without waiting for the writer; a full shard drops it.
    fn submit(&self, line: &mut Line, end: Instant) {
        let shard = &self.shards[shard_index() % self.shards.len()].0;
        // A panic while formatting leaves at worst a cut line.
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if shard.buf.len() + line.room() > self.room {
            drop(shard);
            self.dropped_full.inc();
            return;
        }
        shard.write(line, end);
        drop(shard);
        // Relaxed: the writer sets it before it looks at the shards, and
        // their locks order that look after or before this line's write.
        if self.writer_idle.load(Ordering::Relaxed)
            && self.writer_idle.swap(false, Ordering::AcqRel)
        {
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
    }

    /// Moves shard `i`'s lines into `into` and how many; `into`, cleared,
    /// becomes the shard's buffer (the writer's spare, as large as the
    /// shard's room, so neither side allocates).
    pub(crate) fn take(&self, i: usize, into: &mut Vec<u8>) -> u64 {
        let mut shard = self.shards[i]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.lines == 0 {
            return 0;
        }
        into.clear();
        std::mem::swap(&mut shard.buf, into);
        std::mem::take(&mut shard.lines)
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn room(&self) -> usize {
        self.room
    }
}

impl Shard {
    fn new(room: usize) -> Shard {
        Shard {
            buf: Vec::with_capacity(room),
            lines: 0,
            formatter: format::Formatter::default(),
            clock: writer::Clock::default(),
        }
    }

    fn write(&mut self, line: &mut Line, end: Instant) {
        let (time, duration) = self.clock.start_and_duration(line.start, end);
        line.duration = duration;
        self.formatter.write_line(line, time, &mut self.buf);
        self.lines += 1;
    }
}

/// The calling thread's shard (modulo the number of shards): threads take
/// numbers in the order they first log, so a runtime's workers get one
/// each.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// What the start of a request decided for its line and its request id.
pub(crate) struct Begun {
    /// `None`: this request is not logged (log off, or not sampled).
    pub pending: Option<Pending>,
    /// The value the response's `X-Request-Id` gets (`request_id: generate`).
    pub request_id: Option<HeaderValue>,
}

/// A line waiting for its response.
pub(crate) struct Pending {
    log: Arc<AccessLog>,
    line: Box<Line>,
}

/// At the start of a request: applies `request_id` (a missing id is
/// generated and added to the request, so forwarding and fills send it
/// upstream) and decides whether this request is logged. Inline: with the
/// log off and ids passed through (the default) this is one branch.
#[inline]
pub(crate) fn begin<B>(
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
pub(crate) fn sampled(sample: f64, draw: impl FnOnce() -> f64) -> bool {
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
    pub(crate) fn respond<B>(
        mut self,
        resp: &Response<B>,
        route: Option<Arc<Route>>,
        cache: Option<CacheOutcome>,
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
        self.log.submit(&mut self.line, Instant::now());
    }
}

/// The access log's part of a response body (kept by the server's body
/// type, so a logged response costs no body wrapper of its own): counts
/// the bytes handed out and writes the line when the body ends or is
/// dropped (a client that went away).
#[derive(Default)]
pub(crate) struct Tail(Option<Pending>);

impl Tail {
    /// After each poll of the body: counts a data frame's bytes, and
    /// writes the line once the body is over (`ended`: the body says it has
    /// nothing more after this frame).
    #[inline]
    pub(crate) fn polled(
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

    /// Every line the log's shards hold, taken out.
    fn taken(log: &AccessLog) -> String {
        let mut all = String::new();
        for i in 0..log.shards() {
            let mut buf = Vec::new();
            log.take(i, &mut buf);
            all.push_str(std::str::from_utf8(&buf).expect("utf-8"));
        }
        all
    }

    /// Logs one request for `path` whose body is never polled (dropping
    /// the tail writes the line).
    fn log_one(log: &Arc<AccessLog>, path: &str) {
        let mut req = Request::get(path).body(()).expect("request");
        let begun = begin(log, &cfg(true, FileRequestId::Pass), &mut req, peer());
        let pending = begun.pending.expect("logged");
        drop(pending.respond(&Response::new(()), None, None, None));
    }

    #[test]
    fn a_full_shard_drops_and_counts_instead_of_waiting() {
        let metrics = Metrics::new();
        let full = metrics
            .access_log_dropped
            .with_label_values(&[dropped::BUFFER_FULL]);
        let log = AccessLog::new(1, MIN_SHARD_ROOM, &metrics);
        let path = format!("/{}", "p".repeat(1000));
        for _ in 0..100 {
            log_one(&log, &path);
        }
        let text = taken(&log);
        let kept = text.lines().count() as u64;
        assert!(text.len() <= log.room(), "{} bytes", text.len());
        assert!(
            kept >= 5 && full.get() >= 50,
            "kept {kept}, dropped {}",
            full.get()
        );
        assert_eq!(kept + full.get(), 100, "every line kept or counted");
        // Taken by the writer: room again.
        log_one(&log, &path);
        assert_eq!(taken(&log).lines().count(), 1);
    }

    #[test]
    fn each_thread_writes_to_its_own_shard() {
        let metrics = Metrics::new();
        let log = AccessLog::new(64, MIN_SHARD_ROOM, &metrics);
        let numbers: Vec<usize> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        log_one(&log, "/a");
                        log_one(&log, "/a");
                        shard_index()
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("thread"))
                .collect()
        });
        assert_ne!(numbers[0], numbers[1], "a number per thread");
        // Both lines of a thread are in its shard (other tests' threads
        // take numbers too, so two may still share one modulo 64).
        let mut lines = 0;
        for i in numbers.iter().map(|n| n % log.shards()) {
            lines += log.take(i, &mut Vec::new());
        }
        assert_eq!(lines, 4);
    }

    #[tokio::test]
    async fn the_line_counts_body_bytes_and_is_written_when_the_body_ends() {
        let metrics = Metrics::new();
        let log = AccessLog::new(1, 0, &metrics);
        for cache in [Some(CacheOutcome::Negative), None] {
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
            assert_eq!(taken(&log), "", "no line before the body is done");
            let got = drain(resp.into_body(), tail).await;
            assert_eq!(&got[..], b"hello world");
            let text = taken(&log);
            let line: serde_json::Value = serde_json::from_str(&text).expect("one json line");
            assert_eq!((&line["status"], &line["bytes"]), (&404.into(), &11.into()));
            assert_eq!(line["path"], "/a/b");
            assert!(line.get("query").is_none(), "query off");
            assert_eq!(line["peer"], "192.0.2.7:4711");
            assert_eq!(line["id"], "4bf92f3577b34da6a3ce929d0e0e4736");
            assert!(line["upstream_ms"].is_null());
            let word = cache.map_or("-", CacheOutcome::as_str);
            assert_eq!(line["cache"], word);
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
        let log = AccessLog::new(1, 0, &metrics);
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
        let log = AccessLog::new(1, 0, &metrics);
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
