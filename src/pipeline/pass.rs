//! Hit-for-pass (docs/caching.md#hit-for-pass): which object variants this
//! instance forwards without a fill for a while, because their last fill's
//! answer could not be stored for a reason of the object's own (`no-store`,
//! `private`, `Set-Cookie`, `Vary: *` or an unkeyed `Vary`, larger than
//! `fill.max_body`, a status the route does not cache). Such requests take no
//! lease, no fill permit and no place in the fill queue, and are not
//! coalesced: each is its client's own request, as in plain forwarding.
//!
//! A marker is kept with the object's generation its fill held: it applies
//! only to requests that read that generation, so an invalidation of the
//! object (a new generation, on any instance) ends it at once. It expires
//! after the route's `hit_for_pass`. Markers live in process memory: each
//! instance learns them from its own fill, and the map is bounded.

use super::publish::Uncacheable;
use bytes::Bytes;
use http::StatusCode;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// At most this many markers are kept; past it, expired ones are dropped
/// and, if none were, a new marker is not kept (a later fill finds the
/// object uncacheable again and retries).
const MAX_MARKERS: usize = 65_536;

/// Whether a fill's answer, not stored for `reason`, makes its object
/// variant a hit-for-pass. An upstream error (5xx) is the origin's state,
/// not the object's: passing it would drop coalescing exactly while the
/// origin is struggling, so it does not.
pub(crate) fn passes(reason: Uncacheable, status: StatusCode) -> bool {
    match reason {
        Uncacheable::Status => !status.is_server_error(),
        Uncacheable::SetCookie
        | Uncacheable::Private
        | Uncacheable::NoStore
        | Uncacheable::VaryStar
        | Uncacheable::VaryUnkeyed => true,
        Uncacheable::NoCache
        | Uncacheable::MaxAgeZero
        | Uncacheable::SMaxAgeZero
        | Uncacheable::Expired
        | Uncacheable::NoLifetime
        | Uncacheable::Tags => false,
    }
}

/// The hit-for-pass markers of one instance, by entry key (object and
/// variant).
#[derive(Default)]
pub(crate) struct PassMarkers {
    markers: Mutex<HashMap<String, Marker>>,
}

struct Marker {
    /// The object's generation the discovering fill held.
    generation: Bytes,
    until: Instant,
}

impl PassMarkers {
    /// Marks `entry_key` for requests that read `generation`, for `ttl`
    /// (zero: the route has hit-for-pass off).
    pub(crate) fn mark(&self, entry_key: &str, generation: &Bytes, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut markers = self.markers.lock().unwrap_or_else(|p| p.into_inner());
        if markers.len() >= MAX_MARKERS && !markers.contains_key(entry_key) {
            markers.retain(|_, m| m.until > now);
            if markers.len() >= MAX_MARKERS {
                return;
            }
        }
        let marker = Marker {
            generation: generation.clone(),
            until: now + ttl,
        };
        markers.insert(entry_key.to_owned(), marker);
    }

    /// Whether a request for `entry_key` that read `generation` is passed.
    /// A marker of another generation (the object was invalidated since)
    /// or past its time is dropped.
    pub(crate) fn is_marked(&self, entry_key: &str, generation: &[u8]) -> bool {
        let mut markers = self.markers.lock().unwrap_or_else(|p| p.into_inner());
        let Some(marker) = markers.get(entry_key) else {
            return false;
        };
        if marker.until > Instant::now() && marker.generation == generation {
            return true;
        }
        markers.remove(entry_key);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_marker_holds_for_its_generation_until_it_expires() {
        let m = PassMarkers::default();
        let g1 = Bytes::from_static(b"1.000001-a");
        m.mark("k", &g1, Duration::from_secs(60));
        assert!(m.is_marked("k", &g1));
        assert!(!m.is_marked("other", &g1));
        // Another generation (invalidated since): not passed, and gone.
        assert!(!m.is_marked("k", b"2.000001-b"));
        assert!(!m.is_marked("k", &g1));
        m.mark("k", &g1, Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(m.is_marked("k", &g1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!m.is_marked("k", &g1));
        // Off.
        m.mark("k", &g1, Duration::ZERO);
        assert!(!m.is_marked("k", &g1));
    }

    #[test]
    fn only_reasons_of_the_object_pass() {
        let ok = StatusCode::OK;
        assert!(passes(Uncacheable::NoStore, ok));
        assert!(passes(Uncacheable::Status, StatusCode::FOUND));
        assert!(!passes(Uncacheable::Status, StatusCode::BAD_GATEWAY));
        assert!(!passes(Uncacheable::NoCache, ok));
        assert!(!passes(Uncacheable::Tags, ok));
    }
}
