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
//! listener shares; [`framing`] the connection-level framing guard.

pub mod framing;
pub mod listener;

use crate::body::Body;
use crate::config::{Config, RouteMatch};
use crate::error::ProxyError;
use crate::invalidation::Invalidator;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::proxy::client::UpstreamClient;
use crate::proxy::forward::forward;
use crate::proxy::headers::check_framing;
use arc_swap::ArcSwap;
use bytes::Bytes;
use framing::{FramingGuard, FramingState};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use listener::{accept_until, Draining, HEADER_READ_TIMEOUT};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::debug;

/// An HTTP/1 connection idle this long is parked (see the module doc).
/// Long enough that a busy keep-alive client (its next request within
/// milliseconds) stays with hyper; each parking costs a new hyper
/// connection (two buffers, a few thousand instructions) on the next request.
const PARK_AFTER: Duration = Duration::from_millis(200);

/// Everything a request handler needs; shared by all connections.
pub struct ProxyState {
    /// The live config; each request loads one snapshot and keeps it.
    pub config: Arc<ArcSwap<Config>>,
    pub pipeline: Arc<Pipeline>,
    /// Write-through invalidations.
    pub invalidator: Arc<Invalidator>,
    pub client: UpstreamClient,
    pub metrics: Metrics,
}

/// Serves the client-facing listener until `shutdown`.
pub async fn run(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    accept_until(
        "proxy",
        listener,
        shutdown,
        drain,
        move |stream, peer, draining| {
            tokio::spawn(serve_client(stream, peer, state.clone(), draining));
        },
    )
    .await;
}

/// One client connection, from accept to close.
async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    mut draining: Draining,
) {
    // Boxed here and for HTTP/2 below: a task's future is as large as its
    // largest state, and what a parked connection keeps resident is this
    // task. Kept inline: only the socket, the service and the parked wait.
    let h2 = match Box::pin(first_bytes_are_h2(&stream, &mut draining)).await {
        Some(h2) => h2,
        None => return,
    };
    let (mut io, framing) = FramingGuard::new(stream);
    let parked = state.metrics.connections_parked.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        // Here, not in `handle`: hyper calls the service in request order,
        // and only the answer's body needs the state after this.
        let ambiguous = framing.next_request_is_ambiguous();
        let framing = framing.clone();
        let answer = handle(state.clone(), ambiguous, req, peer);
        async move { Ok::<_, Infallible>(answer.await.map(|body| ClientBody { body, framing })) }
    });

    if h2 {
        return Box::pin(serve_h2(io, svc, peer, draining)).await;
    }

    io.park_when_idle(PARK_AFTER);
    let mut conn = (io, svc);
    loop {
        // Boxed: the parked state of this task must not keep room for a
        // hyper connection (and what it takes to run one) next to the
        // socket.
        conn = match Box::pin(http1_session(conn.0, conn.1, peer, &mut draining)).await {
            Some(conn) => conn,
            None => return,
        };
        // Parked: hyper's buffers are freed; wait for the next request.
        parked.inc();
        let resumed = next_request(conn.0.get_ref(), &mut draining).await;
        parked.dec();
        if !resumed {
            return;
        }
    }
}

/// An HTTP/2 (h2c) client connection, never parked.
async fn serve_h2<S>(io: FramingGuard<TcpStream>, svc: S, peer: SocketAddr, mut draining: Draining)
where
    S: hyper::service::HttpService<Incoming, ResBody = ClientBody, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    let mut conn = std::pin::pin!(builder.serve_connection(TokioIo::new(io), svc));
    let served = draining
        .serve(conn.as_mut(), |conn| conn.graceful_shutdown())
        .await;
    if let Err(e) = served {
        debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// One hyper HTTP/1 connection on the client's socket, until it closes
/// (`None`) or parks: then the socket and the service come back for the
/// next one.
async fn http1_session<S>(
    io: FramingGuard<TcpStream>,
    svc: S,
    peer: SocketAddr,
    draining: &mut Draining,
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
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let mut conn = builder
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    let served = draining
        .serve(Pin::new(&mut conn), |conn| conn.graceful_shutdown())
        .await;
    if let Err(e) = served {
        debug!(%peer, error = %e, "client connection ended with an error");
        return None;
    }
    // `None`: upgraded, the tunnel has the socket.
    let parts = conn.into_parts()?;
    let mut guard = parts.io.into_inner();
    // Not parked: closed by the client or by hyper. Bytes hyper read but did
    // not use (never expected when parked) could not be replayed.
    (guard.take_parked() && parts.read_buf.is_empty()).then_some((guard, parts.service))
}

/// Parked: waits, holding nothing but the socket, for the client's next
/// request. False if the client sent nothing within HEADER_READ_TIMEOUT (an
/// idle keep-alive connection is closed then, as hyper's header timer did)
/// or the listener is draining.
async fn next_request(stream: &TcpStream, draining: &mut Draining) -> bool {
    tokio::select! {
        readable = stream.readable() => readable.is_ok(),
        _ = tokio::time::sleep(HEADER_READ_TIMEOUT) => false,
        _ = draining.started() => false,
    }
}

/// Waits for the client's first bytes: `Some(true)` if they are the HTTP/2
/// preface (h2c with prior knowledge), `Some(false)` for anything else
/// (HTTP/1), `None` if the client closed, sent nothing within
/// HEADER_READ_TIMEOUT, or the listener is draining. Peeked, not read: the
/// bytes stay for hyper. Until then the connection holds nothing but the
/// socket.
async fn first_bytes_are_h2(stream: &TcpStream, draining: &mut Draining) -> Option<bool> {
    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let deadline = tokio::time::sleep(HEADER_READ_TIMEOUT);
    tokio::pin!(deadline);
    let mut buf = [0u8; 24];
    loop {
        let peeked = tokio::select! {
            peeked = stream.peek(&mut buf) => peeked,
            _ = &mut deadline => return None,
            _ = draining.started() => return None,
        };
        match peeked {
            Ok(0) | Err(_) => return None,
            Ok(n) if buf[..n] != PREFACE[..n] => return Some(false),
            Ok(n) if n == PREFACE.len() => return Some(true),
            // A part of the preface: peek returns at once while those bytes
            // wait, so wait a little for the rest (rare: it is one packet).
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// A response body on its way to the client. When hyper drops it (it has
/// encoded all of it), the connection's framing state counts the response
/// as finished, which is how the framing guard knows a connection is idle.
struct ClientBody {
    body: Body,
    framing: Arc<FramingState>,
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
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
        self.framing.response_finished();
    }
}

/// Per request: framing check, one config snapshot, route decision.
async fn handle(
    state: Arc<ProxyState>,
    ambiguous: bool,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    // Framing first: nothing of an ambiguous request reaches the pipeline
    // or the upstream.
    if let Some(why) = ambiguous
        .then(|| "both Content-Length and Transfer-Encoding".to_owned())
        .or_else(|| check_framing(req.headers()).err())
    {
        debug!(%peer, reason = %why, "ambiguous framing refused");
        let mut resp = ProxyError::BadRequest(why).to_response();
        if req.version() < Version::HTTP_2 {
            // The body boundary is unknown: the connection cannot be reused.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }

    // A reverse proxy for one service is not a forward proxy: no tunnels
    // to arbitrary hosts.
    if req.method() == Method::CONNECT {
        let mut resp = ProxyError::BadRequest("CONNECT is not supported".to_owned()).to_response();
        *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return resp;
    }

    let cfg = state.config.load_full();
    // The path outlives `req` (moved on below): a clone of the URI shares
    // its bytes, where `to_owned` would copy them.
    let uri = req.uri().clone();
    let invalidate = match cfg.routes.classify(req.method(), uri.path()) {
        RouteMatch::Read(route, params) => {
            let params = params.into_iter().map(str::to_owned).collect();
            // Boxed: a future holds room for its largest branch, and this
            // whole future is moved into a box per request (see `run`), so
            // a read pipeline held inline would make every forwarded request
            // copy it too.
            let serve = Box::pin(state.pipeline.serve(cfg.clone(), route, params, req, peer));
            return serve.await;
        }
        RouteMatch::BadParam(route, param) => {
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
            let params: Vec<String> = params.into_iter().map(str::to_owned).collect();
            Some((route, params))
        }
        RouteMatch::Write(..) | RouteMatch::Forward => None,
    };
    count_forward(&state);
    // One call site: a future keeps separate room for every `forward` it
    // awaits (two of them doubled this future's size).
    let resp = forward(
        &state.client,
        req,
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

fn count_forward(state: &ProxyState) {
    state
        .metrics
        .requests
        .with_label_values(&["-", "forward"])
        .inc();
}
