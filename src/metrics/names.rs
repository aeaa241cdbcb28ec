//! Metric names, one constant each, so a name is written once.

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
pub(crate) const FILL_READERS_CUT: &str = "sidecache_fill_readers_cut_total";
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
pub(crate) const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "sidecache_config_last_reload_successful";
pub(crate) const CONFIG_LAST_RELOAD_TIMESTAMP: &str =
    "sidecache_config_last_reload_timestamp_seconds";

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
