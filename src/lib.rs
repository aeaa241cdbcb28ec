//! sidecache: a transparent caching sidecar reverse proxy.
//!
//! Module map:
//! - [`config`]: the YAML file model, validation into a typed `Config`, route
//!   templates and matching, hot reload.
//! - [`proxy`]: the client-facing hyper server, the pooled upstream client and
//!   streaming forwarding of everything that is not a cache read.
//! - [`pipeline`]: the read pipeline for cached routes, one file per stage.
//! - [`store`]: the `Store` trait with the Redis and embedded backends, the
//!   Lua scripts, and the circuit breaker that guards every store call.
//! - [`bloom`]: the Bloom filter: sizing, hashing (test vectors), builds,
//!   growth by `create` events, and the checks of pipeline stage 4.
//! - [`invalidation`]: the event model and the sources that apply events.
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/readyz`, `/admin/*`).
//! - [`metrics`]: metric names and the Prometheus registry.
//! - [`error`]: error kinds and the one mapping from errors to HTTP answers.
//! - [`app`]: wiring: builds the store, listeners and background tasks.

pub mod admin;
pub mod app;
pub mod bloom;
pub mod body;
pub mod config;
pub mod error;
pub mod invalidation;
pub mod keys;
pub mod metrics;
pub mod pipeline;
pub mod proxy;
pub mod server;
pub mod store;
