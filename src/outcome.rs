//! [`CacheOutcome`]: what the pipeline did with a request. One string per
//! value, used as the `X-Cache` header, the `result` metric label, the
//! access log's `cache` field and the tracing field, so they never
//! disagree. Below `metrics` and the access log, which both speak it.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CacheOutcome {
    /// Served from a valid entry.
    Hit,
    /// Fetched from upstream for this request (and published if cacheable).
    Miss,
    /// Served from a cached negative answer (e.g. 404).
    Negative,
    /// Rejected by the Bloom filter: the id certainly does not exist.
    Bloom,
    /// Not eligible (credentials not part of the key): forwarded untouched.
    Bypass,
    /// The store is unavailable: fetched from upstream, nothing written.
    Degraded,
    /// An expired entry of the current generation, within its grace or
    /// stale-if-error window.
    Stale,
    /// Hit-for-pass: the object's last fill could not be stored for a
    /// reason of its own, so it is forwarded without a fill.
    Pass,
}

/// The `X-Cache` response header's name, parsed once.
pub(crate) static X_CACHE: http::HeaderName = http::HeaderName::from_static("x-cache");

impl CacheOutcome {
    /// How many values there are (see [`CacheOutcome::index`]).
    pub(crate) const COUNT: usize = 8;

    /// 0..[`CacheOutcome::COUNT`], for arrays with a slot per value.
    pub(crate) fn index(self) -> usize {
        match self {
            CacheOutcome::Hit => 0,
            CacheOutcome::Miss => 1,
            CacheOutcome::Negative => 2,
            CacheOutcome::Bloom => 3,
            CacheOutcome::Bypass => 4,
            CacheOutcome::Degraded => 5,
            CacheOutcome::Stale => 6,
            CacheOutcome::Pass => 7,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "HIT",
            CacheOutcome::Miss => "MISS",
            CacheOutcome::Negative => "NEGATIVE",
            CacheOutcome::Bloom => "BLOOM",
            CacheOutcome::Bypass => "BYPASS",
            CacheOutcome::Degraded => "DEGRADED",
            CacheOutcome::Stale => "STALE",
            CacheOutcome::Pass => "PASS",
        }
    }

    pub(crate) fn header_value(self) -> http::HeaderValue {
        http::HeaderValue::from_static(self.as_str())
    }
}
