//! The admin listener, separate from client traffic: liveness (`/healthz`),
//! readiness (`/readyz`: config loaded and client listener bound; never
//! depends on Redis), Prometheus text (`/metrics`), and the operator API
//! under `/admin/*` (route table, invalidation, Bloom rebuilds, explain one
//! URL), guarded by an optional
//! bearer token. Bad input is answered with 4xx, never a panic.

use crate::bloom::Blooms;
use crate::body::{full, Body};
use crate::config::{Config, QueryMode, Route};
use crate::explain::{self, Subject};
use crate::invalidation::{ApplyOutcome, Event, Invalidator, Poison, Source};
use crate::metrics::Metrics;
use crate::server::listener::{accept_until, builder};
use crate::store::GuardedStore;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Admin request bodies are small JSON documents.
const MAX_BODY: usize = 64 * 1024;

pub(crate) struct AdminState {
    pub config: Arc<ArcSwap<Config>>,
    pub invalidator: Arc<Invalidator>,
    pub blooms: Arc<Blooms>,
    /// Read by `/admin/lookup`.
    pub store: Arc<GuardedStore>,
    pub metrics: Metrics,
    /// Set once the client listener is bound; cleared when draining.
    pub ready: Arc<AtomicBool>,
    /// For the status page's uptime.
    pub started: tokio::time::Instant,
}

/// Serves the admin listener until `shutdown`.
pub(crate) async fn run(
    listener: TcpListener,
    state: Arc<AdminState>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let builder = builder();
    accept_until(
        "admin",
        listener,
        shutdown,
        drain,
        move |stream, peer, mut draining| {
            let state = state.clone();
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                tokio::pin!(conn);
                let served = draining
                    .serve(conn.as_mut(), |conn| conn.graceful_shutdown())
                    .await;
                if let Err(e) = served {
                    debug!(%peer, error = %e, "admin connection ended with an error");
                }
            });
        },
    )
    .await;
}

async fn handle(state: &AdminState, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    let method = req.method().clone();
    match path {
        // The status page: static, no data (that is under /admin/status).
        "/" => only_get(&method).unwrap_or_else(|| {
            let mut resp = Response::new(full(crate::status::PAGE));
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                     connect-src 'self'; img-src 'self'",
                ),
            );
            resp
        }),
        "/healthz" => only_get(&method).unwrap_or_else(|| text(StatusCode::OK, "ok\n")),
        "/readyz" => only_get(&method).unwrap_or_else(|| {
            if state.ready.load(Ordering::Acquire) {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
            }
        }),
        "/metrics" => only_get(&method).unwrap_or_else(|| {
            let mut resp = Response::new(full(state.metrics.render()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }),
        p if p == "/admin" || p.starts_with("/admin/") => {
            let cfg = state.config.load_full();
            if !authorized(&cfg, req.headers()) {
                let mut resp = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return resp;
            }
            match (p, &method) {
                ("/admin/routes", &Method::GET) => routes(&cfg),
                ("/admin/lookup", &Method::GET) => lookup(state, &cfg, &req).await,
                ("/admin/status", &Method::GET) => status(state, &cfg),
                ("/admin/invalidate", &Method::POST) => invalidate(state, req).await,
                (p, &Method::POST) if bloom_route(p).is_some() => {
                    let route = bloom_route(p).unwrap_or_default().to_owned();
                    bloom_rebuild(state, &cfg, &route, req.uri().query()).await
                }
                ("/admin/routes", _)
                | ("/admin/invalidate", _)
                | ("/admin/lookup", _)
                | ("/admin/status", _) => {
                    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
                }
                _ => error(StatusCode::NOT_FOUND, "no such admin endpoint"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn only_get(method: &Method) -> Option<Response<Body>> {
    (method != Method::GET && method != Method::HEAD)
        .then(|| text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"))
}

/// With a token configured, `/admin/*` needs `Authorization: Bearer <token>`
/// (the scheme is case-insensitive, RFC 9110 §11.1). Both sides are hashed
/// first so the comparison takes the same time for every guess, whatever its
/// length or its first wrong byte.
fn authorized(cfg: &Config, headers: &http::HeaderMap) -> bool {
    let Some(token) = cfg.admin.token.as_deref().filter(|t| !t.is_empty()) else {
        return true;
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, credentials)| credentials.trim_start_matches(' '));
    use sha2::{Digest, Sha256};
    let (a, b) = (
        Sha256::digest(presented.as_bytes()),
        Sha256::digest(token.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// `GET /admin/routes`: the active route table as JSON.
fn routes(cfg: &Config) -> Response<Body> {
    let list: Vec<_> = cfg.routes.routes.iter().map(|r| route_json(r)).collect();
    json_response(StatusCode::OK, &serde_json::Value::Array(list))
}

fn route_json(r: &Route) -> serde_json::Value {
    let params: BTreeMap<&str, &str> = r
        .params
        .iter()
        .map(|p| (p.name.as_str(), as_written(p.pattern.as_str())))
        .collect();
    json!({
        "name": r.name,
        "path": r.template,
        "methods": r.methods.iter().map(Method::as_str).collect::<Vec<_>>(),
        "params": params,
        "query": match &r.query {
            QueryMode::Include => json!("include"),
            QueryMode::Ignore => json!("ignore"),
            QueryMode::Allow(names) => json!(names),
        },
        "vary": r.vary.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
        "ttl": r.ttl.to_string(),
        "max_ttl": r.ttl.origin_caps().map(|(max, _)| format!("{max:?}")),
        "default_ttl": r.ttl.origin_caps().map(|(_, default)| format!("{default:?}")),
        "client_cache_control": r.client_cache_control.to_string(),
        "jitter": format!("{:?}", r.jitter),
        "negative_ttl": format!("{:?}", r.negative_ttl),
        "grace": format!("{:?}", r.grace),
        "stale_if_error": format!("{:?}", r.stale_if_error),
        "keep": format!("{:?}", r.keep),
        "cdn_cache_control": r.cdn_cache_control,
        "cache_status": r.cache_status,
        "negative_status": r.negative_status,
        "lease": format!("{:?}", r.lease),
        "wait": format!("{:?}", r.wait),
        "invalidate_on_write": r.invalidate_on_write,
        "bloom": r.bloom.as_ref().map(|b| json!({
            "scope": b.scope_template,
            "capacity": b.capacity,
            "fp_rate": b.fp_rate,
            "rebuild_every": format!("{:?}", b.rebuild_every),
            "m": b.sizing.m,
            "k": b.sizing.k,
        })),
    })
}

/// Patterns are stored anchored (`^(?:..)$`); show them as configured.
fn as_written(anchored: &str) -> &str {
    anchored
        .strip_prefix("^(?:")
        .and_then(|p| p.strip_suffix(")$"))
        .unwrap_or(anchored)
}

/// `GET /admin/lookup?url=/path?query[&header=value...]`: what the cache
/// holds for that URL and what a GET would get now (see `explain`).
async fn lookup(state: &AdminState, cfg: &Config, req: &Request<Incoming>) -> Response<Body> {
    let subject = match Subject::from_query(req.uri().query()) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let sources = explain::Sources {
        cfg,
        store: &state.store,
        blooms: &state.blooms,
        admin_headers: req.headers(),
    };
    json_response(StatusCode::OK, &explain::explain(&sources, &subject).await)
}

/// `GET /admin/status`: the status page's data (see `status`).
fn status(state: &AdminState, cfg: &Config) -> Response<Body> {
    let sources = crate::status::Sources {
        cfg,
        metrics: &state.metrics,
        invalidator: &state.invalidator,
        started: state.started,
        instance: crate::pipeline::lease::instance(),
    };
    let mut resp = json_response(StatusCode::OK, &crate::status::snapshot(&sources));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `POST /admin/invalidate`: replace one object's generation.
async fn invalidate(state: &AdminState, req: Request<Incoming>) -> Response<Body> {
    let body: Bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "body over 64 KiB");
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, "could not read the body"),
    };
    let event = Event::from_json(&body);
    let (route, kind, revision) = match &event {
        Ok(e) => (e.route.clone(), e.kind, e.revision),
        Err(_) => (String::new(), Default::default(), None),
    };
    let outcome = state.invalidator.apply(Source::Admin, vec![event]).await;
    match outcome.into_iter().next() {
        Some(ApplyOutcome::Applied) => {
            info!(route, ?kind, ?revision, "invalidated via admin");
            json_response(StatusCode::OK, &json!({"ok": true}))
        }
        Some(ApplyOutcome::Poison(p @ Poison::Malformed(_))) => {
            error(StatusCode::BAD_REQUEST, &format!("bad event: {p}"))
        }
        Some(ApplyOutcome::Poison(poison)) => error(StatusCode::BAD_REQUEST, &poison.to_string()),
        Some(ApplyOutcome::Failed(e)) => {
            warn!(route, error = %e, "admin invalidation failed: store unavailable");
            error(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
        }
        None => error(StatusCode::INTERNAL_SERVER_ERROR, "no outcome"),
    }
}

/// `/admin/bloom/{route}/rebuild` -> `route`.
fn bloom_route(path: &str) -> Option<&str> {
    path.strip_prefix("/admin/bloom/")?
        .strip_suffix("/rebuild")
        .filter(|r| !r.is_empty() && !r.contains('/'))
}

/// `POST /admin/bloom/{route}/rebuild?scope=VALUE`: builds one filter now
/// and answers when it is done. `scope` is the scope value as it appears in
/// request paths (not decoded); routes whose scope has no params need none.
/// 200 activated, 409 another build holds the lock (or ours expired), 422
/// more members than `capacity` (the filter is now unknown), 503 the store
/// or the membership source failed.
async fn bloom_rebuild(
    state: &AdminState,
    cfg: &Arc<Config>,
    route_name: &str,
    query: Option<&str>,
) -> Response<Body> {
    use crate::bloom::build::BuildOutcome;
    let Some(route) = cfg.routes.find(route_name) else {
        return error(StatusCode::NOT_FOUND, "unknown route");
    };
    let Some(bloom) = route.bloom.as_ref() else {
        return error(StatusCode::NOT_FOUND, "route has no bloom filter");
    };
    let given = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("scope="));
    let scope = match (bloom.is_scoped(), given) {
        (false, _) => String::new(),
        (true, Some(s)) if !s.is_empty() => s.to_owned(),
        (true, _) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "?scope= is required (scope template {:?})",
                    bloom.scope_template
                ),
            )
        }
    };
    let result = state.blooms.rebuild(cfg, route, &scope).await;
    info!(route = %route.name, scope, outcome = ?result, "bloom rebuild via admin");
    match result {
        Ok(BuildOutcome::Activated { members }) => json_response(
            StatusCode::OK,
            &json!({"ok": true, "outcome": "activated", "members": members}),
        ),
        Ok(o @ (BuildOutcome::Busy | BuildOutcome::LockLost)) => json_response(
            StatusCode::CONFLICT,
            &json!({"ok": false, "outcome": o.as_str()}),
        ),
        Ok(o @ BuildOutcome::CapacityExceeded { members }) => json_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            &json!({"ok": false, "outcome": o.as_str(), "members_at_least": members,
                    "capacity": bloom.capacity}),
        ),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"ok": false, "outcome": "failed", "error": e.to_string()}),
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error(status: StatusCode, reason: &str) -> Response<Body> {
    json_response(status, &json!({"ok": false, "error": reason}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let yaml =
            "version: 1\nlisten: 127.0.0.1:1\nadmin: { listen: 127.0.0.1:2, token: s3cret }\n\
                    upstream: { url: \"http://127.0.0.1:3\" }\nroutes: []\n";
        let cfg = Config::parse(yaml, &|_| None).expect("config");
        let auth = |value: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            authorized(&cfg, &h)
        };
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "Bearer  s3cret",
        ] {
            assert!(auth(ok), "{ok}");
        }
        for bad in [
            "Bearer s3cre",
            "Basic s3cret",
            "s3cret",
            "Bearers3cret",
            "Bearer",
        ] {
            assert!(!auth(bad), "{bad}");
        }
        assert!(!authorized(&cfg, &http::HeaderMap::new()));
    }
}
