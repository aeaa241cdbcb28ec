//! [`CacheStatus`]: what the pipeline did with a request. One string per
//! value, used as the `X-Cache` header, the `result` metric label and the
//! tracing field, so the three never disagree.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CacheStatus {
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
}

/// The `X-Cache` response header's name, parsed once.
pub(crate) static X_CACHE: http::HeaderName = http::HeaderName::from_static("x-cache");

impl CacheStatus {
    /// How many values there are (see [`CacheStatus::index`]).
    pub(crate) const COUNT: usize = 7;

    /// 0..[`CacheStatus::COUNT`], for arrays with a slot per value.
    pub(crate) fn index(self) -> usize {
        match self {
            CacheStatus::Hit => 0,
            CacheStatus::Miss => 1,
            CacheStatus::Negative => 2,
            CacheStatus::Bloom => 3,
            CacheStatus::Bypass => 4,
            CacheStatus::Degraded => 5,
            CacheStatus::Stale => 6,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Negative => "NEGATIVE",
            CacheStatus::Bloom => "BLOOM",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::Degraded => "DEGRADED",
            CacheStatus::Stale => "STALE",
        }
    }

    pub(crate) fn header_value(self) -> http::HeaderValue {
        http::HeaderValue::from_static(self.as_str())
    }
}
