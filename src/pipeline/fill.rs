//! Stage 7: fetch from upstream for a cache fill. Builds the fill request
//! (only headers that cannot change the content behind the key's back),
//! takes a fill permit with try-acquire (full -> 503 at once), and reads the
//! body up to `max_body`; a larger body is streamed through uncached.

use crate::body::{self, Body};
use crate::config::{Config, Route};
use crate::error::{ProxyError, UpstreamError};
use crate::metrics::{status_class, Metrics};
use crate::proxy::client::UpstreamClient;
use crate::proxy::headers::{append_forwarded, strip_hop_by_hop};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Headers a fill never carries unless the route varies on them: they could
/// make the upstream answer differently for everyone sharing the key
/// (cache poisoning), or answer 304/206 which the key cannot represent.
const NEVER_ON_FILL: &[&str] = &[
    "x-forwarded-host",
    "x-forwarded-server",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "forwarded",
    "if-none-match",
    "if-modified-since",
    "if-match",
    "if-unmodified-since",
    "if-range",
    "range",
    // Without `Accept-Encoding` in `vary`, one client's gzip must not be
    // served to a client that cannot decode it: ask for identity.
    "accept-encoding",
];

/// A fill request's inputs, detached from the client request so the fill can
/// run in its own task and outlive a client that goes away.
#[derive(Debug, Clone)]
pub struct FillRequest {
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub peer: SocketAddr,
}

/// Builds the fill request inputs from the client's request head.
pub fn fill_request(
    route: &Route,
    path: &str,
    query: &str,
    uri_authority: Option<&http::uri::Authority>,
    client_headers: &HeaderMap,
    peer: SocketAddr,
) -> FillRequest {
    let mut headers = client_headers.clone();
    strip_hop_by_hop(&mut headers);
    for name in NEVER_ON_FILL {
        let name = HeaderName::from_static(name);
        if !route.varies_on(&name) {
            headers.remove(&name);
        }
    }
    headers.remove(header::CONTENT_LENGTH);
    if !headers.contains_key(header::HOST) {
        // HTTP/2 clients send `:authority` instead of Host.
        if let Some(v) = uri_authority.and_then(|a| header::HeaderValue::from_str(a.as_str()).ok())
        {
            headers.insert(header::HOST, v);
        }
    }
    append_forwarded(&mut headers, peer, "http");
    let path_and_query = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    };
    FillRequest {
        path_and_query,
        headers,
        peer,
    }
}

/// Fill permits (`fill.max_concurrency`), resizable on reload.
pub struct FillPermits {
    sem: Arc<Semaphore>,
    size: AtomicUsize,
}

impl FillPermits {
    pub fn new(n: usize) -> FillPermits {
        FillPermits {
            sem: Arc::new(Semaphore::new(n)),
            size: AtomicUsize::new(n),
        }
    }

    /// Try-acquire: a full pool answers 503 at once instead of queueing.
    pub fn try_acquire(&self) -> Result<OwnedSemaphorePermit, ProxyError> {
        self.sem
            .clone()
            .try_acquire_owned()
            .map_err(|_| ProxyError::Overloaded("fill permits exhausted"))
    }

    /// Grows or shrinks the pool; shrinking takes effect as permits return.
    pub fn resize(&self, n: usize) {
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
pub struct Inflight(prometheus::IntGauge);

impl Inflight {
    pub fn enter(gauge: prometheus::IntGauge) -> Inflight {
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
pub enum Fetched {
    /// The whole body fitted in `max_body`.
    Buffered {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// Too large to cache: the response streams through to one client.
    Streamed(Response<Body>),
}

/// Calls upstream for a fill. The permit must already be held by the caller.
pub async fn fetch(
    client: &UpstreamClient,
    cfg: &Config,
    route: &Route,
    fill: &FillRequest,
    metrics: &Metrics,
) -> Result<Fetched, ProxyError> {
    let uri = client.uri_for(&fill.path_and_query)?;
    let mut req = Request::new(body::empty());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = uri;
    *req.headers_mut() = fill.headers.clone();

    let deadline = tokio::time::Instant::now() + cfg.upstream.timeout;
    let started = Instant::now();
    let resp = client.send(req, cfg.upstream.timeout).await;
    let elapsed = started.elapsed().as_secs_f64();
    metrics
        .upstream_duration
        .with_label_values(&[&route.name])
        .observe(elapsed);
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

    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let max_body = cfg.fill.max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body) {
        return Ok(Fetched::Streamed(Response::from_parts(
            parts,
            body::boxed(incoming),
        )));
    }

    // Read frames until the body ends or passes max_body, within the fill's
    // deadline; past the limit, the rest streams after what was read.
    let mut stream = BodyStream::new(incoming);
    let mut buf = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Err(UpstreamError::Timeout.into()),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(UpstreamError::Other(e.to_string()).into()),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers are not cached
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
