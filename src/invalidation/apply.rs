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

/// Generation keys per store call.
const CHUNK: usize = 256;

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
        // One store call per chunk: a pipeline of a few hundred small
        // scripts stays well inside the store's command timeout, whatever
        // `batch` is. `stored[i]` is the result for the i-th valid event.
        let gen_keys: Vec<String> = checked
            .iter()
            .filter_map(|c| c.as_ref().ok().map(|v| v.gen_key.clone()))
            .collect();
        let nonce = nonce();
        let mut stored: Vec<Result<(), StoreError>> = Vec::with_capacity(gen_keys.len());
        for chunk in gen_keys.chunks(CHUNK) {
            let result = self.store.invalidate_many(chunk, &nonce, cfg.gen_ttl).await;
            stored.extend(std::iter::repeat_n(result, chunk.len()));
        }
        let mut stored = stored.into_iter();
        let mut outcomes = Vec::with_capacity(checked.len());
        for c in checked {
            let outcome = match c {
                Err(poison) => ApplyOutcome::Poison(poison),
                Ok(v) => match stored
                    .next()
                    .unwrap_or(Err(StoreError::Protocol("no result".into())))
                {
                    Err(e) => ApplyOutcome::Failed(e),
                    Ok(()) => match (&self.create_hook, v.kind) {
                        (Some(hook), EventKind::Create) => match hook.created(&v).await {
                            Ok(()) => ApplyOutcome::Applied,
                            Err(e) => ApplyOutcome::Failed(e),
                        },
                        _ => ApplyOutcome::Applied,
                    },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn applier(metrics: &Metrics) -> (Applier, Arc<GuardedStore>) {
        let yaml = r#"
version: 1
listen: 127.0.0.1:1
admin: { listen: 127.0.0.1:2 }
upstream: { url: "http://127.0.0.1:9" }
routes:
  - name: app
    path: /t/{tenant}/a/{id}
    params: { tenant: "[a-z]+", id: "[1-9][0-9]*" }
    ttl: 60s
"#;
        let cfg = Config::parse(yaml, &|_| None).expect("config");
        let store = Arc::new(GuardedStore::new(
            Arc::new(MemoryStore::new()),
            None,
            Duration::from_secs(1),
            metrics,
        ));
        let config = Arc::new(ArcSwap::from_pointee(cfg));
        (
            Applier::new(config, store.clone(), metrics.clone(), Source::Outbox),
            store,
        )
    }

    fn event(tenant: &str, id: &str) -> Result<Event, Poison> {
        Ok(Event {
            route: "app".into(),
            params: BTreeMap::from([("tenant".into(), tenant.into()), ("id".into(), id.into())]),
            kind: EventKind::Invalidate,
            revision: None,
        })
    }

    #[tokio::test]
    async fn outcomes_line_up_with_inputs_across_chunks() {
        let metrics = Metrics::new();
        let (applier, _) = applier(&metrics);
        let mut events: Vec<_> = (1..=600).map(|i| event("a", &i.to_string())).collect();
        events.insert(3, event("a", "0"));
        events.insert(300, Err(Poison::Malformed("x".into())));
        let outcomes = applier.apply(events).await;
        assert_eq!(outcomes.len(), 602);
        assert!(matches!(
            outcomes[3],
            ApplyOutcome::Poison(Poison::BadParam(_))
        ));
        assert!(matches!(
            outcomes[300],
            ApplyOutcome::Poison(Poison::Malformed(_))
        ));
        let applied = outcomes
            .iter()
            .filter(|o| matches!(o, ApplyOutcome::Applied))
            .count();
        assert_eq!(applied, 600);
        let count = |outcome| {
            metrics
                .invalidations
                .with_label_values(&["outbox", outcome])
                .get()
        };
        assert_eq!((count("applied"), count("poison")), (600, 2));
    }

    #[tokio::test]
    async fn applying_twice_replaces_the_generation_again() {
        let metrics = Metrics::new();
        let (applier, store) = applier(&metrics);
        let gen_key = crate::pipeline::key::generation_key(
            "sc:",
            &crate::pipeline::key::identity("app", &["a", "7"]),
        );
        applier.apply(vec![event("a", "7")]).await;
        let first = store.ticket(&gen_key, "n", Duration::from_secs(60)).await;
        applier.apply(vec![event("a", "7")]).await;
        let second = store.ticket(&gen_key, "n", Duration::from_secs(60)).await;
        assert_ne!(first.unwrap(), second.unwrap());
    }
}
