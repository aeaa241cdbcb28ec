//! PLACEHOLDER (helper A replaces): streaming pass-through of one request.

use super::body::Body;
use super::client::UpstreamClient;
use crate::metrics::Metrics;
use http::{Request, Response};
use hyper::body::Incoming;
use std::net::SocketAddr;
use std::time::Duration;

/// Forwards `req` untouched (minus hop-by-hop, plus X-Forwarded-*) and
/// streams the answer back. Upgrades are tunnelled. 502/504 on failure.
pub async fn forward(
    _client: &UpstreamClient,
    _req: Request<Incoming>,
    _peer: SocketAddr,
    _timeout: Duration,
    _metrics: &Metrics,
) -> Response<Body> {
    todo!()
}
