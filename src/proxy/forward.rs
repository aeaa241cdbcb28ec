//! Streaming pass-through of one request to the upstream: everything that is
//! not a cache read. Response bodies stream; a request body arrives here
//! already held or streaming as `upload` decided. Hop-by-hop
//! headers are dropped, `Host` is kept, `X-Forwarded-*` added, trailers pass
//! where HTTP/1.1 chunked allows, and `Upgrade` (WebSocket) is tunnelled.

use super::client::UpstreamClient;
use super::headers::{append_forwarded, strip_hop_by_hop, tokens};
use super::upload::UploadBody;
use crate::body::{boxed, Body};
use crate::error::{ProxyError, UpstreamError};
use crate::metrics::{client_error, Metrics};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tracing::{debug, warn};

/// Route label for everything forwarded outside a cache route.
const ROUTE: &str = crate::metrics::FORWARD_ROUTE;

/// Forwards `req` untouched (minus hop-by-hop, plus X-Forwarded-*) and
/// streams the answer back. Upgrades are tunnelled. 502/504 on failure.
pub(crate) async fn forward(
    client: &UpstreamClient,
    mut req: Request<UploadBody>,
    peer: SocketAddr,
    timeout: Duration,
    metrics: &Metrics,
) -> Response<Body> {
    // Only HTTP/1.1 can upgrade; an h2 request naming Upgrade is malformed
    // and hyper's h2 server does not let it through.
    let upgrade = (req.version() == Version::HTTP_11)
        .then(|| requested_upgrade(req.headers()))
        .flatten();
    let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let http1 = req.version() < Version::HTTP_2;

    let (mut parts, body) = req.into_parts();
    let wants_trailers =
        tokens(&parts.headers, &header::TE).any(|t| t.eq_ignore_ascii_case("trailers"));
    // HTTP/2 clients send the host as `:authority`; the upstream speaks
    // HTTP/1.1 and must see it as `Host` (hyper would otherwise put the
    // upstream's own address there).
    if !parts.headers.contains_key(header::HOST) {
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    append_forwarded(&mut parts.headers, peer, "http");
    if wants_trailers {
        // An HTTP/1.1 upstream only sends trailers to a client that says it
        // accepts them.
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(proto) = &upgrade {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, proto.clone());
    }
    // The URI stays as the client sent it: the client makes it origin-form
    // (an absolute URI's authority is the client's idea of the host, never
    // where the request goes).
    parts.version = Version::HTTP_11;
    // The client's body errors are marked as the client's (see
    // `UploadBody`): a malformed chunked body is a 400, not a 502.
    let upstream_req = Request::from_parts(parts, boxed(body));

    let (result, took) = client.send(upstream_req, timeout).await;
    metrics
        .forward
        .duration(metrics)
        .observe(took.as_secs_f64());
    let mut resp = match result {
        Ok(resp) => resp,
        Err(e) => return upstream_failed(metrics, e, http1),
    };
    metrics
        .forward
        .status(metrics, resp.status().as_u16())
        .inc();

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let upstream_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                let (down, up) = match tokio::try_join!(client_side, upstream_side) {
                    Ok(pair) => pair,
                    Err(e) => {
                        debug!(error = %e, "upgrade failed");
                        return;
                    }
                };
                let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
                match tokio::io::copy_bidirectional(&mut down, &mut up).await {
                    Ok((from_client, from_upstream)) => {
                        debug!(from_client, from_upstream, "tunnel closed")
                    }
                    Err(e) => debug!(error = %e, "tunnel ended with an error"),
                }
            });
            let (mut parts, body) = resp.into_parts();
            let proto = parts.headers.get(header::UPGRADE).cloned();
            strip_hop_by_hop(&mut parts.headers);
            if let Some(proto) = proto {
                parts
                    .headers
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                parts.headers.insert(header::UPGRADE, proto);
            }
            return Response::from_parts(parts, boxed(body));
        }
        // 101 to a request that did not ask for it: nothing can be tunnelled.
        warn!("upstream switched protocols without an upgrade request");
        return ProxyError::Upstream(UpstreamError::Other("unexpected 101".to_owned()))
            .to_response();
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, boxed(body))
}

/// The protocol a request asks to switch to: `Upgrade` present and named in
/// `Connection`, as RFC 9110 §7.8 requires.
fn requested_upgrade(h: &http::HeaderMap) -> Option<HeaderValue> {
    let asked = tokens(h, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade"));
    asked.then(|| h.get(header::UPGRADE).cloned()).flatten()
}

fn upstream_failed(metrics: &Metrics, e: UpstreamError, http1: bool) -> Response<Body> {
    debug!(error = %e, kind = e.kind(), "forward failed");
    if let UpstreamError::ClientBody(_) = e {
        // The client's fault, not the upstream's: no upstream error counted.
        metrics
            .client_errors
            .with_label_values(&[client_error::BAD_BODY])
            .inc();
        let mut resp = ProxyError::Upstream(e).to_response();
        if http1 {
            // The body's end is unknown: the connection cannot carry
            // another request.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }
    metrics.upstream_errors.with_label_values(&[e.kind()]).inc();
    metrics
        .upstream_requests
        .with_label_values(&[ROUTE, "error"])
        .inc();
    ProxyError::Upstream(e).to_response()
}
