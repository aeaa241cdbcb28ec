//! The client-facing server: accepts connections (HTTP/1.1, and HTTP/2 with
//! prior knowledge), refuses ambiguous framing, and sends each request to
//! the read pipeline or to plain forwarding according to the route table of
//! the config snapshot the request started with.
//!
//! Idle HTTP/1 connections are parked: hyper keeps a read buffer (8-16 KiB),
//! a write buffer (8 KiB) and its connection state for as long as it serves
//! a connection, idle or not, and has no setting to release them. So a
//! connection that has been idle for [`PARK_AFTER`] is ended on hyper's side
//! (the framing guard reads as EOF, see `framing`), and its task then holds
//! only the socket and waits for it to become readable; the next request
//! starts a new hyper connection on the same socket. Keep-alive clients that
//! send their next request sooner never notice.
//!
//! [`listener`] holds the accept loop with graceful drain that the admin
//! listener shares; [`framing`] the connection-level framing guard;
//! [`h2`] HTTP/2 connections and their watch; [`layout`] the threads and
//! runtimes the listener runs on.

pub(crate) mod framing;
mod h2;
pub(crate) mod layout;
pub(crate) mod listener;

use crate::access_log::{self, AccessLog};
use crate::body::Body;
use crate::config::{Config, Route, RouteMatch};
use crate::error::ProxyError;
use crate::invalidation::Invalidator;
use crate::metrics::client_error;
use crate::metrics::Metrics;
use crate::outcome::CacheOutcome;
use crate::pipeline::Pipeline;
use crate::proxy::client::UpstreamClient;
use crate::proxy::forward::forward;
use crate::proxy::headers::{check_framing, check_host};
use crate::proxy::upload::{self, UploadBudget, UploadError};
use arc_swap::ArcSwap;
use bytes::Bytes;
use framing::{FramingGuard, FramingState, HeadTimedOut, SendTimedOut};
use h2::serve_h2;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use listener::{accept_limited, ConnectionLimit, ConnectionSlot, Draining};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

/// An HTTP/1 connection idle this long is parked (see the module doc).
/// Long enough that a busy keep-alive client (its next request within
/// milliseconds) stays with hyper; each parking costs a new hyper
/// connection (two buffers) on the next request (bench/README.md).
const PARK_AFTER: Duration = Duration::from_millis(200);

/// Everything a request handler needs; shared by all connections.
pub(crate) struct ProxyState {
    /// The live config; each request loads one snapshot and keeps it.
    pub config: Arc<ArcSwap<Config>>,
    pub pipeline: Arc<Pipeline>,
    /// Write-through invalidations.
    pub invalidator: Arc<Invalidator>,
    pub client: UpstreamClient,
    pub metrics: Metrics,
    pub access_log: Arc<AccessLog>,
    /// Request bodies held before forwarding, process-wide.
    pub uploads: Arc<UploadBudget>,
}

/// The cap on open client connections (`limits.max_connections`), one
/// for all the client listener's accept loops.
pub(crate) fn connection_limit(
    config: Arc<ArcSwap<Config>>,
    metrics: &Metrics,
) -> Arc<ConnectionLimit> {
    ConnectionLimit::new(
        move || config.load().limits.max_connections,
        metrics.client_connections.clone(),
        metrics.accept_paused.clone(),
    )
}

/// Serves one client-facing listener under `limit` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    limit: Arc<ConnectionLimit>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    accept_limited(
        "proxy",
        listener,
        shutdown,
        drain,
        Some(limit),
        move |stream, peer, draining, slot| {
            tokio::spawn(serve_client(stream, peer, state.clone(), draining, slot));
        },
    )
    .await;
}

/// One client connection, from accept to close. `_slot` is its place under
/// `limits.max_connections`, given back when this ends.
async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    mut draining: Draining,
    _slot: ConnectionSlot,
) {
    // Limits of the config at accept hold for the whole connection.
    let limits = state.config.load().limits;
    // One deadline for the whole first head: the preface sniff and hyper's
    // header read share `header_timeout`.
    let head_deadline = Instant::now() + limits.header_timeout;
    // Boxed here and for HTTP/2 below: a task's future is as large as its
    // largest state, and what a parked connection keeps resident is this
    // task. Kept inline: only the socket, the service and the parked wait.
    let (h2, taken) = match Box::pin(sniff(&stream, head_deadline, &mut draining)).await {
        Ok(sniffed) => sniffed,
        Err(SniffEnd::TimedOut) => {
            count_client_error(&state.metrics, client_error::HEADER_TIMEOUT);
            return;
        }
        Err(SniffEnd::Gone) => return,
    };
    let (mut io, framing) = FramingGuard::new(stream);
    let parked = state.metrics.connections_parked.clone();
    io.replay(taken);
    io.limit_head(limits.max_header_bytes);
    io.limit_target(limits.max_target_bytes);
    io.send_timeout(limits.send_timeout);
    let watched = framing.clone();
    let metrics = state.metrics.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        // Here, not in `handle`: hyper calls the service in request order,
        // and only the answer's body needs the state after this.
        let ambiguous = framing.next_request_is_ambiguous();
        // Counts the request as finished when its body is done, or when
        // hyper drops the handler before it answers (an HTTP/2 stream reset).
        let done = Finished(framing.clone());
        Answering {
            answer: handle(state.clone(), ambiguous, req, peer),
            done: Some(done),
            h2,
        }
    });

    if h2 {
        return Box::pin(serve_h2(
            io, svc, peer, draining, &watched, &limits, &metrics,
        ))
        .await;
    }

    // Parked before hyper's header timer (which runs while hyper waits for
    // the next head) could end an idle keep-alive connection.
    let park_after = PARK_AFTER
        .min(limits.idle_timeout)
        .min(limits.header_timeout / 2);
    io.park_when_idle(park_after);
    let parked_for = limits.idle_timeout.saturating_sub(park_after);
    let mut head_timeout = head_deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let mut conn = (io, svc);
    loop {
        // Boxed: the parked state of this task must not keep room for a
        // hyper connection (and what it takes to run one) next to the
        // socket.
        let session = http1_session(
            conn.0,
            conn.1,
            peer,
            &mut draining,
            head_timeout,
            limits.max_header_bytes,
            &metrics,
        );
        conn = match Box::pin(session).await {
            Some(conn) => conn,
            None => {
                // Answered 414 by the framing guard: counted here, since
                // hyper need not have seen the guard's error (it may have
                // had none of that head yet).
                if watched.target_refused() {
                    count_client_error(&metrics, client_error::TARGET_TOO_LONG);
                }
                return;
            }
        };
        // Parked: hyper's buffers are freed; wait for the next request,
        // whose head then gets the whole header timeout.
        parked.inc();
        let resumed = next_request(conn.0.get_ref(), parked_for, &mut draining).await;
        parked.dec();
        if !resumed {
            return;
        }
        head_timeout = limits.header_timeout;
    }
}

/// One hyper HTTP/1 connection on the client's socket, until it closes
/// (`None`) or parks: then the socket and the service come back for the
/// next one. `header_timeout`: for the first request head.
async fn http1_session<S>(
    mut io: FramingGuard<TcpStream>,
    svc: S,
    peer: SocketAddr,
    draining: &mut Draining,
    header_timeout: Duration,
    max_header_bytes: usize,
    metrics: &Metrics,
) -> Option<(FramingGuard<TcpStream>, S)>
where
    S: hyper::service::HttpService<Incoming, ResBody = ClientBody, Error = Infallible>
        + Unpin
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Off (hyper's default is 30 s once a timer is set): the framing
        // guard keeps the head deadline (`FramingGuard::head_timeout`),
        // without hyper's new timer for every head.
        .header_read_timeout(None)
        // Both: hyper's read buffer stops growing at the limit (its default
        // is ~400 KB, per connection, for as long as a head is unfinished),
        // and a head over it is answered 431 and the connection closed.
        // The buffer also bounds body reads to this size per read.
        .max_buf_size(max_header_bytes.max(8 * 1024))
        .max_header_size(max_header_bytes)
        .keep_alive(true);
    io.head_timeout(header_timeout);
    let mut conn = builder
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    let served = draining
        .serve(Pin::new(&mut conn), |conn| conn.graceful_shutdown())
        .await;
    if let Err(e) = served {
        debug!(%peer, error = %e, "client connection ended with an error");
        let kind = if e.is_timeout() || caused_by::<HeadTimedOut>(&e) {
            Some(client_error::HEADER_TIMEOUT)
        } else if e.is_parse_too_large() {
            Some(client_error::HEADER_TOO_LARGE)
        } else if caused_by::<SendTimedOut>(&e) {
            Some(client_error::SEND_TIMEOUT)
        } else {
            None
        };
        if let Some(kind) = kind {
            count_client_error(metrics, kind);
        }
        return None;
    }
    // `None`: upgraded, the tunnel has the socket.
    let parts = conn.into_parts()?;
    let mut guard = parts.io.into_inner();
    // Not parked: closed by the client or by hyper. Bytes hyper read but did
    // not use (never expected when parked) could not be replayed.
    (guard.take_parked() && parts.read_buf.is_empty()).then_some((guard, parts.service))
}

/// Whether a connection ended because of the framing guard's error `T`
/// (its send or head timeout).
fn caused_by<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // An `io::Error`'s `source` skips the error it wraps: look inside.
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if err.is::<T>() || inner.is_some_and(|inner| inner.is::<T>()) {
            return true;
        }
        cur = err.source();
    }
    false
}

fn count_client_error(metrics: &Metrics, kind: &str) {
    metrics.client_errors.with_label_values(&[kind]).inc();
}

/// Parked: waits, holding nothing but the socket, for the client's next
/// request. False if the client sent nothing within `idle` (the rest of
/// `limits.idle_timeout` after parking) or the listener is draining.
async fn next_request(stream: &TcpStream, idle: Duration, draining: &mut Draining) -> bool {
    tokio::select! {
        readable = stream.readable() => readable.is_ok(),
        _ = tokio::time::sleep(idle) => false,
        _ = draining.started_or_shed() => false,
    }
}

/// How the wait for a connection's first bytes ended without an answer.
enum SniffEnd {
    /// Closed by the client, a socket error, or the listener is draining.
    Gone,
    /// Nothing decisive before the header deadline.
    TimedOut,
}

/// Waits for the client's first bytes: `true` if they are the HTTP/2
/// preface (h2c with prior knowledge), `false` for anything else (HTTP/1),
/// with the bytes it had to take from the socket (to hand to hyper before
/// the socket's). Until then the connection holds nothing but the socket.
///
/// Usually the first packet decides and is peeked, not read, so nothing is
/// taken. A part of the preface cannot be peeked again without spinning:
/// readiness stays set while unread bytes wait. So those bytes are read
/// instead, and each further wait is for new bytes: a client that stalls
/// inside the preface costs one wakeup per packet it sends, and the header
/// deadline ends it.
async fn sniff(
    stream: &TcpStream,
    deadline: Instant,
    draining: &mut Draining,
) -> Result<(bool, Vec<u8>), SniffEnd> {
    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut buf = [0u8; 24];
    let peeked = tokio::select! {
        peeked = stream.peek(&mut buf) => peeked,
        _ = tokio::time::sleep_until(deadline) => return Err(SniffEnd::TimedOut),
        _ = draining.started_or_shed() => return Err(SniffEnd::Gone),
    };
    match peeked {
        Ok(0) | Err(_) => return Err(SniffEnd::Gone),
        Ok(n) if buf[..n] != PREFACE[..n] => return Ok((false, Vec::new())),
        Ok(n) if n == PREFACE.len() => return Ok((true, Vec::new())),
        Ok(_) => {}
    }
    let mut got = 0;
    loop {
        match stream.try_read(&mut buf[got..]) {
            Ok(0) => return Err(SniffEnd::Gone),
            Ok(n) => {
                got += n;
                if buf[..got] != PREFACE[..got] {
                    return Ok((false, buf[..got].to_vec()));
                }
                if got == PREFACE.len() {
                    return Ok((true, buf.to_vec()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(SniffEnd::Gone),
        }
        tokio::select! {
            readable = stream.readable() => {
                if readable.is_err() {
                    return Err(SniffEnd::Gone);
                }
            }
            _ = tokio::time::sleep_until(deadline) => return Err(SniffEnd::TimedOut),
            _ = draining.started_or_shed() => return Err(SniffEnd::Gone),
        }
    }
}

/// Marks its request finished on the connection's framing state when
/// dropped: with the response body once hyper is done with it, or with the
/// handler if hyper drops that first.
struct Finished(Arc<FramingState>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.response_finished();
    }
}

pin_project_lite::pin_project! {
    /// `handle`'s future, its answer wrapped for the client. A named future,
    /// not an `async move` block awaiting `handle`'s: such a block keeps the
    /// captured future and the awaited one side by side (7.4 KiB instead of
    /// 3.7), and every request copied both.
    struct Answering<F> {
        #[pin]
        answer: F,
        done: Option<Finished>,
        h2: bool,
    }
}

impl<F> Future for Answering<F>
where
    F: Future<Output = (Response<Body>, access_log::Tail)>,
{
    type Output = Result<Response<ClientBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (resp, log) = std::task::ready!(this.answer.poll(cx));
        // `None` only when polled after it answered, which hyper never does.
        let Some(done) = this.done.take() else {
            return Poll::Pending;
        };
        let track = *this.h2;
        Poll::Ready(Ok(resp.map(|body| ClientBody {
            body,
            done,
            track,
            waiting: false,
            log,
        })))
    }
}

/// A response body on its way to the client. When hyper drops it (it has
/// encoded all of it), the connection's framing state counts the response
/// as finished, which is how the framing guard knows a connection is idle.
/// On HTTP/2 (`track`) it also reports its polls, for the send timeout.
struct ClientBody {
    body: Body,
    done: Finished,
    track: bool,
    /// Handed hyper a frame and not polled since (tracked bodies only).
    waiting: bool,
    /// The access log's line for this response (empty when not logged).
    log: access_log::Tail,
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if !this.track {
            let polled = Pin::new(&mut this.body).poll_frame(cx);
            this.log.polled(&polled, || this.body.is_end_stream());
            return polled;
        }
        this.done.0.body_polled(std::mem::take(&mut this.waiting));
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            if !this.body.is_end_stream() {
                this.waiting = true;
                this.done.0.body_waiting();
            }
        }
        this.log.polled(&polled, || this.body.is_end_stream());
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        if self.waiting {
            self.done.0.body_dropped_waiting();
        }
    }
}

/// Per request: one config snapshot, the access log's line and the
/// request id around [`answer`]. The answer's future is awaited in place
/// (not boxed) either way; only a logged request runs it in the scope that
/// measures its upstream time, and the line is a pointer and a branch when
/// the log is off.
async fn handle(
    state: Arc<ProxyState>,
    ambiguous: bool,
    mut req: Request<Incoming>,
    peer: SocketAddr,
) -> (Response<Body>, access_log::Tail) {
    let cfg = state.config.load_full();
    let begun = access_log::begin(&state.access_log, &cfg.access_log, &mut req, peer);
    let logged = begun.pending.is_some();
    let mut routed = Routed {
        wanted: logged,
        ..Routed::default()
    };
    // Not logged: the answer itself, without the upstream-time scope. The
    // answer's future is made in each branch: made before, it was moved
    // twice more per request.
    let (mut resp, upstream) = if logged {
        let answered = answer(&state, cfg, ambiguous, req, peer, &mut routed);
        crate::proxy::timing::measured(answered).await
    } else {
        let answered = answer(&state, cfg, ambiguous, req, peer, &mut routed);
        (answered.await, None)
    };
    if let Some(id) = begun.request_id {
        resp.headers_mut()
            .insert(access_log::X_REQUEST_ID.clone(), id);
    }
    let tail = match begun.pending {
        Some(line) => line.respond(&resp, routed.route, routed.cache, upstream),
        None => access_log::Tail::default(),
    };
    (resp, tail)
}

/// Which route a request went to, for its access log line.
#[derive(Default)]
struct Routed {
    /// Only filled in for a request that is logged.
    wanted: bool,
    route: Option<Arc<Route>>,
    /// What the pipeline did, for a read on a cache route (its `X-Cache`).
    cache: Option<CacheOutcome>,
}

impl Routed {
    fn note(&mut self, route: &Arc<Route>) {
        if self.wanted {
            self.route = Some(Arc::clone(route));
        }
    }
}

/// Framing check, route decision, and the answer.
async fn answer(
    state: &ProxyState,
    cfg: Arc<Config>,
    ambiguous: bool,
    req: Request<Incoming>,
    peer: SocketAddr,
    routed: &mut Routed,
) -> Response<Body> {
    // Framing first: nothing of an ambiguous request reaches the pipeline
    // or the upstream.
    let framing = if ambiguous {
        Err(ProxyError::BadRequest(
            "both Content-Length and Transfer-Encoding".to_owned(),
        ))
    } else {
        check_framing(req.headers())
    };
    if let Err(refused) = framing {
        debug!(%peer, reason = %refused, "request framing refused");
        if let ProxyError::NotImplemented(_) = refused {
            count_client_error(&state.metrics, client_error::TRANSFER_CODING);
        }
        let mut resp = refused.to_response();
        if req.version() < Version::HTTP_2 {
            // The body boundary is unknown (or the body is left unread):
            // the connection cannot be reused.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }
    if let Err(why) = check_host(req.version(), req.headers(), req.uri()) {
        debug!(%peer, reason = why, "request Host refused");
        count_client_error(&state.metrics, client_error::BAD_HOST);
        return ProxyError::BadRequest(why.to_owned()).to_response();
    }

    // Over the limit before hyper's head limit (or on HTTP/2): refused
    // here. A request line still growing past it is the framing guard's.
    if target_len(req.uri()) > cfg.limits.max_target_bytes {
        count_client_error(&state.metrics, client_error::TARGET_TOO_LONG);
        return ProxyError::UriTooLong.to_response();
    }

    // A reverse proxy for one service is not a forward proxy: no tunnels
    // to arbitrary hosts.
    if req.method() == Method::CONNECT {
        let mut resp = ProxyError::BadRequest("CONNECT is not supported".to_owned()).to_response();
        *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return resp;
    }

    // Matched on the path's normal form; the request itself, forwarded
    // below, keeps the path exactly as the client sent it. The URI clone
    // (it shares the request's bytes) lives until the answer is built:
    // without it a pass-through costs more, all of it allocator work under
    // hyper's read buffer (bench/README.md), so it stays although classify
    // needs no borrow.
    let uri = req.uri().clone();
    let invalidate = match cfg.routes.classify(req.method(), uri.path()) {
        RouteMatch::Read(route, params) => {
            routed.note(&route);
            // A fresh near-cache hit is answered here, without a future.
            let early = match state.pipeline.try_hit(&cfg, &route, &params, &req) {
                Ok((status, resp)) => {
                    routed.cache = Some(status);
                    return resp;
                }
                Err(early) => early,
            };
            // Boxed: a future holds room for its largest branch, and this
            // whole future is moved into a box per request (see `run`), so
            // a read pipeline held inline would make every forwarded request
            // copy it too.
            let pipeline = &state.pipeline;
            let serve = Box::pin(pipeline.serve(cfg.clone(), route, params, req, peer, early));
            let (status, resp) = serve.await;
            routed.cache = Some(status);
            return resp;
        }
        RouteMatch::BadParam(route, param) => {
            routed.note(&route);
            state
                .metrics
                .requests
                .with_label_values(&[route.name.as_str(), "bad_request"])
                .inc();
            return ProxyError::BadRequest(format!(
                "path parameter {param:?} does not match its pattern"
            ))
            .to_response();
        }
        RouteMatch::Write(route, params) if route.invalidate_on_write => {
            routed.note(&route);
            Some((route, params))
        }
        RouteMatch::Write(..) | RouteMatch::Forward => None,
    };
    count_forward(state);
    let http1 = req.version() < Version::HTTP_2;
    let (parts, body) = req.into_parts();
    let stream = cfg.uploads.streams(parts.uri.path());
    let body = match upload::hold(&state.uploads, &cfg.uploads, body, stream).await {
        Ok(body) => body,
        Err(refused) => return refused_upload(state, refused, http1),
    };
    // One call site: a future keeps separate room for every `forward` it
    // awaits (two of them doubled this future's size).
    let resp = forward(
        &state.client,
        Request::from_parts(parts, body),
        peer,
        cfg.upstream.timeout,
        &state.metrics,
    )
    .await;
    if let Some((route, params)) = invalidate {
        if resp.status().is_success() {
            // Before the client sees the answer, so its next read is fresh.
            // Boxed in its own statement: a temporary in the statement of an
            // `.await` stays in the future's layout (~3.8 KiB here).
            let write_through = Box::pin(state.invalidator.write_through(&cfg, &route, params));
            write_through.await;
        }
    }
    resp
}

/// The length of a request target as the client sent it: the path and
/// query, with the scheme and authority of an absolute URI.
fn target_len(uri: &http::Uri) -> usize {
    let pq = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    match (uri.scheme(), uri.authority()) {
        (Some(scheme), Some(authority)) => {
            scheme.as_str().len() + 3 + authority.as_str().len() + pq
        }
        (None, Some(authority)) => authority.as_str().len() + pq,
        _ => pq,
    }
}

/// The answer to a forwarded request whose body was not held: 503 (the
/// budget is spent), 408 (too slow) or 400 (the body failed). The service
/// was not called; on HTTP/1 the rest of the body is unread, so the
/// connection closes.
fn refused_upload(state: &ProxyState, refused: UploadError, http1: bool) -> Response<Body> {
    debug!(reason = %refused, "request body not forwarded");
    let error = match refused {
        UploadError::Budget => {
            state
                .metrics
                .overloaded
                .with_label_values(&[crate::metrics::FORWARD_ROUTE, "request_buffer"])
                .inc();
            ProxyError::Overloaded(crate::error::REQUEST_BUFFER_SPENT)
        }
        UploadError::TimedOut => {
            count_client_error(&state.metrics, client_error::BODY_TIMEOUT);
            ProxyError::BodyTimeout
        }
        UploadError::Body(e) => {
            count_client_error(&state.metrics, client_error::BAD_BODY);
            ProxyError::Upstream(crate::error::UpstreamError::ClientBody(e.to_string()))
        }
    };
    let mut resp = error.to_response();
    if http1 {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

fn count_forward(state: &ProxyState) {
    state.metrics.forward.request(&state.metrics).inc();
}
