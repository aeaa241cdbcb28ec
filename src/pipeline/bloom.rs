//! Stage 4: the Bloom filter, only on a miss and only for a route with
//! `bloom`. Certainly absent -> the route's negative answer (`404`, plain
//! text `not found`, `X-Cache: BLOOM`) with no lease, no upstream call and
//! nothing written. Maybe or unknown -> continue to the fill. A store error
//! here (counted by the breaker) also continues: the filter can only ever
//! take load away, never turn an existing object into a 404.

use super::CacheOutcome;
use crate::bloom::Blooms;
use crate::body::{self, Body};
use crate::config::{Config, Route};
use crate::store::bloom::BloomAnswer;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use std::sync::Arc;

/// The body of a Bloom rejection.
pub(crate) const NOT_FOUND_BODY: &str = "not found\n";

/// Returns the rejection when the filter says the member certainly does not
/// exist; `None` means continue.
pub(crate) async fn stage(
    blooms: &Arc<Blooms>,
    cfg: &Arc<Config>,
    route: &Arc<Route>,
    params: &[String],
    head: bool,
) -> Option<(CacheOutcome, Response<Body>)> {
    let bloom = route.bloom.as_ref()?;
    match blooms.check(cfg, route, bloom, params).await {
        Ok(BloomAnswer::Absent) => Some((CacheOutcome::Bloom, rejection(head))),
        Ok(BloomAnswer::Maybe | BloomAnswer::Unknown) => None,
        Err(e) => {
            tracing::debug!(route = %route.name, error = %e, "bloom check failed; continuing");
            None
        }
    }
}

fn rejection(head: bool) -> Response<Body> {
    let mut resp = Response::new(if head {
        body::empty()
    } else {
        body::full(NOT_FOUND_BODY)
    });
    *resp.status_mut() = StatusCode::NOT_FOUND;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(NOT_FOUND_BODY.len()),
    );
    resp
}
