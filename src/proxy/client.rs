//! The keep-alive client to the upstream service, shared by forwarding and
//! cache fills: a small pool of hyper HTTP/1 connections. Errors are
//! classified here (connect failure vs timeout) so the one error mapping can
//! answer 502 or 504.
//!
//! Why not hyper-util's legacy `Client`: it is built for many hosts and
//! HTTP/2, and per request it hashed its pool key (scheme + authority, byte
//! by byte through SipHash) three times, raced a checkout against a connect
//! and spawned a task to hand the connection back: together a large share of a
//! pass-through's instructions (bench/README.md). sidecache talks HTTP/1.1 to
//! one upstream, so a stack of idle connections does the same job: the most
//! recently used one is reused (LIFO, as hyper-util did), and a connection goes
//! back when its response body has ended.

use crate::body::Body;
use crate::config::UpstreamConfig;
use crate::error::UpstreamError;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

/// Idle pooled connections are dropped after this long; kept short so a
/// service with a short keep-alive (Node's default is 5 s) rarely closes a
/// connection under us.
const POOL_IDLE: Duration = Duration::from_secs(4);

#[derive(Clone)]
pub(crate) struct UpstreamClient {
    pool: Arc<Pool>,
}

struct Pool {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// What `connect` dials: the host without IPv6 brackets, and the port.
    host: String,
    port: u16,
    /// `Host` for a request that has none, as hyper-util set it: the
    /// authority without the default port.
    host_header: HeaderValue,
    connect_timeout: Duration,
    max_idle: usize,
    /// Idle connections, oldest first; each with the time it was returned.
    idle: Mutex<Vec<(SendRequest<Body>, Instant)>>,
}

impl UpstreamClient {
    pub(crate) fn new(cfg: &UpstreamConfig) -> UpstreamClient {
        let authority = &cfg.authority;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        let host_header = if authority.port_u16().is_some_and(|p| p != 80) {
            HeaderValue::from_str(authority.as_str())
        } else {
            HeaderValue::from_str(host)
        }
        // An authority is always a valid header value; this is a fallback
        // that cannot happen rather than a panic.
        .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        let pool = Arc::new(Pool {
            scheme: cfg.scheme.clone(),
            authority: authority.clone(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            host_header,
            connect_timeout: cfg.connect_timeout,
            max_idle: cfg.max_idle_per_host,
            idle: Mutex::new(Vec::new()),
        });
        // Close idle connections after POOL_IDLE even when no request comes
        // to notice. Outside a runtime (never in sidecache) checkout still
        // skips stale ones.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(reap(Arc::downgrade(&pool)));
        }
        UpstreamClient { pool }
    }

    /// The absolute upstream URI for a request's path and query.
    pub(crate) fn uri_for(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        Uri::builder()
            .scheme(self.pool.scheme.clone())
            .authority(self.pool.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| UpstreamError::Other(format!("bad upstream URI: {e}")))
    }

    /// Sends `req` and waits at most `timeout` for the response head. The
    /// URI may be origin-form (`/path?q`) or absolute (from [`Self::uri_for`]
    /// or an HTTP/2 client); the upstream always gets origin-form, and the
    /// upstream's authority as `Host` if `req` has none. The body is not
    /// covered by `timeout`: it streams. Also returns how long the response
    /// head took (one clock for the caller's metrics, the access log's
    /// upstream time and the pool's idle check).
    pub(crate) async fn send(
        &self,
        mut req: Request<Body>,
        timeout: Duration,
    ) -> (Result<Response<UpstreamBody>, UpstreamError>, Duration) {
        origin_form(req.uri_mut());
        if !req.headers().contains_key(header::HOST) {
            req.headers_mut()
                .insert(header::HOST, self.pool.host_header.clone());
        }
        let started = Instant::now();
        let sent = self.pool.clone().send(req, started);
        let result = match tokio::time::timeout(timeout, sent).await {
            Err(_) => Err(UpstreamError::Timeout),
            Ok(result) => result,
        };
        let took = started.elapsed();
        super::timing::record(took);
        (result, took)
    }
}

impl Pool {
    async fn send(
        self: Arc<Pool>,
        mut req: Request<Body>,
        now: Instant,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        loop {
            let (mut conn, reused) = match self.checkout(now) {
                Some(conn) => (conn, true),
                None => {
                    // Boxed, in its own statement: connecting is rare, and
                    // its future (resolver, handshake) would otherwise
                    // enlarge every request's.
                    let connecting = Box::pin(self.connect());
                    (connecting.await?, false)
                }
            };
            match conn.try_send_request(req).await {
                Ok(resp) => {
                    // After a 101 the connection belongs to the tunnel.
                    let keep = resp.status() != StatusCode::SWITCHING_PROTOCOLS;
                    let pool = keep.then_some((conn, self));
                    return Ok(resp.map(|body| UpstreamBody { body, pool }));
                }
                Err(mut e) => match e.take_message() {
                    // A reused connection was closed (the upstream's
                    // keep-alive ran out) before the request was written:
                    // nothing reached the upstream, so try again, as
                    // hyper-util's `retry_canceled_requests` did.
                    Some(unsent) if reused => req = unsent,
                    _ => {
                        let e = e.into_error();
                        let chain = source_chain(&e);
                        return Err(if caused_by::<ClientBodyError>(&e) {
                            UpstreamError::ClientBody(chain)
                        } else {
                            UpstreamError::Other(chain)
                        });
                    }
                },
            }
        }
    }

    /// The most recently returned idle connection that is still open.
    fn checkout(&self, now: Instant) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((conn, since)) = idle.pop() {
            if now.saturating_duration_since(since) > POOL_IDLE {
                // The newest is stale, so all are.
                idle.clear();
                return None;
            }
            // Only ready connections are pooled; not ready any more means
            // the upstream closed it while it was idle.
            if conn.is_ready() {
                return Some(conn);
            }
        }
        None
    }

    fn put(&self, conn: SendRequest<Body>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, UpstreamError> {
        let dial = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, dial).await {
            Err(_) => return Err(UpstreamError::Connect("connect timeout".to_owned())),
            Ok(Err(e)) => return Err(UpstreamError::Connect(format!("tcp connect error: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        // Small requests should not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let (mut conn, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| UpstreamError::Other(source_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = driver.with_upgrades().await {
                debug!(error = %e, "upstream connection ended with an error");
            }
        });
        conn.ready()
            .await
            .map_err(|e| UpstreamError::Connect(source_chain(&e)))?;
        Ok(conn)
    }
}

/// Drops idle connections older than [`POOL_IDLE`] until the client is gone.
async fn reap(pool: Weak<Pool>) {
    loop {
        tokio::time::sleep(POOL_IDLE).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Oldest first: drop the stale prefix.
        let stale = idle.partition_point(|(_, since)| since.elapsed() > POOL_IDLE);
        idle.drain(..stale);
    }
}

/// Makes an absolute URI origin-form (`/path?query`), as an HTTP/1.1 origin
/// server expects; origin-form and `*` are left as they are.
fn origin_form(uri: &mut Uri) {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return;
    }
    *uri = match uri.path_and_query() {
        Some(pq) if pq.as_str() != "/" => Uri::from(pq.clone()),
        _ => Uri::from_static("/"),
    };
}

/// An upstream response body that hands its connection back to the pool
/// once it has ended. A body dropped before its end leaves the connection
/// unusable (hyper closes it), so then it is simply dropped.
pub(crate) struct UpstreamBody {
    body: Incoming,
    pool: Option<(SendRequest<Body>, Arc<Pool>)>,
}

impl UpstreamBody {
    fn release(&mut self) {
        let Some((mut conn, pool)) = self.pool.take() else {
            return;
        };
        // Usually the connection task has already finished the response
        // and waits for the next request. If not yet (or a request body is
        // still being sent), it goes back once it is ready, as hyper-util
        // did, so that the pool only holds connections ready to use.
        if conn.is_ready() {
            pool.put(conn);
        } else if let (false, Ok(rt)) = (conn.is_closed(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                if conn.ready().await.is_ok() {
                    pool.put(conn);
                }
            });
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.release(),
            Poll::Ready(Some(Err(_))) => this.pool = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An empty body (HEAD, 204, 304, `Content-Length: 0`) may be dropped
        // without ever being polled.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}

/// The error of a request body that came from the client: wrapping the
/// client's body errors in it lets [`Pool::send`] tell a request that failed
/// because of the client (malformed chunked framing, a client gone
/// mid-body) from one the upstream failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ClientBodyError(#[source] pub hyper::Error);

/// Whether `E` is somewhere in `e`'s source chain.
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_form_of_absolute_and_relative() {
        for (from, to) in [
            ("http://up:8080/a/b?x=1", "/a/b?x=1"),
            ("http://up:8080", "/"),
            ("http://up:8080/", "/"),
            ("/a?b", "/a?b"),
            ("*", "*"),
        ] {
            let mut uri: Uri = from.parse().unwrap();
            origin_form(&mut uri);
            assert_eq!(uri.to_string(), to, "{from}");
        }
    }
}
