//! The Bloom filter (docs/architecture.md#bloom-filter): per route and scope
//! value, a bitmap in the store that lets stage 4 of the read pipeline reject
//! ids that certainly do not exist, without ever rejecting a real object.
//!
//! - [`hash`]: bit positions (double hashing over SHA-256, pinned by test
//!   vectors) and the signature written to `ready`.
//! - [`source`]: where members come from ([`source::IdSource`]; Postgres).
//! - [`build`]: one build: lock + candidate, batched fill, activation.
//! - [`Blooms`] (here): the per-process manager: checks for the pipeline,
//!   growth by `create` events ([`Blooms::add_member`]), and when builds run.
//!
//! When filters are built:
//! - An unscoped filter (`scope` without params) is built at start and then
//!   every `rebuild_every`. A failed build leaves the filter unknown (or the
//!   old one active); start continues.
//! - A scoped filter (`scope: "{tenant}"`) is one per scope value, and the
//!   values are not known in advance (there is no generic way to list them).
//!   It is built lazily: the first check that answers unknown for a scope
//!   value starts a background build (that request and those until the
//!   build activates take the normal path), at most once per
//!   [`RETRY_AFTER`] per scope, at most [`MAX_CONCURRENT_BUILDS`] at once.
//!   From then on this instance rebuilds the scopes it has seen every
//!   `rebuild_every`; it tracks at most [`MAX_SCOPES`] per route, so random
//!   scope values cannot make it run unbounded builds or metric series.
//! - On `POST /admin/bloom/{route}/rebuild?scope=...`.
//!
//! Several instances share one filter; the build lock makes one of them
//! build at a time, the others see `busy` and take that as done.

pub(crate) mod build;
pub(crate) mod hash;
pub(crate) mod source;

pub use build::{BuildOutcome, CANDIDATE_TTL, LOCK_TTL};
pub use hash::{positions, signature};
pub use source::{BoxFuture, IdSource, IdStream, PgSource, SourceError, StaticSource};

use crate::config::bloom::BloomConfig;
use crate::config::{Config, Route};
use crate::keys::{bloom_keys, BloomKeys};
use crate::metrics::BloomMetrics;
use crate::store::bloom::BloomAnswer;
use crate::store::{GuardedStore, StoreError};
use arc_swap::ArcSwap;
use build::BuildError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// After a build that did not activate (failure, capacity), wait this long
/// before the next attempt for that scope.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(30);
/// Builds running at once in this process (background and lazy; admin
/// rebuilds wait for a slot).
pub(crate) const MAX_CONCURRENT_BUILDS: usize = 2;
/// Scope values tracked per route.
pub(crate) const MAX_SCOPES: usize = 1024;
/// How often the maintenance task looks for due builds.
const TICK: Duration = Duration::from_secs(1);

/// Why a build runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// A check found the filter unknown: build now (the lock dedups).
    Unknown,
    /// `rebuild_every` passed here: once per interval, fleet-wide.
    Due,
    /// The admin endpoint: now, waiting for a build slot.
    Asked,
}

/// What this process knows about one filter.
#[derive(Default)]
struct ScopeState {
    building: bool,
    /// When a build of this process last ended, and whether it activated
    /// (or found another instance building).
    last_build: Option<(Instant, bool)>,
    /// Last known readiness of the shared filter (from checks and builds).
    ready: Option<bool>,
    /// Last state exported to the gauge (0 unready, 1 ready, 2 building).
    exported: Option<i64>,
}

/// The per-process Bloom manager. Shared (`Arc`) by the pipeline, the admin
/// endpoint, the invalidation sources and the maintenance task.
pub struct Blooms {
    store: Arc<GuardedStore>,
    source: Option<Arc<dyn IdSource>>,
    metrics: BloomMetrics,
    /// `(route, scope)` -> state.
    scopes: Mutex<HashMap<(String, String), ScopeState>>,
    builds: Semaphore,
}

impl Blooms {
    /// `source` is `None` when no membership database is configured: checks
    /// still use filters that other instances build, none are built here.
    pub fn new(
        store: Arc<GuardedStore>,
        source: Option<Arc<dyn IdSource>>,
        registry: &prometheus::Registry,
    ) -> Arc<Blooms> {
        Arc::new(Blooms {
            store,
            source,
            metrics: BloomMetrics::new(registry),
            scopes: Mutex::new(HashMap::new()),
            builds: Semaphore::new(MAX_CONCURRENT_BUILDS),
        })
    }

    pub fn metrics(&self) -> &BloomMetrics {
        &self.metrics
    }

    fn scopes(&self) -> MutexGuard<'_, HashMap<(String, String), ScopeState>> {
        // Every critical section leaves the map consistent.
        self.scopes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stage 4: checks the member named by `params` (route param order).
    /// An unknown answer starts a lazy build of that scope. Store errors
    /// are returned (the caller continues as if unknown).
    pub async fn check(
        self: &Arc<Self>,
        cfg: &Arc<Config>,
        route: &Arc<Route>,
        bloom: &BloomConfig,
        params: &[String],
    ) -> Result<BloomAnswer, StoreError> {
        let scope = bloom.scope_value(params);
        let answer = self.peek(cfg, route, bloom, params).await;
        let label = answer.as_ref().map_or("error", |a| a.as_str());
        self.metrics
            .checks
            .with_label_values(&[&route.name, label])
            .inc();
        match answer {
            Ok(BloomAnswer::Unknown) => {
                self.note(&route.name, &scope, Some(false));
                self.build_lazily(cfg, route, &scope);
            }
            Ok(_) => self.note(&route.name, &scope, Some(true)),
            Err(_) => {}
        }
        answer
    }

    /// The filter's answer for the member named by `params`, and nothing
    /// else: not counted, no lazy build (`/admin/lookup`; stage 4 uses it).
    pub(crate) async fn peek(
        &self,
        cfg: &Config,
        route: &Route,
        bloom: &BloomConfig,
        params: &[String],
    ) -> Result<BloomAnswer, StoreError> {
        let scope = bloom.scope_value(params);
        let id = params.get(bloom.id_param).map_or("", String::as_str);
        let keys = bloom_keys(&cfg.store.namespace, &route.name, &scope);
        let positions = hash::positions(&route.name, &scope, id, bloom.sizing);
        let signature = hash::signature(bloom.sizing);
        self.store
            .bloom_check(&keys, &signature, bloom.sizing.m, &positions)
            .await
    }

    /// Records what a check or build learned (`None`: nothing new) and
    /// exports the gauge on change. Scopes beyond [`MAX_SCOPES`] are not
    /// tracked.
    fn note(&self, route: &str, scope: &str, ready: Option<bool>) {
        let mut scopes = self.scopes();
        let key = (route.to_owned(), scope.to_owned());
        if !scopes.contains_key(&key) {
            let per_route = scopes.keys().filter(|(r, _)| r == route).count();
            if per_route >= MAX_SCOPES {
                return;
            }
        }
        let state = scopes.entry(key).or_default();
        if ready.is_some() {
            state.ready = ready;
        }
        let value = match (state.building, state.ready) {
            (true, _) => 2,
            (false, Some(true)) => 1,
            (false, _) => 0,
        };
        if state.exported != Some(value) {
            state.exported = Some(value);
            self.metrics
                .state
                .with_label_values(&[route, scope])
                .set(value);
        }
    }

    /// Starts a background build of `scope` unless one is running here, one
    /// ended less than [`RETRY_AFTER`] ago, or all build slots are busy.
    fn build_lazily(self: &Arc<Self>, cfg: &Arc<Config>, route: &Arc<Route>, scope: &str) {
        if self.source.is_none() {
            return;
        }
        {
            let scopes = self.scopes();
            let Some(state) = scopes.get(&(route.name.clone(), scope.to_owned())) else {
                return; // over MAX_SCOPES
            };
            if state.building
                || state
                    .last_build
                    .is_some_and(|(at, _)| at.elapsed() < RETRY_AFTER)
            {
                return;
            }
        }
        let this = Arc::clone(self);
        let (cfg, route, scope) = (Arc::clone(cfg), Arc::clone(route), scope.to_owned());
        tokio::spawn(async move {
            let _ = this.run_build(&cfg, &route, &scope, Why::Unknown).await;
        });
    }

    /// Builds one filter now (admin endpoint, tests): waits for a build
    /// slot, then runs the build in this task.
    pub async fn rebuild(
        &self,
        cfg: &Config,
        route: &Route,
        scope: &str,
    ) -> Result<BuildOutcome, BuildError> {
        self.run_build(cfg, route, scope, Why::Asked).await
    }

    /// The maintenance task's rebuild of a due scope, now (tests, the fleet
    /// bench): `Busy` if another instance claimed this interval.
    pub async fn rebuild_due(
        &self,
        cfg: &Config,
        route: &Route,
        scope: &str,
    ) -> Result<BuildOutcome, BuildError> {
        self.run_build(cfg, route, scope, Why::Due).await
    }

    /// One build with bookkeeping: slot, state, metrics, logs. Unless
    /// `Asked`, returns `Busy` at once when this process is already
    /// building the scope or has no free slot; a `Due` build also when
    /// another instance claimed this `rebuild_every` interval.
    async fn run_build(
        &self,
        cfg: &Config,
        route: &Route,
        scope: &str,
        why: Why,
    ) -> Result<BuildOutcome, BuildError> {
        let wait = why == Why::Asked;
        let Some(bloom) = route.bloom.as_ref() else {
            return Err(BuildError::Source(SourceError::Query(format!(
                "route {:?} has no bloom filter",
                route.name
            ))));
        };
        let Some(source) = self.source.as_deref() else {
            return Err(BuildError::Source(SourceError::NotConfigured));
        };
        let _permit = if wait {
            self.builds.acquire().await.ok()
        } else {
            match self.builds.try_acquire() {
                Ok(p) => Some(p),
                Err(_) => return Ok(BuildOutcome::Busy),
            }
        };
        let key = (route.name.clone(), scope.to_owned());
        {
            let mut scopes = self.scopes();
            let state = scopes.entry(key.clone()).or_default();
            if state.building {
                return Ok(BuildOutcome::Busy);
            }
            state.building = true;
        }
        self.note(&route.name, scope, None);
        let keys = bloom_keys(&cfg.store.namespace, &route.name, scope);
        let started = Instant::now();
        let result = match why {
            Why::Due => {
                self.build_once_per_interval(source, &keys, route, bloom, scope)
                    .await
            }
            Why::Unknown | Why::Asked => {
                build::build(&self.store, source, &keys, &route.name, bloom, scope).await
            }
        };
        let took = started.elapsed();
        let outcome = match &result {
            Ok(o) => o.as_str(),
            Err(_) => "failed",
        };
        self.metrics
            .builds
            .with_label_values(&[&route.name, outcome])
            .inc();
        if !matches!(result, Ok(BuildOutcome::Busy)) {
            self.metrics
                .build_duration
                .with_label_values(&[&route.name])
                .observe(took.as_secs_f64());
        }
        let ready = match &result {
            Ok(BuildOutcome::Activated { members }) => {
                tracing::info!(route = %route.name, scope, members, took_ms = took.as_millis() as u64, "bloom filter activated");
                self.export_fill(&keys, &route.name, scope, bloom).await;
                Some(true)
            }
            Ok(BuildOutcome::Busy) => None,
            Ok(BuildOutcome::LockLost) => {
                tracing::warn!(route = %route.name, scope, took_ms = took.as_millis() as u64, "bloom build outlived its lock; not activated");
                None
            }
            Ok(BuildOutcome::CapacityExceeded { members }) => {
                tracing::error!(route = %route.name, scope, members, capacity = bloom.capacity, "bloom filter capacity exceeded: filter disabled (unknown) until capacity is raised");
                Some(false)
            }
            Err(e) => {
                tracing::warn!(route = %route.name, scope, error = %e, "bloom build failed; the previous filter (if any) stays active");
                None
            }
        };
        {
            let mut scopes = self.scopes();
            let state = scopes.entry(key).or_default();
            state.building = false;
            let done = matches!(
                result,
                Ok(BuildOutcome::Activated { .. } | BuildOutcome::Busy)
            );
            state.last_build = Some((Instant::now(), done));
        }
        self.note(&route.name, scope, ready);
        result
    }

    /// A scheduled rebuild (docs/bloom.md#fleet-wide-rebuilds): every instance
    /// that tracks the scope comes due once per `rebuild_every`, so the first
    /// to claim the interval builds and the others take `Busy` for one Redis
    /// command. A claim whose build did not activate is given back, so the next
    /// instance due may build.
    async fn build_once_per_interval(
        &self,
        source: &dyn IdSource,
        keys: &BloomKeys,
        route: &Route,
        bloom: &BloomConfig,
        scope: &str,
    ) -> Result<BuildOutcome, BuildError> {
        let claim = build::owner_token();
        if !self
            .store
            .bloom_claim_interval(keys, &claim, bloom.rebuild_every)
            .await?
        {
            return Ok(BuildOutcome::Busy);
        }
        let result = build::build(&self.store, source, keys, &route.name, bloom, scope).await;
        if !matches!(result, Ok(BuildOutcome::Activated { .. })) {
            if let Err(e) = self
                .store
                .delete_if_equals(&keys.interval, claim.as_bytes())
                .await
            {
                tracing::debug!(route = %route.name, error = %e, "bloom interval claim not released");
            }
        }
        result
    }

    async fn export_fill(&self, keys: &BloomKeys, route: &str, scope: &str, bloom: &BloomConfig) {
        if let Ok(set) = self.store.bloom_bitcount(&keys.bits).await {
            self.metrics
                .fill_ratio
                .with_label_values(&[route, scope])
                .set(set as f64 / bloom.sizing.m as f64);
        }
    }

    /// Growth: adds `id` to the filter of `route` / `scope` (the active
    /// bitmap and a running build's candidate), so an object created after
    /// the last build is never rejected once its `create` event is applied.
    /// A route without a filter is a no-op.
    pub async fn add_member(
        &self,
        cfg: &Config,
        route: &Route,
        scope: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let Some(bloom) = route.bloom.as_ref() else {
            return Ok(());
        };
        let keys = bloom_keys(&cfg.store.namespace, &route.name, scope);
        let positions = hash::positions(&route.name, scope, id, bloom.sizing);
        let result = self.store.bloom_add(&keys, &positions).await;
        let outcome = if result.is_ok() { "applied" } else { "failed" };
        self.metrics
            .adds
            .with_label_values(&[&route.name, outcome])
            .inc();
        result
    }

    /// [`Blooms::add_member`] for a `create` event (the seam the
    /// invalidator calls): scope and id from its params, in template order.
    pub(crate) async fn created(
        &self,
        cfg: &Config,
        route: &Route,
        params: &[String],
    ) -> Result<(), StoreError> {
        let Some(bloom) = route.bloom.as_ref() else {
            return Ok(());
        };
        let scope = bloom.scope_value(params);
        let id = params.get(bloom.id_param).map_or("", String::as_str);
        self.add_member(cfg, route, &scope, id).await
    }

    /// Starts the maintenance task: builds unscoped filters at once, then
    /// every scope seen here whenever it is due (`rebuild_every` after a
    /// build that activated, [`RETRY_AFTER`] after one that did not). Runs
    /// until the process ends; follows config reloads.
    pub(crate) fn spawn_maintenance(self: &Arc<Self>, config: Arc<ArcSwap<Config>>) {
        let bloom_routes = config
            .load()
            .routes
            .routes
            .iter()
            .filter(|r| r.bloom.is_some())
            .count();
        if bloom_routes == 0 {
            // Routes with bloom may arrive by reload; the task is cheap.
        } else if self.source.is_none() {
            tracing::warn!(
                routes = bloom_routes,
                "bloom filters configured but no membership source: this instance builds none; filters stay unknown unless another instance builds them"
            );
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if this.source.is_none() {
                    continue;
                }
                let cfg = config.load_full();
                for (route, scope) in this.due(&cfg) {
                    let this = Arc::clone(&this);
                    let cfg = Arc::clone(&cfg);
                    tokio::spawn(async move {
                        let _ = this.run_build(&cfg, &route, &scope, Why::Due).await;
                    });
                }
            }
        });
    }

    /// Filters due for a build under `cfg`. Forgets scopes of routes that
    /// no longer have a filter.
    fn due(&self, cfg: &Config) -> Vec<(Arc<Route>, String)> {
        let mut scopes = self.scopes();
        scopes.retain(|(r, _), _| cfg.routes.find(r).is_some_and(|r| r.bloom.is_some()));
        for route in &cfg.routes.routes {
            if let Some(b) = &route.bloom {
                if !b.is_scoped() {
                    scopes
                        .entry((route.name.clone(), b.scope_value::<&str>(&[])))
                        .or_default();
                }
            }
        }
        let mut due = Vec::new();
        for ((r, scope), state) in scopes.iter() {
            let Some(route) = cfg.routes.find(r) else {
                continue;
            };
            let Some(bloom) = &route.bloom else { continue };
            let is_due = !state.building
                && match state.last_build {
                    None => true,
                    Some((at, true)) => at.elapsed() >= bloom.rebuild_every,
                    Some((at, false)) => at.elapsed() >= RETRY_AFTER,
                };
            if is_due {
                due.push((Arc::clone(route), scope.clone()));
            }
        }
        due
    }
}
