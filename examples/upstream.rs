//! An example upstream service for sidecache: tenants and their app configs,
//! the domain of the seed articles (`app_config`, identity `(tenant, id)`).
//!
//! It is what sidecache sits in front of in the demo (`scripts/demo`) and in
//! the benchmark (`bench/run.sh`), and it is meant to be read: a plain
//! service that knows nothing about caching.
//!
//! ```text
//! GET  /api/tenants/{tenant}/apps/{id}    200 the app's JSON document, 404 JSON if absent
//! PUT  /api/tenants/{tenant}/apps/{id}    body = JSON object, replaces the app's `config`,
//!                                         bumps `version`; 200 (or 201 when created)
//! GET  /api/tenants/{tenant}/apps         the tenant's apps; `?limit=N&offset=M` pages
//! GET  /healthz                           200 "ok"
//! GET  /stats                             `{"api_requests":N}`: /api requests served so far
//! GET  /blob/{bytes}                      streams `bytes` bytes of `x` (for memory benchmarks)
//! POST /sink                              reads and drops the body; 200 `{"received":N}`
//! ```
//!
//! `HEAD` is accepted wherever `GET` is (hyper omits the body).
//!
//! Run: `cargo run --example upstream -- --listen 127.0.0.1:8000 --apps 10`.
//! `--delay-ms` adds latency to every API request (to make a stampede visible),
//! `--payload-bytes` pads each document to at least that many bytes (for
//! benchmarks). Requests are logged at debug: `RUST_LOG=debug`.
//!
//! Storage is in memory: two tenants, `acme` and `globex`, with apps `1..=N`.
//! A Postgres mode — the `app_config` table, with an outbox row written in the
//! same transaction as each update so sidecache learns of changes (SPEC §7) —
//! is planned and not implemented here yet; until then, invalidate through
//! sidecache's `POST /admin/invalidate` or its write-through on `PUT`.

use bytes::Bytes;
use clap::Parser;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

const TENANTS: [&str; 2] = ["acme", "globex"];
/// Largest PUT body accepted; larger gets 413.
const MAX_BODY: usize = 64 * 1024;

#[derive(Parser, Debug)]
#[command(about = "Example upstream for sidecache: tenants and app configs in memory")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Apps seeded per tenant, ids 1..=N.
    #[arg(long, default_value_t = 10)]
    apps: u64,
    /// Artificial latency added to every /api request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Pad each app document with a `padding` field to at least this many bytes.
    #[arg(long, default_value_t = 0)]
    payload_bytes: usize,
}

/// One app: the JSON document and its serialized form, rendered once per
/// change so that reads are cheap (the benchmark measures the proxy, not us).
struct App {
    doc: Value,
    body: Bytes,
}

struct State {
    /// `(tenant, id) -> app`; a tenant exists when it is in `TENANTS`.
    apps: RwLock<BTreeMap<(String, u64), App>>,
    delay: Duration,
    payload_bytes: usize,
    /// `/api/...` requests served, so a demo or test can count origin fetches.
    api_requests: AtomicU64,
}

impl State {
    fn render(&self, mut doc: Value) -> App {
        let mut body = serde_json::to_vec(&doc).expect("JSON value serializes");
        if body.len() < self.payload_bytes {
            // `,"padding":""` adds 13 bytes before the padding itself.
            let pad = self.payload_bytes.saturating_sub(body.len() + 13);
            doc["padding"] = Value::String("x".repeat(pad));
            body = serde_json::to_vec(&doc).expect("JSON value serializes");
            doc.as_object_mut().map(|m| m.remove("padding"));
        }
        App {
            doc,
            body: body.into(),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let state = Arc::new(State {
        apps: RwLock::new(BTreeMap::new()),
        delay: Duration::from_millis(args.delay_ms),
        payload_bytes: args.payload_bytes,
        api_requests: AtomicU64::new(0),
    });
    {
        let mut apps = state.apps.write().unwrap();
        for tenant in TENANTS {
            for id in 1..=args.apps {
                let doc = json!({
                    "id": id,
                    "tenant": tenant,
                    "name": format!("{tenant} app {id}"),
                    "config": { "feature_x": id % 2 == 0, "max_users": 100 * id, "region": "eu-west-1" },
                    "version": 1,
                    "updated_at": now_rfc3339(),
                });
                apps.insert((tenant.to_owned(), id), state.render(doc));
            }
        }
    }

    let listener = TcpListener::bind(args.listen).await?;
    info!(
        listen = %args.listen, apps = args.apps, delay_ms = args.delay_ms,
        payload_bytes = args.payload_bytes, "example upstream ready"
    );
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = tokio::signal::ctrl_c() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(state.clone(), req));
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    info!("shutting down");
    Ok(())
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, std::convert::Infallible>>, std::convert::Infallible> {
    if let Some(resp) = bench_endpoint(&req) {
        return Ok(resp);
    }
    if req.method() == Method::POST && req.uri().path() == "/sink" {
        return Ok(sink(req).await.map(BodyExt::boxed));
    }
    Ok(handle_api(state, req).await.map(BodyExt::boxed))
}

async fn handle_api(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let is_read = method == Method::GET || method == Method::HEAD;

    if path.starts_with("/api/") {
        state.api_requests.fetch_add(1, Ordering::Relaxed);
        if !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
    }
    let resp = match segments.as_slice() {
        ["healthz"] if is_read => text(StatusCode::OK, "ok\n"),
        ["stats"] if is_read => {
            let n = state.api_requests.load(Ordering::Relaxed);
            json_response(StatusCode::OK, &json!({ "api_requests": n }))
        }
        ["api", "tenants", tenant, "apps"] if is_read => list(&state, tenant, &query),
        ["api", "tenants", tenant, "apps", id] => match parse_id(id) {
            None => error(
                StatusCode::BAD_REQUEST,
                "bad_id",
                "id must be an integer >= 1",
            ),
            Some(id) if is_read => get(&state, tenant, id),
            Some(id) if method == Method::PUT => put(&state, tenant, id, req).await,
            Some(_) => method_not_allowed("GET, HEAD, PUT"),
        },
        ["api", "tenants", _, "apps"] => method_not_allowed("GET, HEAD"),
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
    };
    debug!(%method, %path, status = resp.status().as_u16(), "request");
    resp
}

/// `GET /blob/{bytes}`: a streamed body of that many bytes with a
/// `Content-Length`, produced 64 KiB at a time, so a 1 GiB download costs
/// the origin no memory.
fn bench_endpoint(
    req: &Request<Incoming>,
) -> Option<Response<BoxBody<Bytes, std::convert::Infallible>>> {
    let len: u64 = req.uri().path().strip_prefix("/blob/")?.parse().ok()?;
    if req.method() != Method::GET {
        return None;
    }
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let body = http_body_util::StreamBody::new(futures_util::stream::unfold(len, move |left| {
        let chunk = chunk.clone();
        async move {
            (left > 0).then(|| {
                let n = left.min(chunk.len() as u64);
                let frame = hyper::body::Frame::data(chunk.slice(..n as usize));
                (Ok::<_, std::convert::Infallible>(frame), left - n)
            })
        }
    }));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .body(BodyExt::boxed(body))
        .ok()
}

/// `POST /sink`: reads the body frame by frame, keeping only the count.
async fn sink(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let mut body = req.into_body();
    let mut received = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => received += frame.data_ref().map_or(0, |d| d.len() as u64),
            Err(e) => {
                warn!(error = %e, "reading /sink body failed");
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    "could not read the body",
                );
            }
        }
    }
    json_response(StatusCode::OK, &json!({ "received": received }))
}

fn get(state: &State, tenant: &str, id: u64) -> Response<Full<Bytes>> {
    let apps = state.apps.read().unwrap();
    match apps.get(&(tenant.to_owned(), id)) {
        Some(app) => json_bytes(StatusCode::OK, app.body.clone()),
        None => app_not_found(tenant, id),
    }
}

fn list(state: &State, tenant: &str, query: &str) -> Response<Full<Bytes>> {
    if !TENANTS.contains(&tenant) {
        return error(StatusCode::NOT_FOUND, "tenant_not_found", "no such tenant");
    }
    let (mut limit, mut offset) = (usize::MAX, 0usize);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match k {
            "limit" => &mut limit,
            "offset" => &mut offset,
            _ => continue,
        };
        match v.parse() {
            Ok(n) => *slot = n,
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_query",
                    "limit and offset are integers",
                )
            }
        }
    }
    // Concatenate the pre-rendered documents: `{"tenant":..,"apps":[doc,doc]}`.
    let apps = state.apps.read().unwrap();
    let mut body = format!(r#"{{"tenant":{},"apps":["#, Value::from(tenant)).into_bytes();
    let docs = apps
        .range((tenant.to_owned(), 0)..=(tenant.to_owned(), u64::MAX))
        .skip(offset)
        .take(limit);
    for (i, (_, app)) in docs.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&app.body);
    }
    body.extend_from_slice(b"]}");
    json_bytes(StatusCode::OK, body.into())
}

async fn put(
    state: &State,
    tenant: &str,
    id: u64,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if !TENANTS.contains(&tenant) {
        return error(StatusCode::NOT_FOUND, "tenant_not_found", "no such tenant");
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "body over 64 KiB",
            )
        }
        Err(e) => {
            warn!(error = %e, "reading PUT body failed");
            return error(
                StatusCode::BAD_REQUEST,
                "bad_body",
                "could not read the body",
            );
        }
    };
    let config: Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_json",
                "body must be a JSON object",
            )
        }
    };

    let mut apps = state.apps.write().unwrap();
    let key = (tenant.to_owned(), id);
    let (doc, status) = match apps.get(&key) {
        Some(app) => {
            let mut doc = app.doc.clone();
            doc["config"] = Value::Object(config);
            doc["version"] = json!(doc["version"].as_u64().unwrap_or(0) + 1);
            doc["updated_at"] = json!(now_rfc3339());
            (doc, StatusCode::OK)
        }
        None => {
            let doc = json!({
                "id": id, "tenant": tenant, "name": format!("{tenant} app {id}"),
                "config": config, "version": 1, "updated_at": now_rfc3339(),
            });
            (doc, StatusCode::CREATED)
        }
    };
    let app = state.render(doc);
    let body = app.body.clone();
    apps.insert(key, app);
    info!(tenant, id, status = status.as_u16(), "app config written");
    json_bytes(status, body)
}

/// Ids are positive integers; anything else is a client error, answered
/// before any lookup (the same shape check sidecache applies in front).
fn parse_id(s: &str) -> Option<u64> {
    s.parse().ok().filter(|&id| id >= 1)
}

fn app_not_found(tenant: &str, id: u64) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": "not_found", "tenant": tenant, "id": id }),
    )
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    json_response(status, &json!({ "error": code, "message": message }))
}

fn method_not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut resp = error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", allow);
    resp.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    resp
}

fn json_response(status: StatusCode, value: &Value) -> Response<Full<Bytes>> {
    json_bytes(
        status,
        serde_json::to_vec(value)
            .expect("JSON value serializes")
            .into(),
    )
}

fn json_bytes(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("static response parts are valid")
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response parts are valid")
}

/// Current UTC time as `2025-01-31T12:34:56Z` (civil-from-days, H. Hinnant).
fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
