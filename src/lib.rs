//! sidecache: a transparent caching sidecar reverse proxy.
//!
//! # The public surface
//!
//! The library exists for the `sidecache` binary (`src/main.rs`), the
//! integration tests (`tests/it`) and the example service
//! (`examples/upstream.rs`). A function, method or constant is `pub` only
//! if one of them uses it; the typed config and the metrics registry are
//! public with all their fields, as data. Everything else is `pub(crate)`
//! (the `unreachable_pub` lint keeps it so, and rustc then reports what
//! nothing uses). What is public:
//! - for the binary: [`App`] and [`shutdown_signal`] (serve until a
//!   signal), [`lookup`] (`sidecache lookup`'s client side),
//!   [`invalidation::ddl`] and [`invalidation::capture`] (`outbox-ddl`,
//!   `capture-ddl`, `check --db`), and [`config`], the typed configuration
//!   it validates and prints;
//! - for the tests, which drive the parts on their own: [`config::Config`]
//!   built from YAML, [`metrics::Metrics`] (its gauges and counters are
//!   read back), [`store`] (the store traits, both backends, the guard and
//!   [`store::open`]: the store suite runs the same protocol against each),
//!   [`keys`] (the key names, to look at Redis directly), [`bloom`] (the
//!   Bloom manager, id sources, the hash test vectors, the build locks'
//!   TTLs), [`invalidation`] (the [`invalidation::Invalidator`], the feeds'
//!   workers and [`invalidation::spawn_sources`]) and [`PgConnector`]
//!   (Postgres over TLS).
//!
//! Each of those modules re-exports at its root what is public and keeps
//! its submodules crate-private (`invalidation::ddl` and
//! `invalidation::capture::ddl`, small and whole, are public modules).
//!
//! # Layers
//!
//! Modules by layer, top to bottom; each imports only from layers below it:
//! - `app`: wiring, the one place that builds the parts and hands each
//!   what it needs (store, Bloom manager, invalidator, pipeline, listeners).
//! - `admin`: the admin listener (`/metrics`, `/healthz`, `/readyz`,
//!   `/admin/*`).
//! - `status`: the admin listener's status page (`/`) and its JSON
//!   (`/admin/status`).
//! - `explain`: explain one URL (`/admin/lookup`, `sidecache lookup`):
//!   route, keys, what the store and the near cache hold, the verdict.
//! - `server`: the client-facing hyper server: connections, the framing
//!   guard, and per request the choice between the read pipeline, plain
//!   forwarding and write-through invalidation.
//! - `access_log`: one line per client request (the server writes it),
//!   through per-thread shards to one writer thread.
//! - `pipeline` and [`invalidation`], side by side: the read pipeline for
//!   cached routes (one file per stage), and the
//!   [`invalidation::Invalidator`] that every change feed goes through.
//! - [`bloom`]: the Bloom filter: hashing (test vectors), builds, growth by
//!   `create` events, and the checks of pipeline stage 4.
//! - [`store`]: the store contract (a trait per capability), the Redis and
//!   embedded backends (a folder each), and the guard (timeouts and circuit
//!   breakers) that every store call goes through.
//! - `tags`: what a cache tag may be and how many an answer or event
//!   carries (shared by the pipeline and invalidation).
//! - [`keys`]: the key layout (identity, variant, key names, hash tags),
//!   shared by the pipeline, invalidation, Bloom filters and the store.
//! - `proxy`: the upstream side: streaming forwarding and the pooled
//!   upstream client.
//! - [`config`]: the YAML file model, validation into a typed `Config`, route
//!   templates and their matching on the normal form of request paths, the
//!   reload watcher.
//! - `error`, `body`, [`metrics`], `outcome`: error kinds and their HTTP
//!   answers, the one body type, metric names and the Prometheus registry,
//!   and what the pipeline did with a request (the `X-Cache` value, which
//!   metrics and the access log also speak).
//! - `pg`: connecting to Postgres (outbox worker, Bloom source, change
//!   capture): the connection string's `sslmode`/`sslrootcert` and TLS over
//!   rustls; `tls`: what the Postgres and Redis connections share about TLS.

pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod app;
pub mod bloom;
pub(crate) mod body;
pub mod config;
pub(crate) mod error;
pub(crate) mod explain;
pub mod invalidation;
pub mod keys;
pub mod metrics;
pub(crate) mod outcome;
pub(crate) mod pg;
pub(crate) mod pipeline;
pub(crate) mod proxy;
pub(crate) mod server;
pub(crate) mod status;
pub mod store;
pub(crate) mod tags;
pub(crate) mod tls;

pub use app::{shutdown_signal, App};
pub use explain::cli as lookup;
pub use pg::{PgConnector, PgError};
