//! Invalidation: how caches learn of changes (docs/invalidation.md).
//!
//! - [`event`]: the model every source shares (`{route, params, kind,
//!   revision?}`, validated against the live route table; invalid events
//!   are poison and get dead-lettered, never retried).
//! - [`invalidator`]: the [`Invalidator`], the one path every event takes
//!   (validation, generation replaced, Bloom growth on `create`, metrics),
//!   with a per-event outcome for the source.
//! - [`ddl`]: the SQL of `sidecache outbox-ddl`.
//! - [`recent`]: the last dead-lettered events, for the status page.
//! - [`outbox`]: the Postgres outbox worker (claim with `SKIP LOCKED`,
//!   apply, delete in the same transaction; LISTEN/NOTIFY wake-ups; the
//!   fan-out of unlocked pending rows).
//! - [`stream`]: the Redis Stream consumer (consumer group, ack after apply,
//!   claim from dead consumers, dead-letter stream; the fan-out of every
//!   entry from a cursor of its own).
//!
//! - [`witness`]: which instances run the fan-out (`k` slots in the store).
//! - [`capture`]: change capture from the service's own tables: trigger
//!   SQL for the outbox, or a logical replication consumer.
//!
//! Both feeds fan out so that no instance waits for another: besides the
//! consumer the feed hands an event to, `k` witnesses apply every event as
//! soon as they see it, marked with the event's position in its feed so
//! that only the first application replaces the generation
//! (`lua/invalidate_marked.lua`); the claim and the group stay the reliable
//! path.
//!
//! Other sources: `POST /admin/invalidate` (admin) and write-through
//! (the client-facing server), through the same [`Invalidator`]. Delivery is at least once everywhere: applying an event
//! twice is harmless because a generation is replaced, never incremented.

pub(crate) mod backoff;
pub mod capture;
pub mod ddl;
pub(crate) mod event;
pub(crate) mod invalidator;
pub(crate) mod outbox;
pub(crate) mod recent;
pub(crate) mod stream;
pub(crate) mod stream_conn;
pub(crate) mod witness;

pub(crate) use event::{Event, Poison};
pub(crate) use invalidator::ApplyOutcome;
pub use invalidator::{Invalidator, Source};
pub use outbox::OutboxWorker;
pub use stream::StreamConsumer;
pub use stream_conn::StreamTarget;

use crate::config::{Config, RedisTarget};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Starts the configured background sources (outbox worker, stream
/// consumer) on the current runtime. They run until `shutdown` becomes true;
/// await the handles to let a cycle in progress finish. Settings are taken
/// from `cfg` at start (changing them needs a restart); events are
/// validated against the live config by the [`Invalidator`].
pub fn spawn_sources(
    cfg: &Config,
    invalidator: &Arc<Invalidator>,
    shutdown: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let Some(outbox) = &cfg.invalidation.outbox {
        let worker = outbox::OutboxWorker::new(outbox.clone(), invalidator.clone())
            .with_witnesses(cfg.invalidation.witnesses);
        tasks.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    if let Some(capture) = &cfg.invalidation.capture {
        // `mode: triggers` writes outbox rows: the outbox worker (always
        // configured with it) applies them.
        if capture.mode == crate::config::capture::CaptureMode::Logical {
            let consumer =
                capture::logical::LogicalConsumer::new(capture.clone(), invalidator.clone());
            tasks.push(tokio::spawn(consumer.run(shutdown.clone())));
        }
    }
    if let Some(stream) = &cfg.invalidation.stream {
        // Validation only accepts a stream with a Redis store.
        if let Some(redis) = &cfg.store.redis {
            let target = match &redis.target {
                RedisTarget::Single(url) => stream_conn::StreamTarget::Single(url.clone()),
                RedisTarget::Cluster(seeds) => stream_conn::StreamTarget::Cluster(seeds.clone()),
                RedisTarget::Sentinel(s) => stream_conn::StreamTarget::Sentinel(s.clone()),
            };
            let consumer = stream::StreamConsumer::new(
                stream.clone(),
                target,
                redis.tls.clone(),
                invalidator.clone(),
            )
            .with_witnesses(cfg.invalidation.witnesses);
            tasks.push(tokio::spawn(consumer.run(shutdown.clone())));
        }
    }
    tasks
}

/// `host-pid-random`: unique per process (a restarted process is a new
/// one), naming the process for an operator reading consumer names and
/// witness slots.
pub(crate) fn process_token() -> String {
    use rand::Rng;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::rng().random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn process_tokens_are_unique_and_name_the_process() {
        let (a, b) = (super::process_token(), super::process_token());
        assert_ne!(a, b);
        assert!(a.contains(&format!("-{}-", std::process::id())));
    }
}
