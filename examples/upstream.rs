//! An example upstream service for sidecache: tenants and their app configs,
//! the domain of the seed articles (`app_config`, identity `(tenant, id)`).
//!
//! It is what sidecache sits in front of in the demo (`scripts/demo`), the
//! benchmark (`bench/run.sh`) and the compose stack (`examples/compose.yaml`),
//! and it is meant to be read: a plain service that knows nothing about
//! caching — except, in Postgres mode, how to tell sidecache that data
//! changed (an outbox row in the same transaction as each change).
//!
//! ```text
//! GET    /api/tenants/{tenant}/apps/{id}  200 the app's JSON document, 404 JSON if absent
//! PUT    /api/tenants/{tenant}/apps/{id}  body = JSON object, replaces the app's `config`,
//!                                         bumps `version`; 200. An absent app is created
//!                                         (201) in memory, 404 in Postgres mode
//! DELETE /api/tenants/{tenant}/apps/{id}  204, 404 if absent
//! POST   /api/tenants/{tenant}/apps       body = JSON object (the `config`): creates the
//!                                         app with the next free id; 201 + `Location`
//! GET    /api/tenants/{tenant}/apps       the tenant's apps; `?limit=N&offset=M` pages
//! GET    /healthz                         200 "ok"
//! GET    /stats                           `{"api_requests":N}`: /api and /object requests served so far
//! GET    /blob/{bytes}                    streams `bytes` bytes of `x` (memory benchmarks)
//! GET    /object/{bytes}                  `bytes` (≤ 16 MiB) of `a..z` with a strong `ETag`
//!                                         (`?tags=N`: N cache tags in `Surrogate-Key`:
//!                                         `object:{bytes}`, `shared:1`, ...)
//!                                         (`"object-{bytes}"`) and a `Last-Modified`, like a
//!                                         static file (conditional and range benchmarks)
//! POST   /sink                            reads and drops the body; 200 `{"received":N}`
//! ```
//!
//! `HEAD` is accepted wherever `GET` is (hyper omits the body). The tenants
//! are fixed: `acme` and `globex`; others get 404.
//!
//! Run: `cargo run --example upstream -- --listen 127.0.0.1:8000 --apps 10`.
//! `--delay-ms` adds latency to every API request (to make a stampede visible):
//! a write waits before its transaction, a read's answer is held after its
//! data was read (so it is that old when it arrives, as over a slow network),
//! `--payload-bytes` pads each document to at least that many bytes (for
//! benchmarks). Requests are logged at debug: `RUST_LOG=debug`.
//!
//! Two more flags show sidecache's other invalidation and caching paths
//! (Postgres mode; the history checker's `edges` feed uses them):
//! `--tags` answers each app with the cache tag `app-{tenant}-{id}` in
//! `Surrogate-Key` and writes its outbox rows as tag events (that tag, no
//! route), so tags are the only invalidation; `--etags` gives each app the
//! `ETag` `"v{version}"` and answers `304 Not Modified` to a `GET` whose
//! `If-None-Match` names the current one.
//!
//! # Storage
//!
//! **In memory** (the default): apps `1..=N` of each tenant, lost on exit.
//! sidecache learns of changes only through its write-through (a `PUT`
//! through the proxy) or `POST /admin/invalidate`.
//!
//! **Postgres** (`--database-url URL` or `DATABASE_URL`): the apps live in
//! table `app_config`, created and seeded with apps `1..=N` per tenant when
//! missing or empty. At start the service also installs sidecache's outbox
//! table (the SQL `sidecache outbox-ddl` prints; a real service installs it
//! with its migrations). Every change — `PUT`, `POST`, `DELETE` — writes
//! its `app_config` change and one `sidecache_outbox` row in ONE
//! transaction (see [`pg`]), and sidecache's outbox worker applies the row:
//! changes made behind sidecache's back, directly on this service, still
//! reach the cache. See `docs/invalidation.md` and `docs/example.md`.
//!
//! **Postgres without an outbox** (`--no-outbox`): the service as most
//! services are, writing only `app_config`. sidecache then learns of
//! changes by change capture (`invalidation.capture`: triggers or logical
//! replication), without this service's cooperation.

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
/// Largest PUT/POST body accepted; larger gets 413.
const MAX_BODY: usize = 64 * 1024;

#[derive(Parser, Debug)]
#[command(
    about = "Example upstream for sidecache: tenants and app configs, in memory or in Postgres"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Apps seeded per tenant, ids 1..=N (in Postgres: only into an empty table).
    #[arg(long, default_value_t = 10)]
    apps: u64,
    /// Artificial latency added to every /api request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Pad each app document with a `padding` field to at least this many bytes.
    #[arg(long, default_value_t = 0)]
    payload_bytes: usize,
    /// Store apps in Postgres (`postgres://user:pass@host:5432/db`) and write
    /// an outbox row with every change. Without it, apps live in memory.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Postgres mode: write only `app_config`, no outbox rows (the unchanged
    /// service that change capture serves).
    #[arg(long)]
    no_outbox: bool,
    /// Postgres mode: tag each app (`Surrogate-Key: app-{tenant}-{id}`) and
    /// write outbox rows as tag events for that tag instead of route events.
    #[arg(long)]
    tags: bool,
    /// Postgres mode: an `ETag` per app version, and `304` for a matching
    /// `If-None-Match`.
    #[arg(long)]
    etags: bool,
}

/// One app: the JSON document and its serialized form, rendered once per
/// change so that reads are cheap (the benchmark measures the proxy, not us).
struct App {
    doc: Value,
    body: Bytes,
}

struct State {
    /// In-memory mode: `(tenant, id) -> app`; a tenant exists when it is in
    /// `TENANTS`. Unused in Postgres mode.
    apps: RwLock<BTreeMap<(String, u64), App>>,
    /// Postgres mode when set.
    db: Option<pg::Db>,
    delay: Duration,
    payload_bytes: usize,
    /// `--tags`: apps carry their cache tag.
    tags: bool,
    /// `--etags`: apps carry an `ETag` and revalidate.
    etags: bool,
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

    /// The in-memory map; a panic elsewhere while holding the lock leaves
    /// the map consistent (every write is a single insert or remove).
    fn apps_read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<(String, u64), App>> {
        self.apps.read().unwrap_or_else(|p| p.into_inner())
    }

    fn apps_write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<(String, u64), App>> {
        self.apps.write().unwrap_or_else(|p| p.into_inner())
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

    let db = match &args.database_url {
        Some(url) => Some(pg::Db::open(url, args.apps, !args.no_outbox, args.tags).await?),
        None => None,
    };
    let state = Arc::new(State {
        apps: RwLock::new(BTreeMap::new()),
        db,
        delay: Duration::from_millis(args.delay_ms),
        payload_bytes: args.payload_bytes,
        tags: args.tags,
        etags: args.etags,
        api_requests: AtomicU64::new(0),
    });
    if state.db.is_none() {
        let mut apps = state.apps_write();
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
        payload_bytes = args.payload_bytes,
        storage = if state.db.is_some() { "postgres" } else { "memory" },
        "example upstream ready"
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
    if let Some(resp) = object_endpoint(&state, &req) {
        return Ok(resp.map(BodyExt::boxed));
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
    let if_none_match = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);

    let delay = if path.starts_with("/api/") {
        state.api_requests.fetch_add(1, Ordering::Relaxed);
        state.delay
    } else {
        Duration::ZERO
    };
    if !is_read && !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let resp = match segments.as_slice() {
        ["healthz"] if is_read => text(StatusCode::OK, "ok\n"),
        ["stats"] if is_read => {
            let n = state.api_requests.load(Ordering::Relaxed);
            json_response(StatusCode::OK, &json!({ "api_requests": n }))
        }
        ["api", "tenants", tenant, "apps"]
            if (is_read || method == Method::POST) && !TENANTS.contains(tenant) =>
        {
            tenant_not_found()
        }
        ["api", "tenants", tenant, "apps"] if is_read => match parse_page(&query) {
            None => error(
                StatusCode::BAD_REQUEST,
                "bad_query",
                "limit and offset are integers",
            ),
            Some(page) => match &state.db {
                Some(db) => or_500(pg::list(&state, db, tenant, page).await),
                None => list(&state, tenant, page),
            },
        },
        ["api", "tenants", tenant, "apps"] if method == Method::POST => {
            match read_object(req).await {
                Err(resp) => resp,
                Ok(config) => match &state.db {
                    Some(db) => or_500(pg::create(&state, db, tenant, config).await),
                    None => create(&state, tenant, config),
                },
            }
        }
        ["api", "tenants", _, "apps"] => method_not_allowed("GET, HEAD, POST"),
        ["api", "tenants", tenant, "apps", id] => match parse_id(id) {
            None => error(
                StatusCode::BAD_REQUEST,
                "bad_id",
                "id must be an integer in 1..=9223372036854775807",
            ),
            Some(id) if is_read => match &state.db {
                Some(db) => or_500(pg::get(&state, db, tenant, id, if_none_match.as_deref()).await),
                None => get(&state, tenant, id),
            },
            Some(id) if method == Method::PUT => match read_object(req).await {
                Err(resp) => resp,
                Ok(config) => match &state.db {
                    Some(db) => or_500(pg::update(&state, db, tenant, id, config).await),
                    None => put(&state, tenant, id, config),
                },
            },
            Some(id) if method == Method::DELETE => match &state.db {
                Some(db) => or_500(pg::delete(db, tenant, id).await),
                None => delete(&state, tenant, id),
            },
            Some(_) => method_not_allowed("GET, HEAD, PUT, DELETE"),
        },
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
    };
    if is_read && !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
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

/// The largest `/object/{bytes}`.
const MAX_OBJECT: usize = 16 * 1024 * 1024;

/// `GET /object/{bytes}`: a fixed body with the validators a static file
/// server sends, so a cache in front can answer `If-None-Match` and `Range`.
fn object_endpoint(state: &State, req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    let len: usize = req.uri().path().strip_prefix("/object/")?.parse().ok()?;
    if !(req.method() == Method::GET || req.method() == Method::HEAD) || len > MAX_OBJECT {
        return None;
    }
    state.api_requests.fetch_add(1, Ordering::Relaxed);
    let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
    // `?tags=N`: N cache tags in `Surrogate-Key` (bench/callgrind.sh).
    let tags: usize = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("tags="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
        .min(32);
    // The first is the object's own; the others are shared by every object
    // (`shared:1` ...), so one tag event reaches all of them.
    let keys: Vec<String> = (0..tags)
        .map(|i| match i {
            0 => format!("object:{len}"),
            i => format!("shared:{i}"),
        })
        .collect();
    Response::builder()
        .header("surrogate-key", keys.join(" "))
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::ETAG, format!("\"object-{len}\""))
        .header(header::LAST_MODIFIED, "Mon, 01 Jan 2024 00:00:00 GMT")
        .body(Full::new(Bytes::from(body)))
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

/// `limit` and `offset` of a list request.
#[derive(Clone, Copy)]
struct Page {
    limit: Option<u64>,
    offset: u64,
}

/// `None` when `limit` or `offset` is not an integer.
fn parse_page(query: &str) -> Option<Page> {
    let mut page = Page {
        limit: None,
        offset: 0,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => page.limit = Some(v.parse().ok()?),
            "offset" => page.offset = v.parse().ok()?,
            _ => {}
        }
    }
    Some(page)
}

/// Reads a PUT/POST body that must be a JSON object (the app's `config`).
async fn read_object(req: Request<Incoming>) -> Result<Map<String, Value>, Response<Full<Bytes>>> {
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "body over 64 KiB",
            ))
        }
        Err(e) => {
            warn!(error = %e, "reading the request body failed");
            return Err(error(
                StatusCode::BAD_REQUEST,
                "bad_body",
                "could not read the body",
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_json",
            "body must be a JSON object",
        )
    })
}

// ---------------------------------------------------------------------------
// In-memory storage

fn get(state: &State, tenant: &str, id: u64) -> Response<Full<Bytes>> {
    match state.apps_read().get(&(tenant.to_owned(), id)) {
        Some(app) => json_bytes(StatusCode::OK, app.body.clone()),
        None => app_not_found(tenant, id),
    }
}

fn list(state: &State, tenant: &str, page: Page) -> Response<Full<Bytes>> {
    // Concatenate the pre-rendered documents: `{"tenant":..,"apps":[doc,doc]}`.
    let apps = state.apps_read();
    let docs = apps
        .range((tenant.to_owned(), 0)..=(tenant.to_owned(), u64::MAX))
        .skip(usize::try_from(page.offset).unwrap_or(usize::MAX))
        .take(
            page.limit
                .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        )
        .map(|(_, app)| app.body.clone());
    list_body(tenant, docs)
}

fn put(state: &State, tenant: &str, id: u64, config: Map<String, Value>) -> Response<Full<Bytes>> {
    if !TENANTS.contains(&tenant) {
        return tenant_not_found();
    }
    let mut apps = state.apps_write();
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

fn create(state: &State, tenant: &str, config: Map<String, Value>) -> Response<Full<Bytes>> {
    let mut apps = state.apps_write();
    let id = apps
        .range((tenant.to_owned(), 0)..=(tenant.to_owned(), u64::MAX))
        .next_back()
        .map_or(1, |((_, id), _)| id + 1);
    let doc = json!({
        "id": id, "tenant": tenant, "name": format!("{tenant} app {id}"),
        "config": config, "version": 1, "updated_at": now_rfc3339(),
    });
    let app = state.render(doc);
    let body = app.body.clone();
    apps.insert((tenant.to_owned(), id), app);
    info!(tenant, id, "app created");
    created(tenant, id, body)
}

fn delete(state: &State, tenant: &str, id: u64) -> Response<Full<Bytes>> {
    match state.apps_write().remove(&(tenant.to_owned(), id)) {
        Some(_) => {
            info!(tenant, id, "app deleted");
            no_content()
        }
        None => app_not_found(tenant, id),
    }
}

// ---------------------------------------------------------------------------
// Postgres storage

/// Postgres mode: table `app_config`, and one `sidecache_outbox` row written
/// in the same transaction as every change.
///
/// Why the same transaction: sidecache may hold a cached copy of the app.
/// The outbox row is how it learns that the copy is stale. Written in the
/// change's transaction, the row commits exactly when the change commits —
/// a committed change always has its event, a rolled-back one never has.
/// Written separately (before or after the commit, or sent to sidecache
/// over HTTP), a crash or a network error between the two steps loses the
/// event and the cache serves the old value until its TTL expires.
mod pg {
    use super::{app_not_found, created, json_bytes, list_body, no_content, Page, State, TENANTS};
    use bytes::Bytes;
    use http::{header, HeaderValue, Response, StatusCode};
    use http_body_util::Full;
    use serde_json::{Map, Value};
    use sidecache::invalidation::ddl;
    use tokio::sync::{Mutex, MutexGuard};
    use tokio_postgres::{Client, GenericClient, NoTls};
    use tracing::{info, warn};

    type Result<T> = std::result::Result<T, tokio_postgres::Error>;

    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS app_config (
        tenant     text        NOT NULL,
        id         bigint      NOT NULL,
        name       text        NOT NULL,
        config     jsonb       NOT NULL,
        version    bigint      NOT NULL DEFAULT 1,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant, id)
    )";

    /// The app's JSON document, built by Postgres (the crate's tokio-postgres
    /// has no serde_json support enabled, so JSON travels as text).
    const DOC: &str = r#"jsonb_build_object(
        'id', id, 'tenant', tenant, 'name', name, 'config', config, 'version', version,
        'updated_at', to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    )::text"#;

    /// The event for sidecache: route `app` of sidecache's config, its path
    /// params `tenant` and `id`, the kind of change and our version.
    const OUTBOX: &str = "INSERT INTO sidecache_outbox (route, params, kind, revision)
        VALUES ('app', jsonb_build_object('tenant', $1::text, 'id', $2::bigint), $3, $4)";

    /// `--tags`: the event is the app's cache tag.
    const TAG_OUTBOX: &str = "INSERT INTO sidecache_outbox (tags) VALUES ($1)";

    /// One connection for the whole service, used by one request at a time:
    /// enough for an example. A real service uses a pool (deadpool-postgres,
    /// bb8), the transaction code stays the same.
    pub(super) struct Db {
        url: String,
        client: Mutex<Client>,
        /// Whether changes write their outbox row (`--no-outbox`: never).
        outbox: bool,
        /// Outbox rows are tag events (`--tags`).
        tags: bool,
    }

    impl Db {
        /// Connects (retrying for 30 s while Postgres starts), creates
        /// `app_config` and the outbox if missing, seeds an empty table.
        pub(super) async fn open(
            url: &str,
            apps: u64,
            outbox: bool,
            tags: bool,
        ) -> anyhow::Result<Db> {
            let mut attempt = 0;
            let client = loop {
                match connect(url).await {
                    Ok(client) => break client,
                    Err(e) if attempt < 30 => {
                        warn!(error = %e, "cannot connect to Postgres yet; retrying");
                        attempt += 1;
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            // The outbox: exactly what `sidecache outbox-ddl` prints
            // (idempotent). A real service installs it with its migrations.
            if outbox {
                let ddl = ddl::outbox_ddl(ddl::DEFAULT_TABLE, Some(ddl::DEFAULT_CHANNEL))
                    .map_err(anyhow::Error::msg)?;
                client.batch_execute(&ddl).await?;
            }
            client.batch_execute(SCHEMA).await?;
            // Seed only an empty table, so restarts keep the data. No outbox
            // rows: nothing can be cached about apps nobody has read yet.
            let apps = i64::try_from(apps)?;
            let seeded = client
                .execute(
                    "INSERT INTO app_config (tenant, id, name, config)
                     SELECT t, n, t || ' app ' || n, jsonb_build_object(
                         'feature_x', n % 2 = 0, 'max_users', 100 * n, 'region', 'eu-west-1')
                     FROM unnest($1::text[]) AS t, generate_series(1, $2::bigint) AS n
                     WHERE NOT EXISTS (SELECT 1 FROM app_config)
                     ON CONFLICT DO NOTHING",
                    &[&TENANTS.as_slice(), &apps],
                )
                .await?;
            info!(seeded, "Postgres ready: app_config and sidecache_outbox");
            Ok(Db {
                url: url.to_owned(),
                client: Mutex::new(client),
                outbox,
                tags,
            })
        }

        /// The connection, reconnected first if Postgres closed it (e.g.
        /// after a Postgres restart).
        async fn client(&self) -> Result<MutexGuard<'_, Client>> {
            let mut client = self.client.lock().await;
            if client.is_closed() {
                *client = connect(&self.url).await?;
            }
            Ok(client)
        }
    }

    async fn connect(url: &str) -> Result<Client> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(error = %e, "Postgres connection closed");
            }
        });
        Ok(client)
    }

    /// Ids are positive `bigint`s (`parse_id` keeps them below 2^63).
    fn sql_id(id: u64) -> i64 {
        i64::try_from(id).unwrap_or(i64::MAX)
    }

    /// A document from `DOC`, padded like the in-memory ones.
    fn render(state: &State, text: &str) -> Bytes {
        match serde_json::from_str::<Value>(text) {
            Ok(doc) => state.render(doc).body,
            Err(_) => Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    /// `GET`; with `--tags` the answer carries the app's cache tag, with
    /// `--etags` its version's `ETag` (and is `304` for `if_none_match`).
    pub(super) async fn get(
        state: &State,
        db: &Db,
        tenant: &str,
        id: u64,
        if_none_match: Option<&str>,
    ) -> Result<Response<Full<Bytes>>> {
        let client = db.client().await?;
        let sql = format!("SELECT {DOC}, version FROM app_config WHERE tenant = $1 AND id = $2");
        let row = client.query_opt(&sql, &[&tenant, &sql_id(id)]).await?;
        let Some(row) = row else {
            return Ok(app_not_found(tenant, id));
        };
        let version: i64 = row.get(1);
        let etag = format!("\"v{version}\"");
        let mut resp = match state.etags && if_none_match == Some(etag.as_str()) {
            true => {
                let mut resp = Response::new(Full::new(Bytes::new()));
                *resp.status_mut() = StatusCode::NOT_MODIFIED;
                resp
            }
            false => json_bytes(StatusCode::OK, render(state, row.get(0))),
        };
        let headers = resp.headers_mut();
        if state.etags {
            if let Ok(value) = HeaderValue::from_str(&etag) {
                headers.insert(header::ETAG, value);
            }
        }
        if state.tags {
            if let Ok(value) = HeaderValue::from_str(&tag(tenant, sql_id(id))) {
                headers.insert("surrogate-key", value);
            }
        }
        Ok(resp)
    }

    /// The cache tag of one app (`--tags`).
    fn tag(tenant: &str, id: i64) -> String {
        format!("app-{tenant}-{id}")
    }

    pub(super) async fn list(
        state: &State,
        db: &Db,
        tenant: &str,
        page: Page,
    ) -> Result<Response<Full<Bytes>>> {
        let client = db.client().await?;
        let limit = page.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let offset = i64::try_from(page.offset).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {DOC} FROM app_config WHERE tenant = $1 ORDER BY id LIMIT $2 OFFSET $3"
        );
        let rows = client.query(&sql, &[&tenant, &limit, &offset]).await?;
        Ok(list_body(
            tenant,
            rows.iter().map(|row| render(state, row.get(0))),
        ))
    }

    /// `PUT`: the update and its outbox row commit together, or neither does.
    pub(super) async fn update(
        state: &State,
        db: &Db,
        tenant: &str,
        id: u64,
        config: Map<String, Value>,
    ) -> Result<Response<Full<Bytes>>> {
        let config = Value::Object(config).to_string();
        let mut client = db.client().await?;
        let tx = client.transaction().await?;
        let sql = format!(
            "UPDATE app_config SET config = $3::text::jsonb, version = version + 1, updated_at = now()
             WHERE tenant = $1 AND id = $2 RETURNING version, {DOC}"
        );
        let Some(row) = tx.query_opt(&sql, &[&tenant, &sql_id(id), &config]).await? else {
            // Nothing changed, so no event: dropping `tx` rolls back.
            return Ok(app_not_found(tenant, id));
        };
        let version: i64 = row.get(0);
        outbox(db, &tx, tenant, sql_id(id), "invalidate", version).await?;
        tx.commit().await?;
        info!(
            tenant,
            id,
            version,
            outbox = db.outbox,
            "app config updated"
        );
        Ok(json_bytes(StatusCode::OK, render(state, row.get(1))))
    }

    /// `POST`: a new app with the next free id. Its `create` event also
    /// replaces a negative cache entry (a 404 sidecache may have cached for
    /// that id) and, with a Bloom filter on the route, adds the id to it.
    pub(super) async fn create(
        state: &State,
        db: &Db,
        tenant: &str,
        config: Map<String, Value>,
    ) -> Result<Response<Full<Bytes>>> {
        let config = Value::Object(config).to_string();
        let mut client = db.client().await?;
        let tx = client.transaction().await?;
        // One connection serializes creates in this process; several
        // processes could pick the same id, and one would get an error.
        let sql = format!(
            "INSERT INTO app_config (tenant, id, name, config)
             SELECT $1::text, n, $1::text || ' app ' || n, $2::text::jsonb
             FROM (SELECT coalesce(max(id), 0) + 1 AS n FROM app_config WHERE tenant = $1::text) AS next
             RETURNING id, version, {DOC}"
        );
        let row = tx.query_one(&sql, &[&tenant, &config]).await?;
        let (id, version): (i64, i64) = (row.get(0), row.get(1));
        outbox(db, &tx, tenant, id, "create", version).await?;
        tx.commit().await?;
        info!(tenant, id, outbox = db.outbox, "app created");
        Ok(created(
            tenant,
            u64::try_from(id).unwrap_or(0),
            render(state, row.get(2)),
        ))
    }

    /// `DELETE`: the row goes and its `delete` event is written, together.
    pub(super) async fn delete(db: &Db, tenant: &str, id: u64) -> Result<Response<Full<Bytes>>> {
        let mut client = db.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "DELETE FROM app_config WHERE tenant = $1 AND id = $2 RETURNING version",
                &[&tenant, &sql_id(id)],
            )
            .await?;
        let Some(row) = row else {
            return Ok(app_not_found(tenant, id));
        };
        // The deletion is the object's next revision.
        let version: i64 = row.get(0);
        outbox(db, &tx, tenant, sql_id(id), "delete", version + 1).await?;
        tx.commit().await?;
        info!(tenant, id, outbox = db.outbox, "app deleted");
        Ok(no_content())
    }

    /// Writes the event inside the caller's transaction (`tx`): that is the
    /// whole point. sidecache's worker deletes the row once applied. With
    /// `--no-outbox` nothing is written: change capture sees the change.
    async fn outbox(
        db: &Db,
        tx: &impl GenericClient,
        tenant: &str,
        id: i64,
        kind: &str,
        revision: i64,
    ) -> Result<()> {
        if !db.outbox {
            return Ok(());
        }
        if db.tags {
            // The app's tag names it, so the event needs no route.
            let tags = vec![tag(tenant, id)];
            tx.execute(TAG_OUTBOX, &[&tags]).await?;
            return Ok(());
        }
        tx.execute(OUTBOX, &[&tenant, &id, &kind, &revision])
            .await?;
        Ok(())
    }
}

/// A Postgres error is the service's fault (or the database's): 503, logged.
fn or_500(result: Result<Response<Full<Bytes>>, tokio_postgres::Error>) -> Response<Full<Bytes>> {
    result.unwrap_or_else(|e| {
        warn!(error = %e, "Postgres error");
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_error",
            "the database is unavailable",
        )
    })
}

// ---------------------------------------------------------------------------
// Responses

/// `{"tenant":..,"apps":[doc,doc]}` from rendered documents.
fn list_body(tenant: &str, docs: impl Iterator<Item = Bytes>) -> Response<Full<Bytes>> {
    let mut body = format!(r#"{{"tenant":{},"apps":["#, Value::from(tenant)).into_bytes();
    for (i, doc) in docs.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&doc);
    }
    body.extend_from_slice(b"]}");
    json_bytes(StatusCode::OK, body.into())
}

/// Ids are integers in `1..=i64::MAX` (a Postgres `bigint`); anything else
/// is a client error, answered before any lookup (the same shape check
/// sidecache applies in front).
fn parse_id(s: &str) -> Option<u64> {
    s.parse()
        .ok()
        .filter(|&id| id >= 1 && i64::try_from(id).is_ok())
}

fn tenant_not_found() -> Response<Full<Bytes>> {
    error(StatusCode::NOT_FOUND, "tenant_not_found", "no such tenant")
}

fn app_not_found(tenant: &str, id: u64) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": "not_found", "tenant": tenant, "id": id }),
    )
}

fn created(tenant: &str, id: u64, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = json_bytes(StatusCode::CREATED, body);
    if let Ok(location) = header::HeaderValue::from_str(&format!("/api/tenants/{tenant}/apps/{id}"))
    {
        resp.headers_mut().insert(header::LOCATION, location);
    }
    resp
}

fn no_content() -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .expect("static response parts are valid")
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
