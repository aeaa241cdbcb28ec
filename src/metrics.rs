//! Metric names (one place, as constants) and the Prometheus registry that
//! the admin listener exports. Label handles that sit on the request path are
//! looked up once per request, never formatted.

use crate::outcome::CacheOutcome;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::{Arc, OnceLock};

pub(crate) mod names {
    pub(crate) const REQUESTS: &str = "sidecache_requests_total";
    pub(crate) const UPSTREAM_REQUESTS: &str = "sidecache_upstream_requests_total";
    pub(crate) const UPSTREAM_DURATION: &str = "sidecache_upstream_duration_seconds";
    pub(crate) const UPSTREAM_ERRORS: &str = "sidecache_upstream_errors_total";
    pub(crate) const BLOOM_STATE: &str = "sidecache_bloom_state";
    pub(crate) const BLOOM_CHECKS: &str = "sidecache_bloom_checks_total";
    pub(crate) const BLOOM_BUILDS: &str = "sidecache_bloom_builds_total";
    pub(crate) const BLOOM_BUILD_DURATION: &str = "sidecache_bloom_build_duration_seconds";
    pub(crate) const BLOOM_FILL_RATIO: &str = "sidecache_bloom_fill_ratio";
    pub(crate) const BLOOM_ADDS: &str = "sidecache_bloom_adds_total";
    pub(crate) const MEMORY_STORE_BYTES: &str = "sidecache_memory_store_bytes";
    pub(crate) const MEMORY_STORE_BUDGET: &str = "sidecache_memory_store_budget_bytes";
    pub(crate) const MEMORY_STORE_ENTRIES: &str = "sidecache_memory_store_entries";
    pub(crate) const MEMORY_STORE_KEYS: &str = "sidecache_memory_store_keys";
    pub(crate) const MEMORY_STORE_EVICTIONS: &str = "sidecache_memory_store_evictions_total";
    pub(crate) const STORE_ERRORS: &str = "sidecache_store_errors_total";
    pub(crate) const BREAKER_OPEN: &str = "sidecache_breaker_open";
    pub(crate) const FEED_BREAKER_OPEN: &str = "sidecache_feed_breaker_open";
    pub(crate) const NODE_BREAKER_OPEN: &str = "sidecache_store_node_breaker_open";
    pub(crate) const FEED_NODE_BREAKER_OPEN: &str = "sidecache_feed_node_breaker_open";
    pub(crate) const STORE_WRITE_REFUSALS: &str = "sidecache_store_write_refusals_total";
    pub(crate) const STORE_WRITES_REFUSED: &str = "sidecache_store_writes_refused";
    pub(crate) const REPLICA_ACK_SHORTFALLS: &str = "sidecache_replica_ack_shortfalls_total";
    pub(crate) const FILL_INFLIGHT: &str = "sidecache_fill_inflight";
    pub(crate) const FILL_QUEUED: &str = "sidecache_fill_queued";
    pub(crate) const FILL_QUEUE_WAIT: &str = "sidecache_fill_queue_wait_seconds";
    pub(crate) const FILL_QUEUE_REJECTED: &str = "sidecache_fill_queue_rejected_total";
    pub(crate) const PUBLISH: &str = "sidecache_publish_total";
    pub(crate) const CORRUPT: &str = "sidecache_corrupt_entries_total";
    pub(crate) const LEASE_UNLOCK_FAILED: &str = "sidecache_lease_unlock_failures_total";
    pub(crate) const LEASE_ABANDONED: &str = "sidecache_lease_abandoned_total";
    pub(crate) const LEASE_SUPERSEDED: &str = "sidecache_lease_superseded_total";
    pub(crate) const UNCACHEABLE: &str = "sidecache_uncacheable_total";
    pub(crate) const COALESCED: &str = "sidecache_coalesced_total";
    pub(crate) const DEGRADED_JOIN_REFUSED: &str = "sidecache_degraded_join_refused_total";
    pub(crate) const VARY_RELEARNED: &str = "sidecache_vary_relearned_total";
    pub(crate) const VARY_LEARNED: &str = "sidecache_vary_learned_total";
    pub(crate) const STALE_SERVED: &str = "sidecache_stale_served_total";
    pub(crate) const BACKGROUND_REFRESH: &str = "sidecache_background_refresh_total";
    pub(crate) const REVALIDATIONS: &str = "sidecache_revalidations_total";
    pub(crate) const CLIENT_ANSWERS: &str = "sidecache_client_answers_total";
    pub(crate) const INVALIDATIONS: &str = "sidecache_invalidations_total";
    pub(crate) const INVALIDATION_FANOUT: &str = "sidecache_invalidation_fanout";
    pub(crate) const CONFIG_RELOADS: &str = "sidecache_config_reloads_total";
    pub(crate) const OUTBOX_PENDING: &str = "sidecache_outbox_pending";
    pub(crate) const OUTBOX_OLDEST: &str = "sidecache_outbox_oldest_seconds";
    pub(crate) const OUTBOX_DEAD: &str = "sidecache_outbox_dead";
    pub(crate) const STREAM_PENDING: &str = "sidecache_stream_pending";
    pub(crate) const FEED_WITNESS: &str = "sidecache_feed_witness";
    pub(crate) const DEAD_LETTERS: &str = "sidecache_dead_letters_total";
    pub(crate) const CAPTURE_STREAMING: &str = "sidecache_capture_streaming";
    pub(crate) const CAPTURE_LAG_BYTES: &str = "sidecache_capture_lag_bytes";
    pub(crate) const CAPTURE_LAG_SECONDS: &str = "sidecache_capture_lag_seconds";
    pub(crate) const CAPTURE_DEAD_LETTERS: &str = "sidecache_capture_dead_letters_total";
    pub(crate) const CAPTURE_SLOT_CREATED: &str = "sidecache_capture_slot_created_total";
    pub(crate) const CAPTURE_ROUTE_PURGES: &str = "sidecache_capture_route_purges_total";
    pub(crate) const NEAR_CACHE: &str = "sidecache_near_cache_total";
    pub(crate) const NEAR_CACHE_INVALIDATIONS: &str = "sidecache_near_cache_invalidations_total";
    pub(crate) const NEAR_CACHE_FLUSHES: &str = "sidecache_near_cache_flushes_total";
    pub(crate) const NEAR_CACHE_TRACKING: &str = "sidecache_near_cache_tracking";
    pub(crate) const CONNECTIONS_PARKED: &str = "sidecache_connections_parked";
    pub(crate) const CLIENT_CONNECTIONS: &str = "sidecache_client_connections";
    pub(crate) const ACCEPT_PAUSED: &str = "sidecache_accept_paused_total";
    pub(crate) const CLIENT_ERRORS: &str = "sidecache_client_errors_total";
    pub(crate) const ACCESS_LOG_DROPPED: &str = "sidecache_access_log_dropped_total";
    pub(crate) const OVERLOADED: &str = "sidecache_overloaded_total";
    pub(crate) const REQUEST_BUFFER_BYTES: &str = "sidecache_request_buffer_bytes";
    pub(crate) const REQUEST_BUFFER_RESERVED: &str = "sidecache_request_buffer_reserved_bytes";
    pub(crate) const CONFIG_LAST_RELOAD_SUCCESSFUL: &str =
        "sidecache_config_last_reload_successful";
    pub(crate) const CONFIG_LAST_RELOAD_TIMESTAMP: &str =
        "sidecache_config_last_reload_timestamp_seconds";
}

/// `kind` label values of [`Metrics::client_errors`].
pub(crate) mod client_error {
    /// HTTP/1.1 without `Host`, several `Host`s, or `Host` differing from
    /// the HTTP/2 `:authority` (400).
    pub(crate) const BAD_HOST: &str = "bad_host";
    /// A forwarded request body that failed to arrive: malformed chunked
    /// framing, or the client went away mid-body (400).
    pub(crate) const BAD_BODY: &str = "bad_body";
    /// `Transfer-Encoding` other than a lone `chunked` (501).
    pub(crate) const TRANSFER_CODING: &str = "transfer_coding";
    /// No complete request head within `limits.header_timeout`.
    pub(crate) const HEADER_TIMEOUT: &str = "header_timeout";
    /// A request head over `limits.max_header_bytes` (431).
    pub(crate) const HEADER_TOO_LARGE: &str = "header_too_large";
    /// The client took nothing of a response for `limits.send_timeout`.
    pub(crate) const SEND_TIMEOUT: &str = "send_timeout";
    /// A request target over `limits.max_target_bytes` (414).
    pub(crate) const TARGET_TOO_LONG: &str = "target_too_long";
    /// The buffered part of a request body did not arrive within
    /// `limits.body_timeout` (408).
    pub(crate) const BODY_TIMEOUT: &str = "body_timeout";
}

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
                "Fill leases taken over from a fill of an older generation.",
                &["route"],
            ),
            coalesced: counter(
                COALESCED,
                "Misses that joined a fill already running in this process.",
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

/// The Bloom filter's metrics (docs/metrics.md#bloom-filter). Registered into
/// the process registry by `bloom::Blooms::new`, kept apart from [`Metrics`] so
/// the filter owns its series.
#[derive(Clone)]
pub struct BloomMetrics {
    /// `{route, scope}`: 0 unready (unknown), 1 ready, 2 building.
    pub state: IntGaugeVec,
    /// `{route, result}`: `reject`, `maybe`, `unknown`, `error`.
    pub checks: IntCounterVec,
    /// `{route, outcome}`: `activated`, `busy`, `lock_lost`,
    /// `capacity_exceeded`, `failed`.
    pub builds: IntCounterVec,
    /// `{route}`: duration of builds that ran (any outcome but `busy`).
    pub build_duration: HistogramVec,
    /// `{route, scope}`: set bits / m of the active bitmap after a build.
    pub fill_ratio: prometheus::GaugeVec,
    /// `{route, outcome}`: growth by `create` events, `applied` or `failed`.
    pub adds: IntCounterVec,
}

impl BloomMetrics {
    /// Builds the metrics and registers them in `registry`. Registering the
    /// same names twice (a second filter manager on one registry) keeps the
    /// metrics working but unexported, and logs it.
    pub(crate) fn new(registry: &Registry) -> BloomMetrics {
        use names::*;
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let m = BloomMetrics {
            state: IntGaugeVec::new(
                Opts::new(
                    BLOOM_STATE,
                    "Bloom filter state: 0 unready (unknown), 1 ready, 2 building.",
                ),
                &["route", "scope"],
            )
            .expect("valid metric"),
            checks: counter(
                BLOOM_CHECKS,
                "Bloom checks on cache misses, by answer.",
                &["route", "result"],
            ),
            builds: counter(
                BLOOM_BUILDS,
                "Bloom filter builds by outcome.",
                &["route", "outcome"],
            ),
            build_duration: HistogramVec::new(
                HistogramOpts::new(BLOOM_BUILD_DURATION, "Bloom filter build time.").buckets(vec![
                    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                ]),
                &["route"],
            )
            .expect("valid metric"),
            fill_ratio: prometheus::GaugeVec::new(
                Opts::new(
                    BLOOM_FILL_RATIO,
                    "Share of bits set in the active Bloom bitmap (about 0.5 at capacity).",
                ),
                &["route", "scope"],
            )
            .expect("valid metric"),
            adds: counter(
                BLOOM_ADDS,
                "Members added to Bloom filters by create events.",
                &["route", "outcome"],
            ),
        };
        let collectors: [Box<dyn prometheus::core::Collector>; 6] = [
            Box::new(m.state.clone()),
            Box::new(m.checks.clone()),
            Box::new(m.builds.clone()),
            Box::new(m.build_duration.clone()),
            Box::new(m.fill_ratio.clone()),
            Box::new(m.adds.clone()),
        ];
        for c in collectors {
            if let Err(e) = registry.register(c) {
                tracing::warn!(error = %e, "bloom metrics not registered");
            }
        }
        m
    }
}

/// The embedded store's metrics (docs/metrics.md#embedded-store), updated
/// by its shards as they write and evict; all 0 on a Redis-backed process
/// (the budget gauge is set when the embedded store is built).
#[derive(Clone)]
pub struct MemoryStoreMetrics {
    /// Bytes charged against the budget: keys, values, per-key overhead.
    pub bytes: IntGauge,
    /// `store.memory.max_bytes`.
    pub budget: IntGauge,
    /// Cached answers (entry keys).
    pub entries: IntGauge,
    /// Every key: entries, generations, leases and the rest.
    pub keys: IntGauge,
    /// One counter per eviction kind (`evict::Kind::ALL` order), looked up
    /// once.
    pub(crate) evictions: [IntCounter; 5],
}

impl MemoryStoreMetrics {
    /// Built and, with a registry, registered in it.
    pub(crate) fn new(registry: Option<&Registry>) -> MemoryStoreMetrics {
        use names::*;
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let evictions = IntCounterVec::new(
            Opts::new(
                MEMORY_STORE_EVICTIONS,
                "Keys the embedded store evicted to stay within its budget, by kind.",
            ),
            &["kind"],
        )
        .expect("valid metric");
        let m = MemoryStoreMetrics {
            bytes: gauge(
                MEMORY_STORE_BYTES,
                "Bytes the embedded store charges against its budget (keys, values, per-key overhead).",
            ),
            budget: gauge(MEMORY_STORE_BUDGET, "The embedded store's byte budget."),
            entries: gauge(MEMORY_STORE_ENTRIES, "Cached answers in the embedded store."),
            keys: gauge(MEMORY_STORE_KEYS, "Keys in the embedded store, of every kind."),
            evictions: crate::store::memory::EVICTION_KINDS
                .map(|kind| evictions.with_label_values(&[kind])),
        };
        if let Some(registry) = registry {
            let collectors: [Box<dyn prometheus::core::Collector>; 5] = [
                Box::new(m.bytes.clone()),
                Box::new(m.budget.clone()),
                Box::new(m.entries.clone()),
                Box::new(m.keys.clone()),
                Box::new(evictions),
            ];
            for c in collectors {
                registry
                    .register(c)
                    .expect("metric names are unique constants");
            }
        }
        m
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
