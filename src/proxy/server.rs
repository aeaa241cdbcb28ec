//! The client-facing server: accepts connections (HTTP/1.1, and HTTP/2 with
//! prior knowledge), refuses ambiguous framing, and sends each request to
//! the read pipeline or to plain forwarding according to the route table of
//! the config snapshot the request started with.
//!
//! [`accept_until`] is the accept loop with graceful drain that the admin
//! listener shares.

use super::body::Body;
use super::client::UpstreamClient;
use super::forward::forward;
use super::framing::{FramingGuard, FramingState};
use super::headers::check_framing;
use crate::config::{Config, RouteMatch};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use arc_swap::ArcSwap;
use futures_util::FutureExt;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// A client that sends no complete request head within this time is dropped.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a request handler needs; shared by all connections.
pub struct ProxyState {
    /// The live config; each request loads one snapshot and keeps it.
    pub config: Arc<ArcSwap<Config>>,
    pub pipeline: Arc<Pipeline>,
    pub client: UpstreamClient,
    pub metrics: Metrics,
}

/// The connection builder both listeners use: HTTP/1.1 with keep-alive and
/// a header timeout (which needs a timer, or hyper panics), and h2c.
pub fn builder() -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    b.http2().timer(TokioTimer::new());
    b
}

/// Accepts connections until `shutdown` turns true, handing each to
/// `handle` together with the graceful-shutdown tracker; then stops
/// accepting and waits up to `drain` for watched connections to finish.
pub async fn accept_until<H>(
    name: &'static str,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    handle: H,
) where
    H: Fn(TcpStream, SocketAddr, &GracefulShutdown) + Send,
{
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Small responses should not wait for Nagle.
                let _ = stream.set_nodelay(true);
                handle(stream, peer, &graceful);
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    info!(listener = name, connections = graceful.count(), "draining");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            listener = name,
            "connections still open after the drain period; closing them"
        );
    }
}

/// Serves the client-facing listener until `shutdown`.
pub async fn run(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let builder = builder();
    accept_until(
        "proxy",
        listener,
        shutdown,
        drain,
        move |stream, peer, graceful| {
            let (io, framing) = FramingGuard::new(stream);
            let state = state.clone();
            let svc = service_fn(move |req| {
                let (state, framing) = (state.clone(), framing.clone());
                // Boxed: hyper keeps one slot of the service future's size
                // per connection for the connection's lifetime, so an
                // unboxed `handle` future (several KiB) would stay resident
                // in every idle keep-alive connection. Boxed, the slot is a
                // pointer and the request's future is freed when it ends.
                // `map`, not an `async` block around `handle`: the block
                // would keep a second copy of the arguments (~300 bytes) next
                // to `handle`'s future, and the whole is copied into the box.
                let fut: Pin<Box<dyn Future<Output = _> + Send>> =
                    Box::pin(handle(state, framing, req, peer).map(Ok::<_, Infallible>));
                fut
            });
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
            let conn = graceful.watch(conn.into_owned());
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!(%peer, error = %e, "client connection ended with an error");
                }
            });
        },
    )
    .await;
}

/// Per request: framing check, one config snapshot, route decision.
async fn handle(
    state: Arc<ProxyState>,
    framing: Arc<FramingState>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    // Framing first: nothing of an ambiguous request reaches the pipeline
    // or the upstream.
    let ambiguous = framing.next_request_is_ambiguous();
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
            let write_through = Box::pin(state.pipeline.write_through(&cfg, &route, &params));
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
