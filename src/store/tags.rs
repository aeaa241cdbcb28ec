//! Cache tags and version floors (docs/invalidation.md#dependent-invalidation)
//! as [`TagStore`]: a fill takes its tags' tickets, `publish_checked` compares
//! them, a tagged hit checks they are still current, and the feeds raise an
//! object's floor.

use super::protocol::{unsupported, StoreError};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// Tag tickets and the store's clock read with them
/// ([`TagStore::tag_tickets_timed`]).
pub(crate) type TimedTickets = (Vec<Bytes>, Option<Bytes>);

/// Tag generations, an object's remembered tag list, and version floors.
/// Optional for a backend: one without them keeps the defaults, which fail
/// every call.
pub trait TagStore {
    /// The current generation of each tag key, created fresh where missing
    /// (`lua/tag_tickets.lua`), TTL refreshed to `gen_ttl`.
    fn tag_tickets<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Bytes>, StoreError>> {
        let _ = (tag_keys, nonce, gen_ttl);
        unsupported("tags are not supported")
    }

    /// [`TagStore::tag_tickets`], plus the store's clock read in the same
    /// atomic step (`'<seconds>.<microseconds>'`, the shape of a
    /// generation's time): when the fill began, for
    /// [`TagStore::tag_tickets_since`]. `None` where the keys do not share
    /// one clock (Redis Cluster: other masters), and by default.
    fn tag_tickets_timed<'a>(
        &'a self,
        tag_keys: &'a [String],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<TimedTickets, StoreError>> {
        let tickets = self.tag_tickets(tag_keys, nonce, gen_ttl);
        Box::pin(async move { Ok((tickets.await?, None)) })
    }

    /// Tag tickets for tags a fill learned from its answer
    /// (`lua/tag_tickets_since.lua`): the current generation of each,
    /// created where missing, in one atomic step, but only if none was
    /// made at or after `since` (a [`TagStore::tag_tickets_timed`] clock),
    /// i.e. none of those tags was invalidated since the fill began.
    /// `None`: one was (nothing written).
    fn tag_tickets_since<'a>(
        &'a self,
        tag_keys: &'a [String],
        since: &'a [u8],
        nonce: &'a str,
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<Bytes>>, StoreError>> {
        let _ = (tag_keys, since, nonce, gen_ttl);
        unsupported("tags are not supported")
    }

    /// The current value of each key (`None`: missing): tag generations
    /// for the hit check of a tagged entry, an object's tag list before a
    /// fill; from the near cache where it holds them.
    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        let _ = tag_keys;
        unsupported("tags are not supported")
    }

    /// Whether every `(tag generation key, stamped generation)` is still
    /// current, if the backend can tell from process memory (the near
    /// cache): `Some(false)` as soon as one it holds differs, `None` when
    /// it does not hold them all ("ask with `read_tags`"). Never blocks.
    fn tags_current_near(&self, _stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        None
    }

    /// Records the tags an object's last answer carried (`SET key value
    /// PX ttl`), so the next fill takes their tickets before its upstream
    /// call.
    fn remember_tags<'a>(
        &'a self,
        list_key: &'a str,
        tags: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (list_key, tags, ttl);
        unsupported("tags are not supported")
    }

    /// Raises version floors (`lua/floor.lua`): `floors[i]` is (floor key,
    /// revision); TTL `gen_ttl`. Same error contract as `invalidate_many`.
    fn raise_floors<'a>(
        &'a self,
        floors: &'a [(String, i64)],
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (floors, gen_ttl);
        unsupported("floors are not supported")
    }
}
