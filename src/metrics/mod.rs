//! Metric names (one place, as constants) and the Prometheus registry that
//! the admin listener exports. Label handles that sit on the request path are
//! looked up once per request, never formatted.

use crate::outcome::CacheOutcome;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::{Arc, OnceLock};

pub(crate) mod names;
mod stores;

pub(crate) use names::client_error;
pub use stores::{BloomMetrics, MemoryStoreMetrics};

/// All metrics of one process.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `{route, result}`: result is a `CacheOutcome` string, or `forward`.
    pub requests: IntCounterVec,
    /// `{route, status_class}`: `2xx`..`5xx`, or `error`.
    pub upstream_requests: IntCounterVec,
    /// `{route}`; forwarded requests use route `-`.
    pub upstream_duration: HistogramVec,
    /// `{kind}`: `connect`, `timeout`, `other`.
    pub upstream_errors: IntCounterVec,
    /// `{op}`: the store operation that failed or timed out.
    pub store_errors: IntCounterVec,
    /// Single node: 1 while the breaker is open; cluster: how many node
    /// breakers are open.
    pub breaker_open: IntGauge,
    /// `{node}`: Redis Cluster only, 1 while that master's breaker is open.
    pub node_breaker_open: IntGaugeVec,
    /// The invalidation feeds' own breaker
    /// (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events); on
    /// Redis Cluster, how many masters' feed breakers are open.
    pub feed_breaker_open: IntGauge,
    /// `{node}`: Redis Cluster only, 1 while that master's feed breaker is
    /// open (invalidations of its keys wait; the others go on).
    pub feed_node_breaker_open: IntGaugeVec,
    pub store_write_refusals: IntCounterVec,
    pub store_writes_refused: IntGauge,
    /// Invalidations fewer replicas confirmed than `store.redis.replicas_ack`.
    pub replica_ack_shortfalls: IntCounter,
    pub fill_inflight: IntGaugeVec,
    /// Fills waiting for a permit (`fill.queue_timeout`).
    pub fill_queued: IntGauge,
    /// `{outcome}`: `acquired` or `timeout`; only fills that had to wait.
    pub fill_queue_wait: HistogramVec,
    /// Fills refused at once because `fill.max_queued` were waiting.
    pub fill_queue_rejected: IntCounter,
    /// `{route, outcome}`: a `pipeline::publish::FillOutcome` string.
    pub publish: IntCounterVec,
    /// `{route, reason}`: why an answer was not stored (a
    /// `pipeline::publish::Uncacheable` string; a handful of values).
    pub uncacheable: IntCounterVec,
    /// `{route}`: misses that joined a fill already running in this process.
    pub coalesced: IntCounterVec,
    /// `{route}`: waiters of a streamed fill whose body was cut: they fell
    /// behind the part of a body past `fill.max_body` that is kept.
    pub fill_readers_cut: IntCounterVec,
    /// `{route}`: degraded misses that started a fetch of their own because
    /// the one running for the object was older than `degraded_join_window`.
    pub degraded_join_refused: IntCounterVec,
    /// `{route}`: `vary_from_origin` requests keyed again because the
    /// answer varied on a header the key had not included (each costs one
    /// more upstream request).
    pub vary_relearned: IntCounterVec,
    /// `{route}`: `vary_from_origin` fills whose answer changed the names
    /// stored for the object.
    pub vary_learned: IntCounterVec,
    /// `{route, reason}`: expired entries served `STALE` (a
    /// `pipeline::stale::StaleReason` string).
    pub stale_served: IntCounterVec,
    /// `{route, outcome}`: background refreshes started by grace (a
    /// `pipeline::stale::RefreshOutcome` string).
    pub background_refresh: IntCounterVec,
    /// `{route, outcome}`: conditional fills of expired entries (a
    /// `pipeline::revalidate::Revalidation` string).
    pub revalidations: IntCounterVec,
    /// `{route, answer}`: cache reads answered 304, 412, 206 or 416 (a
    /// `pipeline::answer::Shaped` string).
    pub client_answers: IntCounterVec,
    pub corrupt: IntCounterVec,
    pub unlock_failed: IntCounterVec,
    /// `{route}`: fill leases dropped without release (task panicked or
    /// aborted); their release was spawned, or they expire.
    pub lease_abandoned: IntCounterVec,
    pub lease_superseded: IntCounterVec,
    /// `{source, outcome, kind}`: one per generation replaced (`object`,
    /// `related`, `tag`); an event counted without its targets once, as
    /// `kind="event"` (poison; a claimed outbox row this instance's fan-out
    /// had applied already).
    pub invalidations: IntCounterVec,
    /// `{source}`: generation keys one applied event replaced (its object
    /// and related objects, or its tags).
    pub invalidation_fanout: HistogramVec,
    /// `{outcome}`: `applied`, `unchanged`, `rejected`.
    pub config_reloads: IntCounterVec,
    /// Outbox rows not dead-lettered (due or backing off), as last measured.
    pub outbox_pending: IntGauge,
    /// 1 while this instance holds a witness slot of the feed (runs its
    /// fan-out), by `feed` (`outbox`, `stream`).
    pub feed_witness: IntGaugeVec,
    /// Age of the oldest such row; 0 when none.
    pub outbox_oldest_seconds: Gauge,
    /// Dead-lettered outbox rows still in the table.
    pub outbox_dead: IntGauge,
    /// Entries delivered to the consumer group and not yet acked.
    pub stream_pending: IntGauge,
    /// `{source}`: events dead-lettered (poison), by source.
    pub dead_letters: IntCounterVec,
    /// Change capture (logical): 1 while this instance streams the slot.
    pub capture_streaming: IntGauge,
    /// Change capture (logical): WAL bytes written that the consumer has
    /// not applied yet (0 on instances that do not hold the slot).
    pub capture_lag_bytes: IntGauge,
    /// Seconds from a transaction's commit to its invalidations applied
    /// (the last one), or since the commit of the one being read.
    pub capture_lag_seconds: Gauge,
    /// `{reason}`: captured events dead-lettered, by `Poison::reason`.
    pub capture_dead_letters: IntCounterVec,
    /// `{reason}`: the replication slot created (`missing`) or recreated
    /// (`lost`): changes may have been missed, every mapped route purged.
    pub capture_slot_created: IntCounterVec,
    /// Route-wide purges change capture made because changes may have
    /// been missed (a new or lost slot).
    pub capture_route_purges: IntCounter,
    /// `{outcome}`: `hit` (served from memory) or `miss` (asked Redis).
    pub near_cache: IntCounterVec,
    pub near_cache_invalidations: IntCounter,
    pub near_cache_flushes: IntCounter,
    pub near_cache_tracking: IntGauge,
    /// Idle HTTP/1 client connections parked (socket only, no hyper state).
    pub connections_parked: IntGauge,
    /// Open client connections (the count `limits.max_connections` caps).
    pub client_connections: IntGauge,
    /// Times the client listener stopped accepting at `limits.max_connections`.
    pub accept_paused: IntCounter,
    /// `{kind}`: see [`client_error`].
    pub client_errors: IntCounterVec,
    /// `{reason}`: access log lines lost (`buffer_full`, `write_error`).
    pub access_log_dropped: IntCounterVec,
    /// `{route, reason}`: 503s sidecache answered itself (an
    /// `error::Overload` string).
    pub overloaded: IntCounterVec,
    /// Bytes of request bodies held before forwarding, now.
    pub request_buffer_bytes: IntGauge,
    /// What held request bodies reserve of `limits.request_buffer_budget`.
    pub request_buffer_reserved: IntGauge,
    /// 0 after a reload was rejected, until the file is valid again.
    pub config_reload_ok: IntGauge,
    /// Unix time of the last reload attempt that was not `unchanged`.
    pub config_reload_time: Gauge,
    /// The forwarding path's series, looked up once.
    pub forward: Arc<ForwardMetrics>,
    /// The embedded store's budget, use and evictions.
    pub memory_store: MemoryStoreMetrics,
}

/// The series every forwarded request touches (route `-`), each looked up
/// in its vector once, on first use, instead of per request: a
/// `with_label_values` hashes the label values and takes the vector's lock
/// three times per forwarded request (bench/README.md). Created on first use so
/// that `/metrics` shows a series only once it has counted something, as
/// before.
#[derive(Default)]
pub struct ForwardMetrics {
    requests: OnceLock<IntCounter>,
    duration: OnceLock<Histogram>,
    /// Per status class, `1xx` .. `5xx`.
    statuses: [OnceLock<IntCounter>; 5],
}

impl ForwardMetrics {
    /// `sidecache_requests_total{route="-",result="forward"}`.
    pub(crate) fn request(&self, m: &Metrics) -> &IntCounter {
        self.requests
            .get_or_init(|| m.requests.with_label_values(&[FORWARD_ROUTE, "forward"]))
    }

    /// `sidecache_upstream_duration_seconds{route="-"}`.
    pub(crate) fn duration(&self, m: &Metrics) -> &Histogram {
        self.duration
            .get_or_init(|| m.upstream_duration.with_label_values(&[FORWARD_ROUTE]))
    }

    /// `sidecache_upstream_requests_total{route="-",status_class=...}`.
    pub(crate) fn status(&self, m: &Metrics, status: u16) -> &IntCounter {
        // The same classes as `status_class`, as indices.
        let i = match status {
            100..=199 => 0,
            200..=299 => 1,
            300..=399 => 2,
            400..=499 => 3,
            _ => 4,
        };
        self.statuses[i].get_or_init(|| {
            m.upstream_requests
                .with_label_values(&[FORWARD_ROUTE, status_class(status)])
        })
    }
}

/// A cache route's `sidecache_requests_total{route, result}` series, one
/// per [`CacheOutcome`], looked up on first use like [`ForwardMetrics`]'s.
/// Held by the route ([`crate::config::Route`]), so a reload starts with
/// empty slots; a slot remembers which [`Metrics`] it came from, so a
/// route shared by two (tests run several proxies on one config) counts
/// into each one's own registry.
#[derive(Default)]
pub struct RouteCounters {
    requests: [OnceLock<(usize, IntCounter)>; CacheOutcome::COUNT],
}

impl RouteCounters {
    /// Counts one request of `route` answered with `status` in `m`.
    pub(crate) fn count(&self, m: &Metrics, route: &str, status: CacheOutcome) {
        let lookup = || m.requests.with_label_values(&[route, status.as_str()]);
        match self.requests[status.index()].get_or_init(|| (m.id(), lookup())) {
            (owner, counter) if *owner == m.id() => counter.inc(),
            _ => lookup().inc(),
        }
    }
}

impl std::fmt::Debug for RouteCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteCounters")
    }
}

/// Route label of everything forwarded outside a cache route.
pub(crate) const FORWARD_ROUTE: &str = "-";

impl Metrics {
    /// Which process-wide set this is: clones share it (their series are
    /// the same), two `Metrics::new()` differ.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.forward) as usize
    }

    pub fn new() -> Metrics {
        let registry = Registry::new();
        fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
            // Names are constants and unique: registering cannot fail.
            r.register(Box::new(c.clone()))
                .expect("metric names are unique constants");
            c
        }
        let counter = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        use names::*;
        let metrics = Metrics {
            forward: Arc::default(),
            memory_store: MemoryStoreMetrics::new(Some(&registry)),
            requests: counter(
                REQUESTS,
                "Requests by route and cache result.",
                &["route", "result"],
            ),
            upstream_requests: counter(
                UPSTREAM_REQUESTS,
                "Requests sent upstream, by route and status class.",
                &["route", "status_class"],
            ),
            upstream_duration: reg(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(UPSTREAM_DURATION, "Upstream response time (headers).")
                        .buckets(vec![
                            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                            10.0,
                        ]),
                    &["route"],
                )
                .expect("valid metric"),
            ),
            upstream_errors: counter(
                UPSTREAM_ERRORS,
                "Upstream exchanges that failed (502/504 to the client).",
                &["kind"],
            ),
            store_errors: counter(
                STORE_ERRORS,
                "Store calls that failed or timed out.",
                &["op"],
            ),
            breaker_open: reg(
                &registry,
                IntGauge::new(BREAKER_OPEN, "1 while the store circuit breaker is open (Redis Cluster: how many masters' breakers are open).")
                    .expect("valid metric"),
            ),
            node_breaker_open: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        NODE_BREAKER_OPEN,
                        "Redis Cluster: 1 while the store breaker of this master is open (its slots degrade).",
                    ),
                    &["node"],
                )
                .expect("valid metric"),
            ),
            feed_breaker_open: reg(
                &registry,
                IntGauge::new(
                    FEED_BREAKER_OPEN,
                    "1 while the invalidation feeds' store breaker is open (this instance leaves events to the others); Redis Cluster: how many masters' feed breakers are open.",
                )
                .expect("valid metric"),
            ),
            feed_node_breaker_open: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        FEED_NODE_BREAKER_OPEN,
                        "Redis Cluster: 1 while the feeds' breaker of this master is open (invalidations of its keys wait).",
                    ),
                    &["node"],
                )
                .expect("valid metric"),
            ),
            store_write_refusals: counter(
                STORE_WRITE_REFUSALS,
                "Store writes refused by the store (OOM, READONLY, NOREPLICAS, MISCONF); the breaker stays closed.",
                &["op"],
            ),
            store_writes_refused: reg(
                &registry,
                IntGauge::new(
                    STORE_WRITES_REFUSED,
                    "1 while the store refuses writes (since the last refusal, until a write succeeds).",
                )
                .expect("valid metric"),
            ),
            replica_ack_shortfalls: reg(
                &registry,
                IntCounter::new(
                    REPLICA_ACK_SHORTFALLS,
                    "Invalidations that fewer replicas confirmed than store.redis.replicas_ack; the event stays pending.",
                )
                .expect("valid metric"),
            ),
            fill_inflight: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(FILL_INFLIGHT, "Upstream fetches for cache fills in flight."),
                    &["route"],
                )
                .expect("valid metric"),
            ),
            fill_queued: reg(
                &registry,
                IntGauge::new(FILL_QUEUED, "Cache fills waiting for a fill permit.")
                    .expect("valid metric"),
            ),
            fill_queue_wait: reg(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        FILL_QUEUE_WAIT,
                        "Time cache fills waited for a fill permit, by outcome.",
                    )
                    .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            fill_queue_rejected: reg(
                &registry,
                IntCounter::new(
                    FILL_QUEUE_REJECTED,
                    "Cache fills answered 503 at once because fill.max_queued were waiting.",
                )
                .expect("valid metric"),
            ),
            publish: counter(
                PUBLISH,
                "Cache publish attempts by outcome.",
                &["route", "outcome"],
            ),
            corrupt: counter(
                CORRUPT,
                "Entries that failed to decode or match.",
                &["route"],
            ),
            unlock_failed: counter(
                LEASE_UNLOCK_FAILED,
                "Lease releases that failed (the lease then expires).",
                &["route"],
            ),
            lease_abandoned: counter(
                LEASE_ABANDONED,
                "Fill leases dropped without release (task panicked or cancelled).",
                &["route"],
            ),
            lease_superseded: counter(
                LEASE_SUPERSEDED,
                "Fill leases taken over from a fill that can never publish, by why: its generation, its route's generation or one of its tags moved.",
                &["route", "reason"],
            ),
            coalesced: counter(
                COALESCED,
                "Misses that joined a fill already running in this process.",
                &["route"],
            ),
            fill_readers_cut: counter(
                FILL_READERS_CUT,
                "Waiters of a streamed fill cut for falling behind the kept part of a body past fill.max_body.",
                &["route"],
            ),
            degraded_join_refused: counter(
                DEGRADED_JOIN_REFUSED,
                "Degraded misses that fetched their own: the running fetch was older than degraded_join_window.",
                &["route"],
            ),
            vary_relearned: counter(
                VARY_RELEARNED,
                "vary_from_origin requests keyed again with the names the answer varied on.",
                &["route"],
            ),
            vary_learned: counter(
                VARY_LEARNED,
                "vary_from_origin fills that changed the Vary names stored for the object.",
                &["route"],
            ),
            stale_served: counter(
                STALE_SERVED,
                "Expired entries of the current generation served STALE, by reason.",
                &["route", "reason"],
            ),
            background_refresh: counter(
                BACKGROUND_REFRESH,
                "Background refreshes started under grace, by outcome.",
                &["route", "outcome"],
            ),
            revalidations: counter(
                REVALIDATIONS,
                "Conditional fills of expired entries, by outcome (not_modified, modified, error).",
                &["route", "outcome"],
            ),
            client_answers: counter(
                CLIENT_ANSWERS,
                "Cache reads answered from an entry with 304, 412, 206 or 416, by answer.",
                &["route", "answer"],
            ),
            uncacheable: counter(
                UNCACHEABLE,
                "Fill answers not stored, by reason.",
                &["route", "reason"],
            ),
            invalidations: counter(
                INVALIDATIONS,
                "Generations replaced by invalidation events, by source, outcome and kind (object, related, tag).",
                &["source", "outcome", "kind"],
            ),
            invalidation_fanout: reg(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        INVALIDATION_FANOUT,
                        "Generation keys one applied event replaced (its object and related objects, or its tags).",
                    )
                    .buckets(vec![1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 32.0, 64.0]),
                    &["source"],
                )
                .expect("valid metric"),
            ),
            config_reloads: counter(CONFIG_RELOADS, "Config reloads by outcome.", &["outcome"]),
            feed_witness: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        FEED_WITNESS,
                        "1 while this instance is one of the feed's witnesses (runs its fan-out).",
                    ),
                    &["feed"],
                )
                .expect("valid metric"),
            ),
            outbox_pending: reg(
                &registry,
                IntGauge::new(OUTBOX_PENDING, "Outbox rows waiting to be applied.")
                    .expect("valid metric"),
            ),
            outbox_oldest_seconds: reg(
                &registry,
                Gauge::new(
                    OUTBOX_OLDEST,
                    "Age of the oldest outbox row waiting to be applied.",
                )
                .expect("valid metric"),
            ),
            outbox_dead: reg(
                &registry,
                IntGauge::new(OUTBOX_DEAD, "Dead-lettered outbox rows in the table.")
                    .expect("valid metric"),
            ),
            stream_pending: reg(
                &registry,
                IntGauge::new(
                    STREAM_PENDING,
                    "Stream entries delivered to the group, not acked.",
                )
                .expect("valid metric"),
            ),
            dead_letters: counter(
                DEAD_LETTERS,
                "Invalidation events dead-lettered as poison, by source.",
                &["source"],
            ),
            capture_streaming: reg(
                &registry,
                IntGauge::new(
                    CAPTURE_STREAMING,
                    "Change capture: 1 while this instance streams the replication slot.",
                )
                .expect("valid metric"),
            ),
            capture_lag_bytes: reg(
                &registry,
                IntGauge::new(
                    CAPTURE_LAG_BYTES,
                    "Change capture: WAL bytes written that this consumer has not applied.",
                )
                .expect("valid metric"),
            ),
            capture_lag_seconds: reg(
                &registry,
                Gauge::new(
                    CAPTURE_LAG_SECONDS,
                    "Change capture: seconds from a transaction's commit to its invalidations applied.",
                )
                .expect("valid metric"),
            ),
            capture_dead_letters: counter(
                CAPTURE_DEAD_LETTERS,
                "Change capture: events dead-lettered, by reason.",
                &["reason"],
            ),
            capture_slot_created: counter(
                CAPTURE_SLOT_CREATED,
                "Change capture: replication slot created (missing) or recreated (lost).",
                &["reason"],
            ),
            capture_route_purges: reg(
                &registry,
                IntCounter::new(
                    CAPTURE_ROUTE_PURGES,
                    "Change capture: routes purged wholesale because changes may have been missed.",
                )
                .expect("valid metric"),
            ),
            near_cache: counter(
                NEAR_CACHE,
                "Near-cache lookups: hit (served from memory) or miss (read from Redis).",
                &["outcome"],
            ),
            near_cache_invalidations: reg(
                &registry,
                IntCounter::new(
                    NEAR_CACHE_INVALIDATIONS,
                    "Objects dropped from the near cache by invalidation pushes or own writes.",
                )
                .expect("valid metric"),
            ),
            near_cache_flushes: reg(
                &registry,
                IntCounter::new(
                    NEAR_CACHE_FLUSHES,
                    "Times the whole near cache was dropped (connection lost, FLUSHALL).",
                )
                .expect("valid metric"),
            ),
            near_cache_tracking: reg(
                &registry,
                IntGauge::new(
                    NEAR_CACHE_TRACKING,
                    "The near cache's tracked Redis connections that are up (one per node: 1 on a single node or Sentinel, one per master on a Cluster).",
                )
                .expect("valid metric"),
            ),
            connections_parked: reg(
                &registry,
                IntGauge::new(
                    CONNECTIONS_PARKED,
                    "Idle HTTP/1 client connections parked (socket kept, hyper state freed).",
                )
                .expect("valid metric"),
            ),
            client_connections: reg(
                &registry,
                IntGauge::new(CLIENT_CONNECTIONS, "Open client connections.")
                    .expect("valid metric"),
            ),
            accept_paused: reg(
                &registry,
                IntCounter::new(
                    ACCEPT_PAUSED,
                    "Times the client listener stopped accepting at limits.max_connections.",
                )
                .expect("valid metric"),
            ),
            client_errors: counter(
                CLIENT_ERRORS,
                "Requests and connections refused or cut off for the client's fault, by kind.",
                &["kind"],
            ),
            access_log_dropped: counter(
                ACCESS_LOG_DROPPED,
                "Access log lines dropped: buffer full, or the write failed.",
                &["reason"],
            ),
            overloaded: counter(
                OVERLOADED,
                "503 answers sidecache gave itself: fill permits full, lease wait spent, or the request buffer budget spent.",
                &["route", "reason"],
            ),
            request_buffer_bytes: reg(
                &registry,
                IntGauge::new(
                    REQUEST_BUFFER_BYTES,
                    "Bytes of request bodies held before forwarding (limits.request_buffer).",
                )
                .expect("valid metric"),
            ),
            request_buffer_reserved: reg(
                &registry,
                IntGauge::new(
                    REQUEST_BUFFER_RESERVED,
                    "Bytes held request bodies reserve of limits.request_buffer_budget.",
                )
                .expect("valid metric"),
            ),
            config_reload_ok: reg(
                &registry,
                IntGauge::new(
                    CONFIG_LAST_RELOAD_SUCCESSFUL,
                    "1 unless the last config reload was rejected (the running config is older than the file).",
                )
                .expect("valid metric"),
            ),
            config_reload_time: reg(
                &registry,
                Gauge::new(
                    CONFIG_LAST_RELOAD_TIMESTAMP,
                    "Unix time of the last config reload that was applied or rejected (0: none since start).",
                )
                .expect("valid metric"),
            ),
            registry,
        };
        // The running config is the file's until a reload says otherwise.
        metrics.config_reload_ok.set(1);
        // Exported at 0 from the start, so an alert on an increase sees the
        // first one.
        for reason in ["missing", "lost"] {
            metrics.capture_slot_created.with_label_values(&[reason]);
        }
        metrics
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut buf = Vec::new();
        let families = self.registry.gather();
        if TextEncoder::new().encode(&families, &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// `2xx` .. `5xx` for a status code.
pub(crate) fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_counters_count_into_each_metrics_own_registry() {
        // One route (one config) served by two proxies, as in tests that
        // run several on one config: the handle kept for the first must
        // not count the second's requests.
        let counters = RouteCounters::default();
        let (a, b) = (Metrics::new(), Metrics::new());
        counters.count(&a, "app", CacheOutcome::Hit);
        counters.count(&b, "app", CacheOutcome::Hit);
        counters.count(&b, "app", CacheOutcome::Hit);
        counters.count(&a.clone(), "app", CacheOutcome::Miss);
        let get =
            |m: &Metrics, s: CacheOutcome| m.requests.with_label_values(&["app", s.as_str()]).get();
        assert_eq!(get(&a, CacheOutcome::Hit), 1);
        assert_eq!(get(&b, CacheOutcome::Hit), 2);
        assert_eq!(get(&a, CacheOutcome::Miss), 1);
        assert_eq!(get(&b, CacheOutcome::Miss), 0);
    }
}
