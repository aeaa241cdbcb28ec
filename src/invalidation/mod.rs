//! Invalidation: how caches learn of changes (SPEC §7).
//!
//! - [`event`]: the model every source shares (`{route, params, kind,
//!   revision?}`, validated against the live route table; invalid events
//!   are poison and get dead-lettered, never retried).
//! - [`apply`]: validates a batch against the current config and applies
//!   the valid events to the store in one call, with a per-event outcome.
//! - [`ddl`]: the SQL of `sidecache outbox-ddl`.
//! - [`outbox`]: the Postgres outbox worker (claim with `SKIP LOCKED`,
//!   apply, delete in the same transaction; LISTEN/NOTIFY wake-ups).
//! - [`stream`]: the Redis Stream consumer (consumer group, ack after apply,
//!   claim from dead consumers, dead-letter stream).
//!
//! Other sources: `POST /admin/invalidate` (admin) and write-through
//! (pipeline). Delivery is at least once everywhere: applying an event
//! twice is harmless because a generation is replaced, never incremented.

pub mod apply;
pub mod backoff;
pub mod ddl;
pub mod event;
pub mod outbox;
pub mod stream;

pub use apply::{Applier, ApplyOutcome, CreateHook, Source};
pub use event::{Event, EventKind, Poison, Validated};

use crate::config::{Config, RedisTarget};
use crate::metrics::Metrics;
use crate::store::GuardedStore;
use arc_swap::ArcSwap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Starts the configured background sources (outbox worker, stream
/// consumer) on the current runtime. They run until `shutdown` becomes true;
/// await the handles to let a cycle in progress finish. Settings are taken
/// from the config at start (changing them needs a restart); events are
/// validated against the live config.
pub fn spawn_sources(
    config: &Arc<ArcSwap<Config>>,
    store: &Arc<GuardedStore>,
    metrics: &Metrics,
    shutdown: &watch::Receiver<bool>,
    create_hook: Option<Arc<dyn CreateHook>>,
) -> Vec<JoinHandle<()>> {
    let hooked = |applier: Applier| match &create_hook {
        Some(hook) => applier.with_create_hook(hook.clone()),
        None => applier,
    };
    let cfg = config.load();
    let mut tasks = Vec::new();
    if let Some(outbox) = &cfg.invalidation.outbox {
        let applier = hooked(Applier::new(
            config.clone(),
            store.clone(),
            metrics.clone(),
            Source::Outbox,
        ));
        let worker = outbox::OutboxWorker::new(outbox.clone(), applier);
        tasks.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    if let Some(stream) = &cfg.invalidation.stream {
        // Validation only accepts a stream with a single-node store.
        if let Some(RedisTarget::Single(url)) = cfg.store.redis.as_ref().map(|r| &r.target) {
            let applier = hooked(Applier::new(
                config.clone(),
                store.clone(),
                metrics.clone(),
                Source::Stream,
            ));
            let consumer = stream::StreamConsumer::new(stream.clone(), url.clone(), applier);
            tasks.push(tokio::spawn(consumer.run(shutdown.clone())));
        }
    }
    tasks
}
