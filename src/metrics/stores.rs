//! The metrics a component registers for itself (the Bloom filter, the
//! embedded store), apart from [`super::Metrics`] so each owns its series.

use super::names;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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
