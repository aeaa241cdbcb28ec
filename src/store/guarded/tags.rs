//! The tags' and floors' calls behind the breaker and the timeout. Tag
//! keys live in slots of their own: on a cluster a call on several of them
//! is split by master, each group through its master's breaker.

use super::node_breakers::{pick, Breakers};
use super::{GuardedStore, Op};
use crate::store::protocol::StoreError;
use crate::store::tags::TimedTickets;
use bytes::Bytes;
use std::time::Duration;

/// Tags and floors behind the breaker and the timeout.
impl GuardedStore {
    /// Whether every stamped tag generation is current, from the near cache
    /// alone (`None`: it does not hold them all).
    pub(crate) fn tags_current_near(&self, stamped: &[(Bytes, Bytes)]) -> Option<bool> {
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

    /// `tag_tickets` plus the store's clock in the same step, where the
    /// keys share one clock (not on a cluster: `None`).
    pub async fn tag_tickets_timed(
        &self,
        tag_keys: &[String],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<TimedTickets, StoreError> {
        match &self.breakers {
            Breakers::One(b) => {
                self.call_through(b, Op::Ticket, |s| {
                    s.tag_tickets_timed(tag_keys, nonce, gen_ttl)
                })
                .await
            }
            Breakers::PerNode(_) => Ok((self.tag_tickets(tag_keys, nonce, gen_ttl).await?, None)),
        }
    }

    /// Tag tickets for tags learned from an answer, only if none of them
    /// was replaced since `since` (`None`: one was). Only where
    /// `tag_tickets_timed` gave a clock.
    pub async fn tag_tickets_since(
        &self,
        tag_keys: &[String],
        since: &[u8],
        nonce: &str,
        gen_ttl: Duration,
    ) -> Result<Option<Vec<Bytes>>, StoreError> {
        match &self.breakers {
            Breakers::One(b) => {
                self.call_through(b, Op::Ticket, |s| {
                    s.tag_tickets_since(tag_keys, since, nonce, gen_ttl)
                })
                .await
            }
            Breakers::PerNode(_) => Err(StoreError::Protocol(
                "tag tickets since a time: not on a cluster".into(),
            )),
        }
    }

    /// The current value of each key (tag generations, an object's tag
    /// list), from the near cache where it holds them all.
    pub(crate) async fn read_tags(
        &self,
        tag_keys: &[&str],
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
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

    pub(crate) async fn remember_tags(
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
    pub(crate) async fn raise_floors(
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
