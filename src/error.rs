//! Error kinds by meaning, and the one place that turns them into HTTP
//! answers. The classification is the degradation policy
//! (docs/architecture.md#degradation-policy):
//! - store unavailable -> never an error to the client: the degraded path;
//! - upstream unreachable / timed out -> 502 / 504;
//! - overload (fill permits, lease wait budget, request buffer budget) ->
//!   503 with `Retry-After`;
//! - bad request input -> 400, never forwarded (a request body that turns
//!   out malformed while it streams upstream -> 400 as well); a target over
//!   `limits.max_target_bytes` -> 414; a request body that does not arrive
//!   within `limits.body_timeout` -> 408;
//! - a transfer coding other than chunked -> 501;
//! - a bug -> 500, logged, nothing internal leaks.
//!
//! Upstream 4xx/5xx answers are responses, not errors.

use crate::body::{full, Body};
use http::{header, Response, StatusCode};

#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Connect(String),
    #[error("upstream timed out")]
    Timeout,
    #[error("upstream exchange failed: {0}")]
    Other(String),
    /// The client's request body failed while it was being sent upstream
    /// (malformed chunked framing, the client went away): the client's
    /// fault, answered 400 and never counted as an upstream error.
    #[error("request body from the client failed: {0}")]
    ClientBody(String),
}

impl UpstreamError {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Other(_) => "other",
            UpstreamError::ClientBody(_) => "client_body",
        }
    }
}

/// The [`ProxyError::Overloaded`] reason when the lease wait budget is
/// spent (any other reason is the fill permits).
pub(crate) const LEASE_WAIT_SPENT: &str = "lease wait budget spent";
/// The [`ProxyError::Overloaded`] reason when `limits.request_buffer_budget`
/// has no room for another request body.
pub(crate) const REQUEST_BUFFER_SPENT: &str = "request buffer budget spent";

/// Why sidecache answers a request itself instead of with an upstream response.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A request that uses what sidecache does not implement (a transfer
    /// coding other than chunked, RFC 9112 §6.1).
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// Fill permits exhausted, the lease wait budget spent, or no room in
    /// the request buffer budget.
    #[error("overloaded: {0}")]
    Overloaded(&'static str),
    /// The request target is over `limits.max_target_bytes`.
    #[error("request target too long")]
    UriTooLong,
    /// The buffered part of a request body did not arrive within
    /// `limits.body_timeout`.
    #[error("request body timed out")]
    BodyTimeout,
    #[error("internal error: {0}")]
    Bug(String),
}

impl ProxyError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ProxyError::Upstream(UpstreamError::Timeout) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Upstream(UpstreamError::ClientBody(_)) => StatusCode::BAD_REQUEST,
            ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UriTooLong => StatusCode::URI_TOO_LONG,
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Bug(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Why sidecache answered itself, as a `Cache-Status` `detail` token
    /// (docs/caching.md#cache-status).
    pub(crate) fn detail(&self) -> &'static str {
        match self {
            ProxyError::Upstream(UpstreamError::Timeout) => "upstream-timeout",
            ProxyError::Upstream(UpstreamError::ClientBody(_)) | ProxyError::BadRequest(_) => {
                "bad-request"
            }
            ProxyError::Upstream(_) => "upstream-unavailable",
            ProxyError::NotImplemented(_) => "not-implemented",
            ProxyError::Overloaded(_) => "overloaded",
            ProxyError::UriTooLong => "uri-too-long",
            ProxyError::BodyTimeout => "body-timeout",
            ProxyError::Bug(_) => "internal-error",
        }
    }

    /// The client-facing answer: a short plain-text body, no internals.
    pub(crate) fn to_response(&self) -> Response<Body> {
        let status = self.status();
        let text = match self {
            ProxyError::BadRequest(why) => format!("bad request: {why}\n"),
            ProxyError::Overloaded(_) => "service busy, retry shortly\n".to_owned(),
            ProxyError::NotImplemented(what) => format!("not implemented: {what}\n"),
            ProxyError::Upstream(UpstreamError::Timeout) => "upstream timed out\n".to_owned(),
            ProxyError::Upstream(UpstreamError::ClientBody(_)) => {
                "bad request: malformed request body\n".to_owned()
            }
            ProxyError::Upstream(_) => "upstream unavailable\n".to_owned(),
            ProxyError::UriTooLong => "request target too long\n".to_owned(),
            ProxyError::BodyTimeout => "request body not received in time\n".to_owned(),
            ProxyError::Bug(_) => "internal error\n".to_owned(),
        };
        let mut resp = Response::new(full(text));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if let ProxyError::Overloaded(reason) = self {
            resp.extensions_mut().insert(Overload::of(reason));
        }
        resp.extensions_mut().insert(SelfMade(self.detail()));
        resp
    }
}

/// Marks a `503` that sidecache answered itself for overload (counted in
/// `sidecache_overloaded_total{reason}`), as opposed to an upstream's 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overload {
    /// Fill permits (or the route's share of them) were all taken.
    FillPermits,
    /// The lease `wait` budget was spent waiting for another fill.
    LeaseWait,
    /// `limits.request_buffer_budget` had no room for a request body.
    RequestBuffer,
}

impl Overload {
    fn of(reason: &str) -> Overload {
        if reason == LEASE_WAIT_SPENT {
            Overload::LeaseWait
        } else if reason == REQUEST_BUFFER_SPENT {
            Overload::RequestBuffer
        } else {
            Overload::FillPermits
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Overload::FillPermits => "fill_permits",
            Overload::LeaseWait => "lease_wait",
            Overload::RequestBuffer => "request_buffer",
        }
    }
}

/// Marks an answer sidecache made itself instead of the service's (a
/// response extension), with [`ProxyError::detail`]: such an answer has no
/// `fwd-status` in `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SelfMade(pub &'static str);
