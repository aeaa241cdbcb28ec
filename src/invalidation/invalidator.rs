//! The one path every invalidation takes, whatever its source (outbox,
//! stream, write-through, `POST /admin/invalidate`): validate against the
//! live config (the `ArcSwap` snapshot current when the batch is applied, so
//! a reload that adds a route also makes its events valid), replace the
//! generations of every valid event in one store call (its object's and
//! those of the objects its route relates to, or its tags'; version floors
//! first), grow the route's Bloom filter on `create` (docs/bloom.md#growth),
//! count `sidecache_invalidations_total{source,outcome,kind}` and the fan-out,
//! and tell the source each event's outcome so it can acknowledge, retry
//! or dead-letter it.
//!
//! Idempotent by construction: a generation is replaced with a fresh value,
//! so an event delivered twice (at-least-once sources) only causes one more
//! cache miss.

use super::event::{Event, EventKind, Poison, Validated};
use crate::bloom::Blooms;
use crate::config::{Config, Route};
use crate::metrics::Metrics;
use crate::store::{GuardedStore, StoreError, WitnessSlot};
use arc_swap::ArcSwap;
use futures_util::StreamExt;
use rand::Rng;
use std::sync::Arc;

/// Generation keys per store call.
const CHUNK: usize = 256;
/// Store calls of one batch in flight at once: a bulk change's chunks
/// overlap their round trips instead of waiting for each other (the store's
/// connections are multiplexed; a chunk's keys are independent of the
/// others', and replacing one generation twice is harmless).
const CHUNKS_IN_FLIGHT: usize = 4;
/// The value of a marker key.
const MARKER: &str = "1";

/// Where an event came from, as named in the `source` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The outbox worker's claims (at least once, dead-letters poison).
    Outbox,
    /// The outbox rows every instance applies as soon as it sees them.
    OutboxFanout,
    /// The stream consumer group (at least once, dead-letters poison).
    Stream,
    /// The stream entries every instance applies as they are appended.
    StreamFanout,
    WriteThrough,
    Admin,
    /// Change capture's logical replication consumer.
    Capture,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Outbox => "outbox",
            Source::OutboxFanout => "outbox_fanout",
            Source::Stream => "stream",
            Source::StreamFanout => "stream_fanout",
            Source::WriteThrough => "write_through",
            Source::Admin => "admin",
            Source::Capture => "capture",
        }
    }
}

/// What happened to one event of a batch.
#[derive(Debug, Clone)]
pub(crate) enum ApplyOutcome {
    /// The object's generation was replaced.
    Applied,
    /// The event can never apply: dead-letter it, do not retry.
    Poison(Poison),
    /// The store could not be reached: retry later.
    Failed(StoreError),
}

impl ApplyOutcome {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            ApplyOutcome::Applied => "applied",
            ApplyOutcome::Poison(_) => "poison",
            ApplyOutcome::Failed(_) => "failed",
        }
    }
}

/// Applies events from every source. Shared (`Arc`) by the sources.
pub struct Invalidator {
    config: Arc<ArcSwap<Config>>,
    store: Arc<GuardedStore>,
    /// Bloom growth for `create` events; `None` in tests without filters.
    blooms: Option<Arc<Blooms>>,
    metrics: Metrics,
    /// Poison from the outbox and the stream (they dead-letter it).
    dead_letters: super::recent::RecentDeadLetters,
}

impl Invalidator {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<GuardedStore>,
        blooms: Option<Arc<Blooms>>,
        metrics: Metrics,
    ) -> Invalidator {
        Invalidator {
            config,
            store,
            blooms,
            metrics,
            dead_letters: Default::default(),
        }
    }

    /// The latest dead-lettered events, newest first.
    pub(crate) fn recent_dead_letters(&self) -> Vec<super::recent::DeadLetter> {
        self.dead_letters.newest_first()
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store's key namespace (`store.namespace`).
    pub(crate) fn namespace(&self) -> String {
        self.config.load().store.namespace.clone()
    }

    /// Takes or renews a witness slot ([`super::witness`]).
    pub(crate) async fn witness(
        &self,
        slots: &[String],
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<WitnessSlot, StoreError> {
        self.store.witness(slots, owner, ttl).await
    }

    /// Deletes a witness slot if `owner` still holds it.
    pub(crate) async fn release_witness(
        &self,
        slot: &str,
        owner: &str,
    ) -> Result<bool, StoreError> {
        self.store.delete_if_equals(slot, owner.as_bytes()).await
    }

    /// Sets a marker key (change capture's "purged since the slot was
    /// created"): a plain value with a TTL.
    pub(crate) async fn set_marker(
        &self,
        key: &str,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.store.remember_tags(key, MARKER, ttl).await
    }

    /// Whether the marker key is set.
    pub(crate) async fn read_marker(&self, key: &str) -> Result<bool, StoreError> {
        let values = self.store.read_tags(&[key]).await?;
        Ok(values
            .first()
            .is_some_and(|v| v.as_deref() == Some(MARKER.as_bytes())))
    }

    /// Removes the marker key.
    pub(crate) async fn clear_marker(&self, key: &str) -> Result<bool, StoreError> {
        self.store.delete_if_equals(key, MARKER.as_bytes()).await
    }

    /// `None` while the feeds' store calls go through; else when the feeds'
    /// breaker lets the next one probe. A feed takes no events before then
    /// (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events):
    /// instances whose store works take them meanwhile.
    pub(crate) fn feeds_ready_at(&self) -> Option<tokio::time::Instant> {
        self.store.feeds_ready_at()
    }

    /// Resolves when the feeds' store calls go through again (early if the
    /// store answers a probe before the cooldown ends).
    pub(crate) async fn feeds_ready(&self) {
        self.store.feeds_ready().await
    }

    /// Applies a batch; the result has one outcome per input, in order.
    /// Inputs that already failed to parse are passed in as poison so that
    /// the outcome list lines up with the source's entries.
    pub(crate) async fn apply(
        &self,
        source: Source,
        events: Vec<Result<Event, Poison>>,
    ) -> Vec<ApplyOutcome> {
        let cfg = self.config.load_full();
        let checked = events
            .into_iter()
            .map(|e| e.and_then(|e| e.validate(&cfg)))
            .collect();
        let outcomes = self.apply_checked(source, &cfg, checked, None).await;
        self.record_dead_letters(source, &outcomes);
        outcomes
    }

    /// [`Invalidator::apply`] for feed events, each with its mark (its
    /// position in the feed, see `store::protocol::covers`): an event whose mark the
    /// generation already covers is left applied as it is (outcome
    /// `Applied`), so delivering an event to every instance costs one
    /// generation replacement, not one per instance.
    pub(crate) async fn apply_marked(
        &self,
        source: Source,
        events: Vec<(Result<Event, Poison>, String)>,
    ) -> Vec<ApplyOutcome> {
        let cfg = self.config.load_full();
        let mut checked = Vec::with_capacity(events.len());
        let mut marks = Vec::with_capacity(events.len());
        for (event, mark) in events {
            let valid = event.and_then(|e| e.validate(&cfg));
            if valid.is_ok() {
                marks.push(mark);
            }
            checked.push(valid);
        }
        let outcomes = self.apply_checked(source, &cfg, checked, Some(marks)).await;
        self.record_dead_letters(source, &outcomes);
        outcomes
    }

    /// The outbox and the stream dead-letter poison (shown on the status
    /// page); admin answers 400, and the fan-out leaves it to the group.
    fn record_dead_letters(&self, source: Source, outcomes: &[ApplyOutcome]) {
        if matches!(source, Source::Outbox | Source::Stream | Source::Capture) {
            for outcome in outcomes {
                if let ApplyOutcome::Poison(p) = outcome {
                    self.dead_letters.record(source.as_str(), &p.to_string());
                }
            }
        }
    }

    /// Write-through (docs/invalidation.md#sources): a 2xx answer to a write on
    /// a cached object's path invalidates the object. `params` were validated
    /// by the route match. Failure is logged and counted only; the outbox or
    /// stream stays the reliable path.
    pub(crate) async fn write_through(
        &self,
        cfg: &Config,
        route: &Arc<Route>,
        params: Vec<String>,
    ) {
        let event = Validated::new(cfg, route, params, EventKind::Invalidate);
        let outcome = self
            .apply_checked(Source::WriteThrough, cfg, vec![Ok(event)], None)
            .await;
        if let Some(ApplyOutcome::Failed(e)) = outcome.first() {
            tracing::warn!(route = %route.name, error = %e, "write-through invalidation failed");
        }
    }

    /// `marks`, if any, has one mark per valid event, in order.
    async fn apply_checked(
        &self,
        source: Source,
        cfg: &Config,
        checked: Vec<Result<Validated, Poison>>,
        marks: Option<Vec<String>>,
    ) -> Vec<ApplyOutcome> {
        // Floors first: a fill that takes its ticket after the generation
        // is replaced must find the floor already raised.
        let floors: Vec<(String, i64)> = checked
            .iter()
            .filter_map(|c| c.as_ref().ok()?.floor.clone())
            .collect();
        let feed = marks.is_some();
        // One result per floor, in the events' order (a feed's are per
        // master on a cluster: a dead master fails only its own).
        let mut floors_raised = self
            .store
            .raise_floors(&floors, cfg.gen_ttl, feed)
            .await
            .into_iter();
        // Every generation key of every valid event (its object, related
        // objects, tags), each with its event's mark. One store call per
        // chunk: a pipeline of a few hundred small scripts stays well
        // inside the store's command timeout, whatever `batch` is.
        let mut gen_keys = Vec::new();
        let mut key_marks = Vec::new();
        let mut marks = marks.map(Vec::into_iter);
        for valid in checked.iter().filter_map(|c| c.as_ref().ok()) {
            let mark = marks.as_mut().and_then(Iterator::next);
            for target in &valid.targets {
                gen_keys.push(target.gen_key.clone());
                if let Some(mark) = &mark {
                    key_marks.push(mark.clone());
                }
            }
        }
        let marked = marks.is_some();
        let nonce = nonce();
        let (nonce, key_marks) = (&nonce, &key_marks);
        // Collected first: a stream over the closure would not be `Send`
        // (its higher-ranked lifetimes).
        let calls: Vec<_> = gen_keys
            .chunks(CHUNK)
            .enumerate()
            .map(|(i, chunk)| async move {
                if marked {
                    let from = i * CHUNK;
                    let chunk_marks = key_marks.get(from..from + chunk.len()).unwrap_or_default();
                    self.store
                        .invalidate_marked(chunk, chunk_marks, nonce, cfg.gen_ttl)
                        .await
                } else {
                    let result = self.store.invalidate_many(chunk, nonce, cfg.gen_ttl).await;
                    vec![result; chunk.len()]
                }
            })
            .collect();
        // `buffered` keeps the chunks' order: results line up with keys.
        let mut stored = futures_util::stream::iter(calls)
            .buffered(CHUNKS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten();
        let mut outcomes = Vec::with_capacity(checked.len());
        for c in checked {
            let v = match c {
                Err(poison) => {
                    self.count(source, "poison", "event", 1);
                    outcomes.push(ApplyOutcome::Poison(poison));
                    continue;
                }
                Ok(v) => v,
            };
            // The event failed if any of its keys (or its floor) did.
            let mut failed = match v.floor {
                Some(_) => floors_raised
                    .next()
                    .unwrap_or(Err(StoreError::Protocol("no floor result".into())))
                    .err(),
                None => None,
            };
            for _ in &v.targets {
                let result = stored
                    .next()
                    .unwrap_or(Err(StoreError::Protocol("no result".into())));
                if let (None, Err(e)) = (&failed, result) {
                    failed = Some(e);
                }
            }
            let outcome = match failed {
                Some(e) => ApplyOutcome::Failed(e),
                None => self.grow_bloom(cfg, &v).await,
            };
            for target in &v.targets {
                self.count(source, outcome.as_str(), target.kind.as_str(), 1);
            }
            if matches!(outcome, ApplyOutcome::Applied) {
                self.metrics
                    .invalidation_fanout
                    .with_label_values(&[source.as_str()])
                    .observe(v.targets.len() as f64);
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    fn count(&self, source: Source, outcome: &str, kind: &str, n: u64) {
        self.metrics
            .invalidations
            .with_label_values(&[source.as_str(), outcome, kind])
            .inc_by(n);
    }

    /// A `create` event adds its id to the route's filter, or the filter
    /// could reject an object that exists. A store error makes the event
    /// `Failed` (retried), never lost.
    async fn grow_bloom(&self, cfg: &Config, event: &Validated) -> ApplyOutcome {
        let (Some(blooms), Some(object)) = (
            self.blooms
                .as_ref()
                .filter(|_| event.kind == EventKind::Create),
            &event.object,
        ) else {
            return ApplyOutcome::Applied;
        };
        match blooms.created(cfg, &object.route, &object.params).await {
            Ok(()) => ApplyOutcome::Applied,
            Err(e) => ApplyOutcome::Failed(e),
        }
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

    fn invalidator(metrics: &Metrics) -> (Invalidator, Arc<GuardedStore>) {
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
            Invalidator::new(config, store.clone(), None, metrics.clone()),
            store,
        )
    }

    fn event(tenant: &str, id: &str) -> Result<Event, Poison> {
        Ok(Event {
            route: "app".into(),
            params: BTreeMap::from([("tenant".into(), tenant.into()), ("id".into(), id.into())]),
            kind: EventKind::Invalidate,
            revision: None,
            tags: vec![],
        })
    }

    #[tokio::test]
    async fn outcomes_line_up_with_inputs_across_chunks() {
        let metrics = Metrics::new();
        let (invalidator, _) = invalidator(&metrics);
        let mut events: Vec<_> = (1..=600).map(|i| event("a", &i.to_string())).collect();
        events.insert(3, event("a", "0"));
        events.insert(300, Err(Poison::Malformed("x".into())));
        let outcomes = invalidator.apply(Source::Outbox, events).await;
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
        let count = |outcome, kind| {
            metrics
                .invalidations
                .with_label_values(&["outbox", outcome, kind])
                .get()
        };
        assert_eq!(
            (count("applied", "object"), count("poison", "event")),
            (600, 2)
        );
    }

    #[tokio::test]
    async fn applying_twice_replaces_the_generation_again() {
        let metrics = Metrics::new();
        let (invalidator, store) = invalidator(&metrics);
        let gen_key =
            crate::keys::generation_key("sc:", &crate::keys::identity("app", &["a", "7"]));
        invalidator
            .apply(Source::Outbox, vec![event("a", "7")])
            .await;
        let first = store.ticket(&gen_key, "n", Duration::from_secs(60)).await;
        invalidator
            .apply(Source::Outbox, vec![event("a", "7")])
            .await;
        let second = store.ticket(&gen_key, "n", Duration::from_secs(60)).await;
        assert_ne!(first.unwrap(), second.unwrap());
    }
}
