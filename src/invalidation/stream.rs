//! The Redis Stream consumer (docs/invalidation.md#redis-stream): services
//! append events to a stream; every sidecache instance joins one consumer
//! group, so each entry is applied by one instance, at least once.
//!
//! Entry format: fields `route` (route name), `params` (a JSON object of
//! param values, strings or integers), optional `kind` (`invalidate`,
//! `create`, `delete`; default `invalidate`) and optional `revision` (an
//! integer, informational). Anything else is poison: copied to
//! `<stream>:dead` with the original fields plus `reason` and `source_id`,
//! then acked, so it never blocks the entries behind it.
//!
//! Delivery: an entry is `XACK`ed only after its invalidation is applied; on
//! a store failure it stays pending in this consumer and is retried. At
//! start the consumer re-reads its own pending entries (a previous run with
//! the same name) and periodically `XAUTOCLAIM`s entries that any consumer
//! left pending longer than `claim_idle` (a dead instance). Names are unique
//! per process (host, pid, random), so a restarted process is a new
//! consumer and its predecessor's entries come back through the claim.
//!
//! Fan-out (docs/invalidation.md#no-feed-waits-for-one-instance): the group
//! gives each entry to one consumer, and a consumer that stops (SIGSTOP, a GC
//! pause, CPU throttling) would hold the entries delivered to it until it
//! resumes or `claim_idle` passes. So the feed's witnesses (`k` instances,
//! [`super::witness`]) also tail the stream with plain `XREAD` from a cursor of
//! their own (in memory, starting [`LOOKBACK`] before the stream's last entry
//! when the instance becomes a witness, which covers entries appended while a
//! slot was vacant) and apply every entry at once; the other instances only
//! consume through the group. Both paths apply with the entry's id as mark
//! (`lua/invalidate_marked.lua`): the first application replaces the
//! generation, every later one (other instances, the group path, a consumer
//! resuming with a backlog) finds it covered and changes nothing. The group
//! stays the reliable path: acknowledgement, dead letters, claims, history for
//! instances that start later. A group that disappears while running (Redis
//! restarted empty) is re-created at `0`, never at `$`, so entries appended
//! before the reconnect are not skipped
//! (docs/invalidation.md#what-the-consumer-does).
//!
//! Store health
//! (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events): while
//! the feeds' breaker is open (this instance's store calls fail; the request
//! path's breaker does not count) the group path reads no new entries, so the
//! group gives them to the other consumers, and the fan-out waits for the
//! breaker's probe instead of retrying. Entries already pending here were
//! applied by the others' fan-out; they are acked when this instance recovers,
//! or claimed after `claim_idle`.
//!
//! Each path has its own connection: a blocking `XREADGROUP`/`XREAD` on the
//! store's multiplexed connection would stall every request behind it. Their
//! response timeout exceeds `BLOCK`. Where they go (the single node, or the
//! Cluster master of the stream's slot, following `MOVED`, or the primary
//! Sentinel names):
//! [`super::stream_conn`].

use super::backoff::{Backoff, Reconnect};
use super::event::{Event, Poison};
use super::invalidator::{ApplyOutcome, Invalidator, Source};
use super::stream_conn::{StreamConn, StreamTarget};
use super::witness::{Witness, RENEW_EVERY, SLOT_TTL};
use crate::config::{RedisTls, StreamConfig, StreamStart};
use crate::metrics::Metrics;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamRangeReply, StreamReadReply};
use redis::{RedisError, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Entries read per call.
const COUNT: usize = 100;
/// Longest `BLOCK`; shorter when the claim period is shorter.
const MAX_BLOCK: Duration = Duration::from_secs(5);
const RECONNECT_BASE: Duration = Duration::from_millis(100);
/// Capped low like the outbox's: after a Redis restart, events wait for the
/// reconnect (docs/invalidation.md#what-the-consumer-does).
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// Own pending entries that failed are retried after this long.
const RETRY_OWN_AFTER: Duration = Duration::from_secs(1);
/// A fan-out batch that failed against the store is retried after this
/// long, doubling to one second (the group path keeps the entries anyway).
const FANOUT_RETRY_BASE: Duration = Duration::from_millis(50);
const FANOUT_RETRY_MAX: Duration = Duration::from_secs(1);
/// The fan-out's reconnect pace after a dropped or refused connection, for
/// the first [`FANOUT_FAST_FOR`] of an outage (then [`RECONNECT_BASE`]
/// doubling): both cost a restarting Redis nothing, and only the `k`
/// witnesses run the fan-out.
const FANOUT_RECONNECT_FAST: Duration = Duration::from_millis(25);
const FANOUT_FAST_FOR: Duration = Duration::from_secs(5);
/// A new witness's cursor starts this far before the stream's last entry:
/// longer than a vacant slot lasts (its holder's last renewal, then TTL).
const LOOKBACK: Duration = Duration::from_secs(3);
/// Dead-letter stream length bound (approximate trim).
const DEAD_MAXLEN: usize = 100_000;

/// The consumer. Build with [`StreamConsumer::new`], spawn [`StreamConsumer::run`].
pub struct StreamConsumer {
    cfg: StreamConfig,
    conn: StreamConn,
    consumer: String,
    invalidator: Arc<Invalidator>,
    metrics: Metrics,
    /// `invalidation.witnesses`.
    witnesses: u32,
}

impl StreamConsumer {
    /// `target` is the store's Redis (`tls` its certificates); the consumer
    /// opens its own connections to the stream's node.
    pub fn new(
        cfg: StreamConfig,
        target: StreamTarget,
        tls: Option<RedisTls>,
        invalidator: Arc<Invalidator>,
    ) -> StreamConsumer {
        let metrics = invalidator.metrics().clone();
        StreamConsumer {
            conn: StreamConn::new(target, tls, cfg.stream.clone()),
            cfg,
            consumer: consumer_name(),
            invalidator,
            metrics,
            witnesses: 2,
        }
    }

    /// `invalidation.witnesses` (default 2).
    pub(crate) fn with_witnesses(mut self, k: u32) -> StreamConsumer {
        self.witnesses = k;
        self
    }

    fn dead_stream(&self) -> String {
        format!("{}:dead", self.cfg.stream)
    }

    /// How often to `XAUTOCLAIM` and refresh the pending gauge.
    fn claim_every(&self) -> Duration {
        (self.cfg.claim_idle / 2).clamp(Duration::from_millis(100), MAX_BLOCK)
    }

    /// Runs the group path and the fan-out until `shutdown` becomes true
    /// (or its sender is dropped), each reconnecting with jittered
    /// exponential backoff.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        info!(
            stream = %self.cfg.stream,
            group = %self.cfg.group,
            consumer = %self.consumer,
            "stream consumer starting"
        );
        tokio::join!(self.run_group(shutdown.clone()), self.run_fanout(shutdown));
        info!("stream consumer stopped");
    }

    /// The consumer group path.
    async fn run_group(&self, mut shutdown: watch::Receiver<bool>) {
        let mut reconnect = Backoff::new(RECONNECT_BASE, RECONNECT_MAX);
        let mut first = true;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let session = self.session(&mut reconnect, first);
            first = false;
            tokio::select! {
                result = session => {
                    if let Err(e) = result {
                        self.conn.follow(&e);
                        warn!(error = %e, "stream consumer lost Redis; reconnecting");
                    }
                }
                _ = shutdown.changed() => break,
            }
            let delay = reconnect.next_delay();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
            }
        }
    }

    /// A connection of its own whose response timeout exceeds `block`.
    async fn connect(&self, block: Duration) -> Result<MultiplexedConnection, RedisError> {
        self.conn.connect(block).await
    }

    /// One connection's life on the group path; returns only on a Redis
    /// error. `first`: the process's first session (a group missing then
    /// starts where `start` says; missing later, Redis lost it).
    async fn session(&self, reconnect: &mut Backoff, first: bool) -> Result<(), RedisError> {
        let block = self.claim_every();
        let mut conn = self.connect(block).await?;
        self.ensure_group(&mut conn, first).await?;
        info!("stream consumer connected");

        // Own pending first: entries this name was given and never acked.
        let mut retry_own_at = Some(Instant::now());
        let mut claim_at = Instant::now();
        let mut claim_cursor = "0-0".to_owned();
        loop {
            if let Some(at) = self.invalidator.feeds_ready_at() {
                // The store is unavailable to this instance: read nothing,
                // so that the group gives new entries to the others. (Only
                // the witnesses' fan-out probes early: k instances, not a
                // fleet knocking at a Redis that is coming back.)
                tokio::time::sleep_until(at).await;
                continue;
            }
            if retry_own_at.is_some_and(|at| Instant::now() >= at) {
                let failed = self.process_own_pending(&mut conn).await?;
                retry_own_at = failed.then(|| Instant::now() + RETRY_OWN_AFTER);
            }
            if Instant::now() >= claim_at {
                let (next, failed) = self.claim(&mut conn, &claim_cursor).await?;
                claim_cursor = next;
                if failed {
                    retry_own_at.get_or_insert(Instant::now() + RETRY_OWN_AFTER);
                }
                self.refresh_pending(&mut conn).await?;
                claim_at = Instant::now() + self.claim_every();
            }
            let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&self.cfg.group)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(COUNT)
                .arg("BLOCK")
                .arg(block.as_millis() as u64)
                .arg("STREAMS")
                .arg(&self.cfg.stream)
                .arg(">")
                .query_async(&mut conn)
                .await?;
            // A full round worked: only now forget earlier failures, so a
            // session that connects but always fails keeps backing off.
            reconnect.reset();
            let entries = flatten(reply);
            if !entries.is_empty() && self.process(&mut conn, &entries).await? {
                retry_own_at.get_or_insert(Instant::now() + RETRY_OWN_AFTER);
            }
        }
    }

    /// `XGROUP CREATE ... MKSTREAM`; an existing group (`BUSYGROUP`) is fine.
    /// Created at `start` in the process's first session; a group that is
    /// missing on a reconnect was lost with Redis's data, and `$` would skip
    /// every entry appended since: it starts at `0` (re-applying what is
    /// there is harmless).
    async fn ensure_group(
        &self,
        conn: &mut MultiplexedConnection,
        first: bool,
    ) -> Result<(), RedisError> {
        let start = match self.cfg.start {
            _ if !first => "0",
            StreamStart::Latest => "$",
            StreamStart::Earliest => "0",
        };
        let created: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.cfg.stream)
            .arg(&self.cfg.group)
            .arg(start)
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Ok(()) if first => {
                info!(group = %self.cfg.group, start, "consumer group created");
                Ok(())
            }
            Ok(()) => {
                warn!(group = %self.cfg.group, "consumer group was missing (Redis restarted without its data?); re-created at the stream's start");
                Ok(())
            }
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Re-reads every entry pending on this consumer, page by page. True if
    /// some still failed (store down): retry later.
    async fn process_own_pending(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<bool, RedisError> {
        let mut after = "0-0".to_owned();
        loop {
            let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&self.cfg.group)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(COUNT)
                .arg("STREAMS")
                .arg(&self.cfg.stream)
                .arg(&after)
                .query_async(conn)
                .await?;
            let entries = flatten(reply);
            let Some(last) = entries.last() else {
                return Ok(false);
            };
            after = last.id.clone();
            if self.process(conn, &entries).await? {
                // The store is failing: the rest can wait for the retry.
                return Ok(true);
            }
        }
    }

    /// One `XAUTOCLAIM` page of entries idle longer than `claim_idle`,
    /// processed at once. Returns the next cursor and whether some failed.
    async fn claim(
        &self,
        conn: &mut MultiplexedConnection,
        cursor: &str,
    ) -> Result<(String, bool), RedisError> {
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&self.cfg.stream)
            .arg(&self.cfg.group)
            .arg(&self.consumer)
            .arg(self.cfg.claim_idle.as_millis() as u64)
            .arg(cursor)
            .arg("COUNT")
            .arg(COUNT)
            .query_async(conn)
            .await?;
        if !reply.claimed.is_empty() {
            info!(
                entries = reply.claimed.len(),
                "claimed stream entries left pending by another consumer"
            );
        }
        let failed = if reply.claimed.is_empty() {
            false
        } else {
            self.process(conn, &reply.claimed).await?
        };
        Ok((reply.next_stream_id, failed))
    }

    async fn refresh_pending(&self, conn: &mut MultiplexedConnection) -> Result<(), RedisError> {
        // XPENDING summary: [count, min-id, max-id, [[consumer, count]...]]
        let summary: Value = redis::cmd("XPENDING")
            .arg(&self.cfg.stream)
            .arg(&self.cfg.group)
            .query_async(conn)
            .await?;
        if let Value::Array(items) = summary {
            if let Some(Value::Int(n)) = items.first() {
                self.metrics.stream_pending.set(*n);
            }
        }
        Ok(())
    }

    /// Applies entries marked with their ids (see the module doc).
    async fn apply(&self, source: Source, entries: &[StreamId]) -> Vec<ApplyOutcome> {
        let events = entries
            .iter()
            .map(|e| (entry_event(e), format!("s:{}", e.id)))
            .collect();
        self.invalidator.apply_marked(source, events).await
    }

    /// The fan-out path, while this instance is a witness: tails the stream
    /// from its own cursor. Otherwise it only beats for a slot.
    async fn run_fanout(&self, mut shutdown: watch::Receiver<bool>) {
        let mut witness = Witness::new(
            self.invalidator.clone(),
            "stream",
            &self.cfg.stream,
            self.witnesses,
        );
        // A dropped or refused connection (a Redis restart) is retried at
        // a short pace for a while: entries appended right after the
        // restart wait for this reconnect, while reads may already hit.
        let mut reconnect = Reconnect::new(
            RECONNECT_BASE,
            RECONNECT_MAX,
            FANOUT_RECONNECT_FAST,
            FANOUT_FAST_FOR,
        );
        // Survives reconnects: after a Redis restart the new entries' ids
        // are later than any this process read (ids follow Redis's clock).
        // Dropped when the instance stops being a witness.
        let mut cursor: Option<String> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            witness.beat_if_due().await;
            if !witness.is_witness() {
                cursor = None;
                tokio::select! {
                    _ = tokio::time::sleep_until(witness.due_at()) => continue,
                    _ = shutdown.changed() => break,
                }
            }
            let fast;
            tokio::select! {
                result = self.fanout_session(&mut cursor, &mut reconnect, &mut witness) => {
                    match result {
                        // No longer a witness.
                        Ok(()) => continue,
                        Err(e) => {
                            self.conn.follow(&e);
                            warn!(error = %e, "stream fan-out lost Redis; reconnecting");
                            fast = e.is_connection_refusal() || e.is_connection_dropped();
                        }
                    }
                }
                _ = shutdown.changed() => break,
            }
            let delay = reconnect.next_delay(fast);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
            }
        }
        witness.release().await;
    }

    /// One connection's life on the fan-out path; returns `Ok` when this
    /// instance stops being a witness, else on a Redis error. A batch that
    /// fails against the store is retried (capped backoff) before the
    /// cursor moves past it. The witness renews its slot (through the
    /// store, not this connection) while the read blocks.
    async fn fanout_session(
        &self,
        cursor: &mut Option<String>,
        reconnect: &mut Reconnect,
        witness: &mut Witness,
    ) -> Result<(), RedisError> {
        let mut conn = self.connect(MAX_BLOCK).await?;
        let mut after = match cursor.clone() {
            Some(c) => c,
            None => self.lookback_id(&mut conn).await?,
        };
        *cursor = Some(after.clone());
        let mut retry = Backoff::new(FANOUT_RETRY_BASE, FANOUT_RETRY_MAX);
        loop {
            witness.beat_if_due().await;
            if !witness.is_witness() {
                return Ok(());
            }
            let mut xread = redis::cmd("XREAD");
            xread
                .arg("COUNT")
                .arg(COUNT)
                .arg("BLOCK")
                .arg(MAX_BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&self.cfg.stream)
                .arg(&after);
            let read = xread.query_async::<Option<StreamReadReply>>(&mut conn);
            tokio::pin!(read);
            let reply = loop {
                tokio::select! {
                    reply = &mut read => break reply?,
                    _ = tokio::time::sleep_until(witness.due_at()) => {
                        // Lost the slot: stop now (the connection goes
                        // with the session, and the read with it).
                        if witness.beat().await && !witness.is_witness() {
                            return Ok(());
                        }
                    }
                }
            };
            reconnect.reset();
            let entries = flatten(reply);
            let Some(last) = entries.last() else {
                continue;
            };
            loop {
                let outcomes = self.apply(Source::StreamFanout, &entries).await;
                if !outcomes
                    .iter()
                    .any(|o| matches!(o, ApplyOutcome::Failed(_)))
                {
                    break;
                }
                match self.invalidator.feeds_ready_at() {
                    Some(_) => self.invalidator.feeds_ready().await,
                    None => tokio::time::sleep(retry.next_delay()).await,
                }
                witness.beat_if_due().await;
            }
            retry.reset();
            after = last.id.clone();
            *cursor = Some(after.clone());
        }
    }

    /// Where a new witness's cursor starts: [`LOOKBACK`] before the
    /// stream's last entry (`0-0` if it has none or is younger). Entries a
    /// vacant slot may have left to a stopped consumer are applied again
    /// (covered checks if they were not); older history is the group's.
    async fn lookback_id(&self, conn: &mut MultiplexedConnection) -> Result<String, RedisError> {
        const _: () =
            assert!(LOOKBACK.as_millis() > SLOT_TTL.as_millis() + RENEW_EVERY.as_millis());
        let last: StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&self.cfg.stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn)
            .await?;
        let last_ms = last
            .ids
            .first()
            .and_then(|e| e.id.split('-').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let from = last_ms.saturating_sub(LOOKBACK.as_millis() as u64);
        Ok(format!("{from}-0"))
    }

    /// Applies entries, dead-letters poison ones, acks all but the failed.
    /// True if some failed against the store (left pending for a retry).
    async fn process(
        &self,
        conn: &mut MultiplexedConnection,
        entries: &[StreamId],
    ) -> Result<bool, RedisError> {
        let outcomes = self.apply(Source::Stream, entries).await;
        let mut pipe = redis::pipe();
        let mut ack = Vec::new();
        let mut dead = 0u64;
        let mut failed = false;
        for (entry, outcome) in entries.iter().zip(&outcomes) {
            match outcome {
                ApplyOutcome::Applied => ack.push(entry.id.as_str()),
                ApplyOutcome::Failed(_) => failed = true,
                ApplyOutcome::Poison(reason) => {
                    let mut xadd = redis::cmd("XADD");
                    xadd.arg(self.dead_stream())
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(DEAD_MAXLEN)
                        .arg("*");
                    let mut fields: Vec<(&String, &Value)> = entry.map.iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(b.0));
                    for (name, value) in fields {
                        xadd.arg(name).arg(value_bytes(value));
                    }
                    xadd.arg("reason")
                        .arg(reason.to_string())
                        .arg("source_id")
                        .arg(&entry.id);
                    pipe.add_command(xadd).ignore();
                    ack.push(entry.id.as_str());
                    dead += 1;
                    warn!(id = %entry.id, %reason, stream = %self.cfg.stream, "stream entry dead-lettered");
                }
            }
        }
        if !ack.is_empty() {
            // After the dead-letter copies in the same pipeline: an entry is
            // never acked before its copy exists (the pipeline stops at
            // nothing, but XADD of a poison copy cannot fail for content).
            pipe.cmd("XACK")
                .arg(&self.cfg.stream)
                .arg(&self.cfg.group)
                .arg(&ack)
                .ignore();
            pipe.query_async::<()>(conn).await?;
        }
        self.metrics
            .dead_letters
            .with_label_values(&[Source::Stream.as_str()])
            .inc_by(dead);
        if failed {
            warn!("stream entries not applied (store unavailable); left pending for a retry");
        }
        Ok(failed)
    }
}

fn flatten(reply: Option<StreamReadReply>) -> Vec<StreamId> {
    reply
        .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
        .unwrap_or_default()
}

/// An entry as an event (format in the module doc).
fn entry_event(entry: &StreamId) -> Result<Event, Poison> {
    if entry.map.is_empty() {
        return Err(Poison::Malformed("entry has no fields (deleted?)".into()));
    }
    let text = |name: &str| -> Result<Option<String>, Poison> {
        match entry.map.get(name) {
            None => Ok(None),
            Some(v) => String::from_utf8(value_bytes(v))
                .map(Some)
                .map_err(|_| Poison::Malformed(format!("field {name:?} is not UTF-8"))),
        }
    };
    if let Some(extra) = entry.map.keys().find(|k| {
        !matches!(
            k.as_str(),
            "route" | "params" | "kind" | "revision" | "tags"
        )
    }) {
        return Err(Poison::Malformed(format!("unknown field {extra:?}")));
    }
    // `tags`: a JSON array, or names separated by spaces or commas.
    let tags: Vec<String> = match text("tags")? {
        None => Vec::new(),
        Some(t) if t.trim_start().starts_with('[') => serde_json::from_str(&t)
            .map_err(|e| Poison::Malformed(format!("tags is not a JSON array of strings: {e}")))?,
        Some(t) => t
            .split([' ', ','])
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    let route = match text("route")? {
        Some(route) => route,
        None if !tags.is_empty() => String::new(),
        None => return Err(Poison::Malformed("no route field".into())),
    };
    let params = match text("params")? {
        Some(p) => serde_json::from_str(&p)
            .map_err(|e| Poison::Malformed(format!("params is not JSON: {e}")))?,
        None => serde_json::Value::Object(Default::default()),
    };
    let kind = text("kind")?.unwrap_or_default();
    let revision = match text("revision")? {
        None => None,
        Some(r) if r.is_empty() => None,
        Some(r) => Some(
            r.parse::<i64>()
                .map_err(|_| Poison::Malformed(format!("revision {r:?} is not an integer")))?,
        ),
    };
    Event::from_parts(&route, &params, &kind, revision, tags)
}

fn value_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        Value::Int(i) => i.to_string().into_bytes(),
        other => format!("{other:?}").into_bytes(),
    }
}

/// Unique per process, stable for its life.
fn consumer_name() -> String {
    super::process_token()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn entry(fields: &[(&str, &str)]) -> StreamId {
        StreamId {
            id: "1-0".into(),
            map: fields
                .iter()
                .map(|(k, v)| (k.to_string(), Value::BulkString(v.as_bytes().to_vec())))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn entry_format() {
        let e = entry_event(&entry(&[
            ("route", "app"),
            ("params", r#"{"tenant":"t","id":7}"#),
            ("kind", "create"),
            ("revision", "12"),
        ]))
        .unwrap();
        assert_eq!(e.route, "app");
        assert_eq!(e.params.get("id").map(String::as_str), Some("7"));
        assert_eq!(e.revision, Some(12));
        assert!(entry_event(&entry(&[("route", "app"), ("params", "[1]")])).is_err());
        assert!(entry_event(&entry(&[("params", "{}")])).is_err());
        assert!(entry_event(&entry(&[("route", "a"), ("x", "1")])).is_err());
        assert!(entry_event(&entry(&[("route", "a"), ("kind", "upsert")])).is_err());
        assert!(entry_event(&entry(&[])).is_err());
    }

    #[test]
    fn consumer_names_are_unique() {
        assert_ne!(consumer_name(), consumer_name());
    }
}
