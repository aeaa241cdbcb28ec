//! All integration tests, in one test binary (one link instead of one per
//! file). Each module is one concern; `support` is the shared harness of
//! real servers (see its module doc). Run one module with e.g.
//! `cargo test --test it cache::`.

// These tests wait for and time real servers and processes: std's clock is
// the one they mean (clippy.toml's rule is about the library's timers).
#![allow(clippy::disallowed_types)]
// A test binary has no outside: `pub` is how its modules share the harness.
#![allow(unreachable_pub)]

mod support;

mod access_log;
mod admin;
mod answers;
mod bloom;
mod bloom_postgres;
mod cache;
mod cache_redis;
mod capture;
mod check;
mod client_cc;
mod cluster_breaker;
mod dashboards;
mod degraded_join;
mod depinv;
mod doomed_fill;
mod example_postgres;
mod fill_hardening;
mod fill_stream;
mod forwarding;
mod history;
mod hit_for_pass;
mod invalidation_binary;
mod join_current;
mod kubernetes;
mod limits;
mod lookup;
mod near_cluster_binary;
mod origin_ttl;
mod origin_vary;
mod outbox;
mod paused_instance;
mod prefix;
mod reload;
mod replicas_ack;
mod revalidate;
mod runtime_layout;
mod schema;
mod sentinel;
mod stale;
mod status_page;
mod store;
mod store_refusals;
mod stream;
mod stream_cluster;
mod tls;
mod witness;
