//! sidecache: a transparent caching sidecar reverse proxy.
//!
//! Modules by layer, top to bottom; each imports only from layers below it:
//! - [`app`]: wiring, the one place that builds the parts and hands each
//!   what it needs (store, Bloom manager, invalidator, pipeline, listeners).
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/readyz`, `/admin/*`).
//! - [`access_log`]: one line per client request, through a bounded buffer
//!   to one writer thread.
//! - [`status`]: the admin listener's status page (`/`) and its JSON
//!   (`/admin/status`).
//! - [`explain`]: explain one URL (`/admin/lookup`, `sidecache lookup`):
//!   route, keys, what the store and the near cache hold, the verdict.
//! - [`server`]: the client-facing hyper server: connections, the framing
//!   guard, and per request the choice between the read pipeline, plain
//!   forwarding and write-through invalidation.
//! - [`pipeline`] and [`invalidation`], side by side: the read pipeline for
//!   cached routes (one file per stage), and the [`invalidation::Invalidator`]
//!   that every change feed goes through.
//! - [`bloom`]: the Bloom filter: hashing (test vectors), builds, growth by
//!   `create` events, and the checks of pipeline stage 4.
//! - [`store`]: the `Store` trait with the Redis and embedded backends, the
//!   Lua scripts, and the circuit breaker that guards every store call.
//! - [`tags`]: what a cache tag may be and how many an answer or event
//!   carries (shared by the pipeline and invalidation).
//! - [`keys`]: the key layout (identity, variant, key names, hash tags),
//!   shared by the pipeline, invalidation, Bloom filters and the store.
//! - [`proxy`]: the upstream side: streaming forwarding and the pooled
//!   upstream client.
//! - [`config`]: the YAML file model, validation into a typed `Config`, route
//!   templates and their matching on the normal form of request paths, the
//!   reload watcher.
//! - [`pg`]: connecting to Postgres (outbox worker, Bloom source): the
//!   connection string's `sslmode`/`sslrootcert` and TLS over rustls;
//!   [`tls`]: what the Postgres and Redis connections share about TLS.
//! - [`error`], [`body`], [`metrics`]: error kinds and their HTTP answers, the
//!   one body type, metric names and the Prometheus registry.

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
