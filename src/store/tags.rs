//! Cache tags and version floors (issue 13): a fill takes its tags'
//! tickets, `publish_checked` compares them, a tagged hit checks they are
//! still current, and the feeds raise an object's floor; as [`TagStore`],
//! and the [`GuardedStore`] calls that put the breaker and the timeout
//! around it. Tag keys live in slots of their own: on a cluster a call on
//! several of them is split by master.

use super::guarded::{GuardedStore, Op};
use super::node_breakers::{pick, Breakers};
use super::StoreError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::time::Duration;

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
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
    }

    /// The current value of each key (`None`: missing): tag generations
    /// for the hit check of a tagged entry, an object's tag list before a
    /// fill; from the near cache where it holds them.
    fn read_tags<'a>(
        &'a self,
        tag_keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<Option<Bytes>>, StoreError>> {
        let _ = tag_keys;
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
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
        Box::pin(async { Err(StoreError::Protocol("tags are not supported".into())) })
    }

    /// Raises version floors (`lua/floor.lua`): `floors[i]` is (floor key,
    /// revision); TTL `gen_ttl`. Same error contract as `invalidate_many`.
    fn raise_floors<'a>(
        &'a self,
        floors: &'a [(String, i64)],
        gen_ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (floors, gen_ttl);
        Box::pin(async { Err(StoreError::Protocol("floors are not supported".into())) })
    }
}

/// Tags and floors behind the breaker and the timeout.
impl GuardedStore {
    /// Whether every stamped tag generation is current, from the near cache
    /// alone (`None`: it does not hold them all).
    pub fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
        self.inner.tags_current_near(stamped)
    }

    /// The tags' current generations, created where missing (a fill's
    /// tag tickets).
    pub async fn tag_tickets(
        &self,
        tag_keys: &[String],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Vec<Bytes>, StoreError> {
        self.per_node(Op::Ticket, tag_keys, |s, group| {
            let group: Vec<String> = group.into_iter().cloned().collect();
            Box::pin(async move { s.tag_tickets(&group, nonce, gen_ttl).await })
        })
        .await
    }

    /// The current value of each key (tag generations, an object's tag
    /// list), from the near cache where it holds them all.
    pub async fn read_tags(&self, tag_keys: &[&str]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.read_tags_as(Op::Read, tag_keys).await
    }

    /// `read_tags` counted as `op`; split by master on a cluster, so a tag
    /// on a dead master fails the call (nothing is served whose tags cannot
    /// be shown current) without opening a healthy master's breaker.
    pub(super) async fn read_tags_as(
        &self,
        op: Op,
        tag_keys: &[&str],
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if let Breakers::One(b) = &self.breakers {
            return self.call_through(b, op, |s| s.read_tags(tag_keys)).await;
        }
        self.per_node(op, tag_keys, |s, group| {
            let group: Vec<&str> = group.into_iter().copied().collect();
            Box::pin(async move { s.read_tags(&group).await })
        })
        .await
    }

    /// Whether every `(tag generation key, stamped generation)` is still
    /// current: the hit check of a tagged entry. Answered from the near
    /// cache without allocating where it holds them (like `read`, no
    /// admission or timeout needed), else with one `read_tags`.
    pub async fn tags_current(&self, stamped: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        if let Some(current) = self.inner.tags_current_near(stamped) {
            return Ok(current);
        }
        let Some(keys) = stamped
            .iter()
            .map(|(k, _)| std::str::from_utf8(k).ok())
            .collect::<Option<Vec<&str>>>()
        else {
            return Ok(false);
        };
        let current = self.read_tags(&keys).await?;
        Ok(current.len() == stamped.len()
            && current
                .iter()
                .zip(stamped)
                .all(|(now, (_, then))| now.as_ref() == Some(then)))
    }

    pub async fn remember_tags(
        &self,
        list_key: &str,
        tags: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.call(Op::Publish, list_key, |s| {
            s.remember_tags(list_key, tags, ttl)
        })
        .await
    }

    /// Raises version floors; counted and timed as one `invalidate` call.
    /// `feed`: for the feeds' events, through the feeds' breaker (as
    /// `invalidate_marked`).
    pub async fn raise_floors(
        &self,
        floors: &[(String, i64)],
        gen_ttl: Duration,
        feed: bool,
    ) -> Vec<Result<(), StoreError>> {
        if floors.is_empty() {
            return Vec::new();
        }
        let keys: Vec<&str> = floors.iter().map(|(k, _)| k.as_str()).collect();
        if feed {
            return self
                .feeds_each(&keys, |s, group| {
                    let group = pick(floors, group);
                    Box::pin(async move { s.raise_floors(&group, gen_ttl).await })
                })
                .await;
        }
        let result = self
            .per_node(Op::Invalidate, &keys, |s, group| {
                let group: Vec<(String, i64)> = floors
                    .iter()
                    .filter(|(k, _)| group.iter().any(|g| **g == k.as_str()))
                    .cloned()
                    .collect();
                let n = group.len();
                Box::pin(async move {
                    s.raise_floors(&group, gen_ttl).await?;
                    Ok(vec![(); n])
                })
            })
            .await
            .map(drop);
        vec![result; floors.len()]
    }
}
