//! Applying invalidation events: validate a batch against the live config
//! (the `ArcSwap` snapshot current when the batch is applied, so a reload
//! that adds a route also makes its events valid), replace the generations
//! of every valid event in one store call, and tell the source each event's
//! outcome so it can acknowledge, retry or dead-letter it.
//!
//! Idempotent by construction: a generation is replaced with a fresh value,
//! so an event delivered twice (at-least-once sources) only causes one more
//! cache miss.

use super::event::{Event, EventKind, Poison, Validated};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{BoxFuture, GuardedStore, StoreError};
use arc_swap::ArcSwap;
use rand::Rng;
use std::sync::Arc;

/// Where an event came from, as named in the `source` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Outbox,
    Stream,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Outbox => "outbox",
            Source::Stream => "stream",
        }
    }
}

/// What happened to one event of a batch.
#[derive(Debug, Clone)]
pub enum ApplyOutcome {
    /// The object's generation was replaced.
    Applied,
    /// The event can never apply: dead-letter it, do not retry.
    Poison(Poison),
    /// The store could not be reached: retry later.
    Failed(StoreError),
}

impl ApplyOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            ApplyOutcome::Applied => "applied",
            ApplyOutcome::Poison(_) => "poison",
            ApplyOutcome::Failed(_) => "failed",
        }
    }
}

/// The seam for the Bloom filter's growth (SPEC §6): a `create` event must
/// add the new id to the route's filter, or the filter could reject an
/// object that exists. The Bloom issue implements this; until then the
/// [`Applier`] has no hook and `create` behaves like `invalidate`.
pub trait CreateHook: Send + Sync + 'static {
    /// Adds the created object to whatever filters cover it. An error makes
    /// the event `Failed` (retried), never lost.
    fn created<'a>(&'a self, event: &'a Validated) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// Applies events from one source. Cheap to clone.
#[derive(Clone)]
pub struct Applier {
    config: Arc<ArcSwap<Config>>,
    store: Arc<GuardedStore>,
    metrics: Metrics,
    source: Source,
    create_hook: Option<Arc<dyn CreateHook>>,
}

impl Applier {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<GuardedStore>,
        metrics: Metrics,
        source: Source,
    ) -> Applier {
        Applier {
            config,
            store,
            metrics,
            source,
            create_hook: None,
        }
    }

    /// Installs the Bloom growth hook for `create` events.
    pub fn with_create_hook(mut self, hook: Arc<dyn CreateHook>) -> Applier {
        self.create_hook = Some(hook);
        self
    }

    pub fn source(&self) -> Source {
        self.source
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Applies a batch; the result has one outcome per input, in order.
    /// Inputs that already failed to parse are passed in as poison so that
    /// the outcome list lines up with the source's entries.
    pub async fn apply(&self, events: Vec<Result<Event, Poison>>) -> Vec<ApplyOutcome> {
        let cfg = self.config.load_full();
        let checked: Vec<Result<Validated, Poison>> = events
            .into_iter()
            .map(|e| e.and_then(|e| e.validate(&cfg)))
            .collect();
        let gen_keys: Vec<String> = checked
            .iter()
            .filter_map(|c| c.as_ref().ok().map(|v| v.gen_key.clone()))
            .collect();
        let stored = self
            .store
            .invalidate_many(&gen_keys, &nonce(), cfg.gen_ttl)
            .await;
        let mut outcomes = Vec::with_capacity(checked.len());
        for c in checked {
            let outcome = match (c, &stored) {
                (Err(poison), _) => ApplyOutcome::Poison(poison),
                (Ok(_), Err(e)) => ApplyOutcome::Failed(e.clone()),
                (Ok(v), Ok(())) => match (&self.create_hook, v.kind) {
                    (Some(hook), EventKind::Create) => match hook.created(&v).await {
                        Ok(()) => ApplyOutcome::Applied,
                        Err(e) => ApplyOutcome::Failed(e),
                    },
                    _ => ApplyOutcome::Applied,
                },
            };
            self.metrics
                .invalidations
                .with_label_values(&[self.source.as_str(), outcome.as_str()])
                .inc();
            outcomes.push(outcome);
        }
        outcomes
    }
}

fn nonce() -> String {
    format!("{:016x}", rand::rng().random::<u64>())
}
