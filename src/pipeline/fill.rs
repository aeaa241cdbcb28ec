//! Stage 7: fetch from upstream for a cache fill. Builds the fill request
//! from the cache key (never a copy of the client's request), takes a fill
//! permit within the route's budget (waiting at most `fill.queue_timeout`
//! in a bounded queue, then 503), and reads the body up to `max_body`
//! ([`read_body`]; a larger body is streamed through uncached), or streams it
//! to the fill's waiters as it arrives ([`stream_body`], `tee`).
//!
//! What a fill sends: `GET`, the matched path in its normal form (the
//! template with the key's params), the normalized query the key
//! used, `Host` = the route's `host` or the upstream's authority, the
//! client's values of the route's `vary` headers and, with
//! `vary_from_origin`, of the names learned from the object's answers
//! (both are in the key), and
//! the client's values of `fill_headers` (default `traceparent`,
//! `tracestate`, `x-request-id`: tracing only, by the owner's promise they
//! never change the answer). Nothing else: no `X-Forwarded-*` or
//! `Forwarded` (they describe one client, and the answer is for everyone
//! with the key), no `Origin`, `User-Agent`, `Accept-Language`, cookies,
//! conditionals or ranges. So two requests with the same key send the same
//! fill, byte for byte, apart from the tracing headers: whatever else a
//! client sends cannot shape an answer that others will be served (cache
//! poisoning). Forwarded and BYPASS requests are untouched by this. The one
//! addition is a conditional fill's `If-None-Match` / `If-Modified-Since`,
//! taken from the stored entry, never from the client (`revalidate`).

use super::tee::TeeWriter;
use crate::body::{self, Body};
use crate::config::{Config, FillConfig, Route};
use crate::error::{ProxyError, UpstreamError};
use crate::metrics::{status_class, Metrics};
use crate::proxy::client::{UpstreamBody, UpstreamClient};
use crate::proxy::headers::strip_hop_by_hop;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use prometheus::IntGauge;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A fill request's inputs, detached from the client request so the fill can
/// run in its own task and outlive a client that goes away.
#[derive(Debug, Clone)]
pub(crate) struct FillRequest {
    pub path_and_query: String,
    pub headers: HeaderMap,
}

/// Builds the fill request from the key's parts: `path` is the normal form
/// of the request path that matched the route ([`Route::fill_path`]: its
/// params are the identity), `query` the normalized query of the key,
/// `learned` the names the key has from the object's answers
/// (`vary_from_origin`). Only `vary`, `learned` and `fill_headers` values
/// are taken from `client_headers` (see the module doc).
pub(crate) fn fill_request(
    route: &Route,
    path: &str,
    query: &str,
    learned: &[HeaderName],
    client_headers: &HeaderMap,
) -> FillRequest {
    let mut headers =
        HeaderMap::with_capacity(route.vary.len() + learned.len() + route.fill_headers.len() + 1);
    let carried = route.vary.iter().chain(learned);
    // A learned name may also be a `fill_headers` one: copied once.
    let tracing = route.fill_headers.iter().filter(|n| !learned.contains(n));
    for name in carried.chain(tracing) {
        for value in client_headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    // `vary` may name one (validation refuses them in `fill_headers`).
    strip_hop_by_hop(&mut headers);
    // Without it the upstream client sets the upstream's authority.
    if let Some(host) = &route.host {
        headers.insert(header::HOST, host.clone());
    }
    let path_and_query = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    };
    FillRequest {
        path_and_query,
        headers,
    }
}

/// Fill permits: `fill.max_concurrency` for the process (resizable on
/// reload), and within it at most `Route::fill_budget` per route, so a
/// flood of distinct misses on one route cannot take every permit and
/// starve the others. A fill that finds no permit waits for one in a short
/// bounded queue (`fill.queue_timeout`, at most `fill.max_queued` waiting):
/// a burst of distinct cold keys is ordinary traffic and is served a moment
/// later, while a sustained overload still gets its 503 within the timeout,
/// or at once when the queue is full.
pub(crate) struct FillPermits {
    sem: Arc<Semaphore>,
    size: AtomicUsize,
    /// Fills in flight per route name (bounded by the routes configured).
    per_route: Mutex<HashMap<String, Arc<RouteBudget>>>,
    queue: Mutex<QueueLimits>,
    queued: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
struct QueueLimits {
    timeout: Duration,
    max: usize,
}

/// A route's fills in flight, and a wake-up for fills queued on its budget.
#[derive(Default)]
struct RouteBudget {
    inflight: AtomicUsize,
    freed: Notify,
}

/// One fill's permit; both counts return on drop, on every path.
pub(crate) struct FillPermit {
    _global: OwnedSemaphorePermit,
    _route: RouteSlot,
}

struct RouteSlot(Arc<RouteBudget>);

impl Drop for RouteSlot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// Counts a fill in the queue for as long as it waits (gauge included).
struct Queued<'a>(&'a AtomicUsize, &'a IntGauge);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        self.1.dec();
    }
}

impl FillPermits {
    pub(crate) fn new(cfg: &FillConfig) -> FillPermits {
        FillPermits {
            sem: Arc::new(Semaphore::new(cfg.max_concurrency)),
            size: AtomicUsize::new(cfg.max_concurrency),
            per_route: Mutex::new(HashMap::new()),
            queue: Mutex::new(QueueLimits {
                timeout: cfg.queue_timeout,
                max: cfg.max_queued,
            }),
            queued: AtomicUsize::new(0),
        }
    }

    /// A permit within `route`'s budget: at once if one is free, else after
    /// waiting in the queue; 503 (`Overloaded`) when the queue is full or
    /// the wait runs out.
    pub(crate) async fn acquire(
        &self,
        route: &Route,
        metrics: &Metrics,
    ) -> Result<FillPermit, ProxyError> {
        let budget = self.budget(route);
        if let Some(permit) = self.try_now(&budget, route.fill_budget) {
            return Ok(permit);
        }
        let limits = *self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if limits.timeout.is_zero() {
            return Err(ProxyError::Overloaded("fill permits exhausted"));
        }
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limits.max).then_some(n + 1)
            });
        if admitted.is_err() {
            metrics.fill_queue_rejected.inc();
            return Err(ProxyError::Overloaded("fill queue full"));
        }
        metrics.fill_queued.inc();
        let _queued = Queued(&self.queued, &metrics.fill_queued);
        let started = Instant::now();
        let got = tokio::time::timeout(limits.timeout, self.wait(&budget, route.fill_budget))
            .await
            .ok()
            .flatten();
        let outcome = if got.is_some() { "acquired" } else { "timeout" };
        metrics
            .fill_queue_wait
            .with_label_values(&[outcome])
            .observe(started.elapsed().as_secs_f64());
        got.ok_or(ProxyError::Overloaded("fill permits exhausted"))
    }

    fn budget(&self, route: &Route) -> Arc<RouteBudget> {
        let mut map = self.per_route.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&route.name) {
            Some(b) => Arc::clone(b),
            None => Arc::clone(map.entry(route.name.clone()).or_default()),
        }
    }

    fn take_slot(budget: &Arc<RouteBudget>, limit: usize) -> Option<RouteSlot> {
        budget
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| RouteSlot(Arc::clone(budget)))
    }

    fn try_now(&self, budget: &Arc<RouteBudget>, limit: usize) -> Option<FillPermit> {
        // The slot returns on drop, also if the pool below is full.
        let slot = Self::take_slot(budget, limit)?;
        let global = self.sem.clone().try_acquire_owned().ok()?;
        Some(FillPermit {
            _global: global,
            _route: slot,
        })
    }

    /// Waits for a route slot, then for a pool permit (the semaphore queues
    /// fairly, first come first served).
    async fn wait(&self, budget: &Arc<RouteBudget>, limit: usize) -> Option<FillPermit> {
        let slot = loop {
            // Registered before the check, so a slot freed in between wakes us.
            let freed = budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = Self::take_slot(budget, limit) {
                break slot;
            }
            freed.await;
        };
        // Never closed, so this waits for a permit.
        let global = self.sem.clone().acquire_owned().await.ok()?;
        Some(FillPermit {
            _global: global,
            _route: slot,
        })
    }

    /// Applies a reloaded `fill:`: grows or shrinks the pool (shrinking takes
    /// effect as permits return) and sets the queue's limits.
    pub(crate) fn reconfigure(&self, cfg: &FillConfig) {
        *self.queue.lock().unwrap_or_else(|p| p.into_inner()) = QueueLimits {
            timeout: cfg.queue_timeout,
            max: cfg.max_queued,
        };
        let n = cfg.max_concurrency;
        let old = self.size.swap(n, Ordering::SeqCst);
        if n > old {
            self.sem.add_permits(n - old);
        } else if n < old {
            let sem = self.sem.clone();
            let shrink = (old - n) as u32;
            tokio::spawn(async move {
                if let Ok(p) = sem.acquire_many(shrink).await {
                    p.forget();
                }
            });
        }
    }
}

/// `sidecache_fill_inflight{route}` held up while a fill's upstream call
/// runs; the drop brings it down on every path (error, panic, cancel).
pub(crate) struct Inflight(prometheus::IntGauge);

impl Inflight {
    pub(crate) fn enter(gauge: prometheus::IntGauge) -> Inflight {
        gauge.inc();
        Inflight(gauge)
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What upstream answered, for the publish stage.
pub(crate) enum Fetched {
    /// The whole body fitted in `max_body`.
    Buffered {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// Too large to cache: the response streams through to one client.
    Streamed(Response<Body>),
}

/// The head of upstream's answer to a fill, its body not read yet.
pub(crate) struct Head {
    pub parts: http::response::Parts,
    body: UpstreamBody,
    /// The body's first data, once [`read_first`] read it.
    first: Option<Bytes>,
    /// The fill's deadline for the body (`upstream.timeout` from the call).
    deadline: Instant,
}

impl Head {
    /// The origin's `Content-Length`, if it sent one.
    pub(crate) fn length(&self) -> Option<u64> {
        self.parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    }
}

/// Calls upstream for a fill and reads the body up to `fill.max_body`. The
/// permit must already be held by the caller.
pub(crate) async fn fetch(
    client: &UpstreamClient,
    cfg: &Config,
    route: &Route,
    fill: &FillRequest,
    metrics: &Metrics,
) -> Result<Fetched, ProxyError> {
    let head = fetch_head(client, cfg, route, fill, metrics).await?;
    read_body(head, cfg.fill.max_body).await
}

/// Calls upstream for a fill, up to the head of its answer.
pub(crate) async fn fetch_head(
    client: &UpstreamClient,
    cfg: &Config,
    route: &Route,
    fill: &FillRequest,
    metrics: &Metrics,
) -> Result<Head, ProxyError> {
    let uri = client.uri_for(&fill.path_and_query)?;
    let mut req = Request::new(body::empty());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = uri;
    *req.headers_mut() = fill.headers.clone();

    let deadline = Instant::now() + cfg.upstream.timeout;
    let (resp, took) = client.send(req, cfg.upstream.timeout).await;
    metrics
        .upstream_duration
        .with_label_values(&[&route.name])
        .observe(took.as_secs_f64());
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            metrics
                .upstream_requests
                .with_label_values(&[&route.name, "error"])
                .inc();
            metrics.upstream_errors.with_label_values(&[e.kind()]).inc();
            return Err(e.into());
        }
    };
    metrics
        .upstream_requests
        .with_label_values(&[&route.name, status_class(resp.status().as_u16())])
        .inc();

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Head {
        parts,
        body,
        first: None,
        deadline,
    })
}

/// Reads the first data of `head`'s body (within the fill's deadline);
/// true if that was all of it (the origin declared its length and sent it
/// with the head, as small answers come).
pub(crate) async fn read_first(head: &mut Head) -> Result<bool, ProxyError> {
    loop {
        let frame = match tokio::time::timeout_at(head.deadline, head.body.frame()).await {
            Err(_) => return Err(UpstreamError::Timeout.into()),
            Ok(None) => return Ok(true),
            Ok(Some(Err(e))) => return Err(UpstreamError::Other(e.to_string()).into()),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            head.first = Some(data);
            return Ok(head.body.is_end_stream());
        }
    }
}

/// Reads a fill's body until it ends or passes `max_body`, within the
/// fill's deadline; past the limit, the rest streams after what was read.
pub(crate) async fn read_body(head: Head, max_body: u64) -> Result<Fetched, ProxyError> {
    if head.length().is_some_and(|n| n > max_body) && head.first.is_none() {
        let Head { parts, body, .. } = head;
        return Ok(Fetched::Streamed(Response::from_parts(
            parts,
            body::boxed(body),
        )));
    }
    let Head {
        mut parts,
        body,
        mut first,
        deadline,
    } = head;
    let mut stream = BodyStream::new(body);
    let mut buf = BytesMut::new();
    loop {
        let data = match first.take() {
            Some(data) => data,
            None => match next_data(&mut stream, deadline).await? {
                Some(data) => data,
                None => break,
            },
        };
        if (buf.len() + data.len()) as u64 > max_body {
            let head = futures_util::stream::iter([
                Ok(http_body::Frame::data(buf.freeze())),
                Ok(http_body::Frame::data(data)),
            ]);
            let rest = stream.map(|r| r.map_err(Into::into));
            let body = BodyExt::boxed(StreamBody::new(head.chain(rest)));
            parts.headers.remove(header::CONTENT_LENGTH);
            return Ok(Fetched::Streamed(Response::from_parts(parts, body)));
        }
        buf.extend_from_slice(&data);
    }
    Ok(Fetched::Buffered {
        status: parts.status,
        headers: parts.headers,
        body: buf.freeze(),
    })
}

/// The next data frame of a fill's body within `deadline` (trailers are
/// not cached); `None` at its end.
async fn next_data(
    stream: &mut BodyStream<UpstreamBody>,
    deadline: Instant,
) -> Result<Option<Bytes>, ProxyError> {
    loop {
        let frame = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Err(UpstreamError::Timeout.into()),
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(UpstreamError::Other(e.to_string()).into()),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
}

/// How [`stream_body`] ended.
pub(crate) enum Teed {
    /// The whole body, within `max_body`, as one buffered answer.
    Whole(Fetched),
    /// Past `max_body`: the rest is for [`stream_tail`].
    TooLarge(BodyStream<UpstreamBody>),
}

/// Reads a fill's body into `writer` as it arrives (the waiters read it
/// from there), within the fill's deadline, until it ends or passes
/// `max_body`. An error or an early end fails the writer: every waiter's
/// body ends with an error.
pub(crate) async fn stream_body(
    head: Head,
    writer: &TeeWriter,
    max_body: u64,
) -> Result<Teed, ProxyError> {
    let Head {
        parts,
        body,
        first,
        deadline,
    } = head;
    let mut stream = BodyStream::new(body);
    if let Some(first) = first {
        writer.push(first);
    }
    if head_too_large(&parts, max_body) || writer.written() > max_body {
        return Ok(Teed::TooLarge(stream));
    }
    loop {
        let data = match next_data(&mut stream, deadline).await {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(e) => {
                writer.fail();
                return Err(e);
            }
        };
        writer.push(data);
        if writer.written() > max_body {
            return Ok(Teed::TooLarge(stream));
        }
    }
    let body = writer.concat();
    writer.complete(Some(body.clone()));
    Ok(Teed::Whole(Fetched::Buffered {
        status: parts.status,
        headers: parts.headers,
        body,
    }))
}

fn head_too_large(parts: &http::response::Parts, max_body: u64) -> bool {
    parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > max_body)
}

/// The rest of a body past `max_body` (not stored), into `writer`, without
/// the fill's deadline or permit, as a too-large answer streamed to one
/// client always was. Stops early once no reader is left and none can
/// start. True: the body ended as the origin sent it.
pub(crate) async fn stream_tail(mut stream: BodyStream<UpstreamBody>, writer: &TeeWriter) -> bool {
    let tee = Arc::clone(writer.tee());
    loop {
        let idle = tee.past_window();
        tokio::select! {
            frame = stream.next() => match frame {
                None => {
                    writer.complete(None);
                    return true;
                }
                Some(Err(_)) => {
                    writer.fail();
                    return false;
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        writer.push(data);
                    }
                }
            },
            () = tee.idle(), if idle => {
                writer.fail();
                return false;
            }
        }
    }
}
