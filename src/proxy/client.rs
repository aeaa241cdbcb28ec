//! The pooled keep-alive client to the upstream service, shared by
//! forwarding and cache fills. Errors are classified here (connect failure
//! vs timeout) so the one error mapping can answer 502 or 504.

use super::body::Body;
use crate::config::UpstreamConfig;
use crate::error::UpstreamError;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// Idle pooled connections are dropped after this long; kept short so a
/// service with a short keep-alive (Node's default is 5 s) rarely closes a
/// connection under us.
const POOL_IDLE: Duration = Duration::from_secs(4);

#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<HttpConnector, Body>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
}

impl UpstreamClient {
    pub fn new(cfg: &UpstreamConfig) -> UpstreamClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(cfg.max_idle_per_host)
            .build(connector);
        UpstreamClient {
            client,
            scheme: cfg.scheme.clone(),
            authority: cfg.authority.clone(),
        }
    }

    /// The absolute upstream URI for a request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| UpstreamError::Other(format!("bad upstream URI: {e}")))
    }

    /// Sends `req` (absolute URI) and waits at most `timeout` for the
    /// response head. The body is not covered by `timeout`: it streams.
    pub async fn send(
        &self,
        req: Request<Body>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Err(_) => Err(UpstreamError::Timeout),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Connect(source_chain(&e))),
            Ok(Err(e)) => Err(UpstreamError::Other(source_chain(&e))),
        }
    }
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
