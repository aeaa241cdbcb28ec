//! `mode: logical`: reads the service's changes from a logical replication
//! slot (pgoutput), so its transactions write nothing more. See
//! `docs/invalidation.md`, "Change capture".
//!
//! - **One consumer in the fleet.** Postgres streams a slot to one
//!   connection at a time. The instances compete for a one-slot witness
//!   lease in the store ([`super::super::witness`], renewed every 500 ms,
//!   1.5 s TTL); the holder streams. A standby that takes the lease from a
//!   holder that stopped (SIGSTOP, a hung host) finds the slot still
//!   active for the stopped holder's walsender and terminates it
//!   (`pg_terminate_backend`), so it takes over within about 2 s, not
//!   after `wal_sender_timeout`. A holder that loses its lease stops
//!   streaming; its unconfirmed changes are streamed again to the next.
//! - **At least once, never skipped.** The flush position sent to
//!   Postgres is a transaction's end only after every event of it (and of
//!   every transaction before it) has been applied to the store; a failed
//!   store call is retried before anything later is read. Applying twice is
//!   harmless (a generation is replaced, never incremented).
//! - **A slot that is created or lost** (dropped, invalidated by
//!   `max_slot_wal_keep_size`) means changes may have been missed: the slot
//!   is (re)created, then every mapped route is purged wholesale, counted
//!   and logged. A marker in the store records that the purge for the
//!   current slot was done, so a crash between creating the slot and
//!   purging is purged at the next start.

use super::super::backoff::{self, Reconnect};
use super::super::event::{Event, Poison};
use super::super::invalidator::{ApplyOutcome, Invalidator, Source};
use super::super::witness::Witness;
use super::rows::{Change, Events, Row, Value};
use crate::config::capture::{CaptureConfig, TableMapping};
use crate::metrics::Metrics;
use crate::pg::{PgConnector, PgError};
use futures_util::FutureExt;
use pg_walstream::{ColumnInfo, LogicalReplicationMessage, LogicalReplicationParser, TupleData};
use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationEvent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

/// Events applied per store batch inside a large transaction.
const BATCH: usize = 2048;
/// Reconnect after a failed session: 25 ms doubling to 5 s, jittered; at
/// the 25 ms pace for the first 5 s of an outage while Postgres is
/// restarting (refused, or 57P03), as the outbox worker does, so the
/// changes committed at its return are streamed at once.
const RETRY_BASE: Duration = Duration::from_millis(25);
const RETRY_MAX: Duration = Duration::from_secs(5);
const FAST_RECONNECT_FOR: Duration = Duration::from_secs(5);
/// How long a new holder waits for a stopped holder's walsender to exit
/// after terminating it.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(5);
/// How often the lag gauges are read from Postgres while streaming.
const LAG_EVERY: Duration = Duration::from_secs(1);
/// Feedback to Postgres: an applied position reaches the server within
/// this (the slot's `confirmed_flush_lsn`; WAL before it can be freed).
/// Short: a standby that takes over streams from the confirmed position,
/// so this bounds what it applies again (at least once) before it is
/// current. One small message per interval while changes flow.
const STATUS_INTERVAL: Duration = Duration::from_millis(50);
/// The purge marker's lifetime; renewed at every session start.
const MARKER_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Connect(#[from] PgError),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("replication: {0}")]
    Replication(#[from] PgWireError),
    #[error("replication: {0}")]
    Decode(String),
    /// The mapping does not fit the database: fix the config or the schema.
    #[error("{0}")]
    Schema(String),
    #[error("lost the capture lease to another instance")]
    LeaseLost,
    #[error("the replication stream ended")]
    Ended,
}

/// The logical consumer of one slot. Spawn [`LogicalConsumer::run`].
pub(crate) struct LogicalConsumer {
    cfg: CaptureConfig,
    invalidator: Arc<Invalidator>,
    metrics: Metrics,
}

/// A relation pgoutput described, with the mappings of its table.
struct Relation {
    columns: Vec<ColumnInfo>,
    mappings: Vec<usize>,
}

/// What the stream has been read into, between two applications.
struct Reader {
    parser: LogicalReplicationParser,
    relations: HashMap<u32, Relation>,
    /// Events read and not applied yet (possibly of several transactions).
    events: Events,
    /// The end and commit time of the last transaction read whole: what
    /// may be confirmed once `events` are applied.
    committed: Option<(Lsn, SystemTime)>,
    /// The commit time of the transaction being read (lag in seconds).
    reading_since: Option<SystemTime>,
    /// The position confirmed (or to confirm) to Postgres.
    applied: Lsn,
    /// A keepalive's position to confirm, read with nothing pending.
    idle_at: Option<Lsn>,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            parser: LogicalReplicationParser::with_protocol_version(1),
            relations: HashMap::new(),
            events: Events::default(),
            committed: None,
            reading_since: None,
            applied: Lsn::ZERO,
            idle_at: None,
        }
    }
}

/// A pgoutput tuple as a [`Row`].
struct Tuple<'a> {
    columns: &'a [ColumnInfo],
    data: &'a TupleData,
}

impl Row for Tuple<'_> {
    fn value(&self, column: &str) -> Option<Value<'_>> {
        let i = self.columns.iter().position(|c| &*c.name == column)?;
        let data = self.data.get_column(i)?;
        Some(if data.is_unchanged() {
            Value::Unchanged
        } else if data.is_null() {
            Value::Null
        } else {
            // Text format (the default); a value that is not UTF-8 names
            // no object a path could carry.
            std::str::from_utf8(data.as_bytes())
                .map(Value::Text)
                .unwrap_or(Value::Null)
        })
    }
}

impl CaptureError {
    /// Postgres is restarting: refused, or up but not accepting sessions
    /// yet (57P03). The outbox worker's rule, on this error's chain.
    fn is_restarting(&self) -> bool {
        match self {
            CaptureError::Replication(PgWireError::Io(io)) => {
                io.kind() == std::io::ErrorKind::ConnectionRefused
            }
            CaptureError::Replication(PgWireError::Server(m)) => m.contains("57P03"),
            CaptureError::Connect(e) => super::super::outbox::is_restarting(e),
            CaptureError::Postgres(e) => super::super::outbox::is_restarting(e),
            _ => false,
        }
    }
}

impl LogicalConsumer {
    pub(crate) fn new(cfg: CaptureConfig, invalidator: Arc<Invalidator>) -> LogicalConsumer {
        let metrics = invalidator.metrics().clone();
        LogicalConsumer {
            cfg,
            invalidator,
            metrics,
        }
    }

    /// Runs until `shutdown`: competes for the lease, streams while it
    /// holds it, reconnects with backoff after a failed session.
    pub(crate) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        info!(slot = %self.cfg.slot, publication = %self.cfg.publication, "change capture (logical) starting");
        let mut lease = Witness::new(self.invalidator.clone(), "capture", &self.cfg.slot, 1);
        let mut reconnect = Reconnect::new(RETRY_BASE, RETRY_MAX, RETRY_BASE, FAST_RECONNECT_FOR);
        loop {
            if *shutdown.borrow() {
                break;
            }
            lease.beat_if_due().await;
            if !lease.is_witness() {
                tokio::select! {
                    _ = tokio::time::sleep_until(lease.due_at()) => continue,
                    _ = shutdown.changed() => break,
                }
            }
            let session = self
                .session(&mut shutdown, &mut lease, &mut reconnect)
                .await;
            self.metrics.capture_streaming.set(0);
            let delay = match session {
                Ok(()) => break,
                Err(CaptureError::LeaseLost) => {
                    info!("change capture: lease lost; another instance streams now");
                    Duration::ZERO
                }
                Err(e) => {
                    match &e {
                        CaptureError::Schema(_) => {
                            error!(error = %e, "change capture stopped; retrying")
                        }
                        _ => warn!(error = %e, "change capture session failed; reconnecting"),
                    }
                    reconnect.next_delay(e.is_restarting())
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
            }
        }
        lease.release().await;
        self.metrics.capture_lag_bytes.set(0);
        self.metrics.capture_lag_seconds.set(0.0);
        info!("change capture (logical) stopped");
    }

    /// One session while holding the lease. `Ok` only on shutdown.
    async fn session(
        &self,
        shutdown: &mut watch::Receiver<bool>,
        lease: &mut Witness,
        reconnect: &mut Reconnect,
    ) -> Result<(), CaptureError> {
        let mut pg = PgConnector::parse(&self.cfg.url)?;
        pg.config
            .connect_timeout(CONNECT_TIMEOUT)
            .application_name("sidecache-capture");
        let (sql, connection) = pg.connect().await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let _driver = AbortOnDrop(driver.abort_handle());
        super::check_schema(&sql, &self.cfg).await?;
        let created = self.prepare_slot(&sql, lease).await?;
        self.purge_if_unproven(created).await?;
        let replication = pg
            .replication_config(&self.cfg.slot, &self.cfg.publication)?
            .with_start_lsn(Lsn::ZERO)
            .with_status_interval(STATUS_INTERVAL)
            .with_wakeup_interval(Duration::from_secs(1));
        let mut client = self.start(&sql, replication, lease).await?;
        reconnect.reset();
        self.metrics.capture_streaming.set(1);
        info!(slot = %self.cfg.slot, "change capture: streaming");
        let result = self.stream(&sql, &mut client, shutdown, lease).await;
        client.abort();
        result
    }

    /// Makes sure the slot exists and is usable; true if it was created
    /// now (changes before it were never seen).
    async fn prepare_slot(
        &self,
        sql: &tokio_postgres::Client,
        lease: &mut Witness,
    ) -> Result<bool, CaptureError> {
        let slot = &self.cfg.slot;
        let row = sql
            .query_opt(
                "SELECT plugin, wal_status, active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[slot],
            )
            .await?;
        let lost = match &row {
            None => false,
            Some(row) => {
                let plugin: Option<String> = row.try_get(0)?;
                if plugin.as_deref() != Some("pgoutput") {
                    return Err(CaptureError::Schema(format!(
                        "replication slot {slot:?} exists but is not a pgoutput logical slot \
                         (invalidation.capture.slot): drop it or name another"
                    )));
                }
                let status: Option<String> = row.try_get(1)?;
                status.as_deref() == Some("lost")
            }
        };
        if row.is_some() && !lost {
            return Ok(false);
        }
        if lost {
            warn!(slot = %slot, "change capture: the replication slot was invalidated (max_slot_wal_keep_size?); recreating it and purging every mapped route");
            self.terminate_holder(sql, lease).await?;
            sql.execute("SELECT pg_drop_replication_slot($1)", &[slot])
                .await?;
        } else {
            info!(slot = %slot, "change capture: creating the replication slot");
        }
        // Whatever the purge marker says now is about an older slot.
        self.forget_marker().await;
        sql.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[slot],
        )
        .await?;
        self.metrics
            .capture_slot_created
            .with_label_values(&[if lost { "lost" } else { "missing" }])
            .inc();
        Ok(true)
    }

    /// Purges every mapped route unless the marker proves it was done for
    /// this slot (always after creating it).
    async fn purge_if_unproven(&self, created: bool) -> Result<(), CaptureError> {
        let marker = self.marker_key();
        if !created {
            match self.invalidator.read_marker(&marker).await {
                Ok(true) => {
                    let _ = self.invalidator.set_marker(&marker, MARKER_TTL).await;
                    return Ok(());
                }
                Ok(false) => {
                    warn!(slot = %self.cfg.slot, "change capture: no record that this slot's start was purged (a new store, or a crash right after creating the slot); purging every mapped route")
                }
                Err(e) => return Err(CaptureError::Decode(format!("store: {e}"))),
            }
        }
        let mut events = Events::default();
        for m in &self.cfg.tables {
            events.truncate(m);
        }
        let n = events.len();
        self.apply(events.take()).await;
        self.invalidator
            .set_marker(&marker, MARKER_TTL)
            .await
            .map_err(|e| CaptureError::Decode(format!("store: {e}")))?;
        self.metrics.capture_route_purges.inc_by(n as u64);
        info!(routes = n, "change capture: every mapped route purged");
        Ok(())
    }

    fn marker_key(&self) -> String {
        crate::keys::capture_marker_key(&self.invalidator.namespace(), &self.cfg.slot)
    }

    async fn forget_marker(&self) {
        let _ = self.invalidator.clear_marker(&self.marker_key()).await;
    }

    /// Ends the walsender of a holder that stopped without letting go.
    async fn terminate_holder(
        &self,
        sql: &tokio_postgres::Client,
        lease: &mut Witness,
    ) -> Result<(), CaptureError> {
        let deadline = Instant::now() + TAKEOVER_WITHIN;
        loop {
            let row = sql
                .query_one(
                    "SELECT active_pid, pg_terminate_backend(active_pid) FROM \
                     (SELECT (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1) AS active_pid) s",
                    &[&self.cfg.slot],
                )
                .await?;
            let pid: Option<i32> = row.try_get(0)?;
            let Some(pid) = pid else {
                return Ok(());
            };
            info!(
                pid,
                "change capture: ending the walsender of the previous holder"
            );
            if Instant::now() >= deadline {
                return Err(CaptureError::Schema(format!(
                    "replication slot {:?} stays active for pid {pid}: the role needs the right to end it (pg_signal_backend, or the same role)",
                    self.cfg.slot
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
            if lease.beat_if_due().await && !lease.is_witness() {
                return Err(CaptureError::LeaseLost);
            }
        }
    }

    /// `START_REPLICATION`, taking the slot over from a stopped holder.
    async fn start(
        &self,
        sql: &tokio_postgres::Client,
        cfg: pgwire_replication::ReplicationConfig,
        lease: &mut Witness,
    ) -> Result<ReplicationClient, CaptureError> {
        let deadline = Instant::now() + TAKEOVER_WITHIN;
        loop {
            self.terminate_holder(sql, lease).await?;
            let mut client = ReplicationClient::connect(cfg.clone()).await?;
            match client.wait_started().await {
                Ok(()) => return Ok(client),
                // The terminated walsender may not have released the slot yet.
                Err(PgWireError::Server(m))
                    if m.contains("is active for PID") && Instant::now() < deadline =>
                {
                    client.abort();
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Streams until shutdown, a lost lease or an error. Whatever has
    /// arrived is read before applying: a backlog (a takeover replaying
    /// from the last confirmed position, a bulk change) is applied in
    /// batches of many transactions, one store call per `BATCH` events,
    /// instead of one per transaction; an idle stream applies each
    /// transaction as it commits.
    async fn stream(
        &self,
        sql: &tokio_postgres::Client,
        client: &mut ReplicationClient,
        shutdown: &mut watch::Receiver<bool>,
        lease: &mut Witness,
    ) -> Result<(), CaptureError> {
        let mut reader = Reader::default();
        let mut next_lag = Instant::now();
        loop {
            let event = tokio::select! {
                event = client.recv() => event?.ok_or(CaptureError::Ended)?,
                _ = tokio::time::sleep_until(lease.due_at()) => {
                    lease.beat().await;
                    if !lease.is_witness() {
                        return Err(CaptureError::LeaseLost);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(next_lag) => {
                    next_lag = Instant::now() + LAG_EVERY;
                    self.read_lag(sql, reader.applied, reader.reading_since).await;
                    continue;
                }
                _ = shutdown.changed() => return Ok(()),
            };
            self.read(&mut reader, event)?;
            // The receiver is a channel: taking what is ready loses nothing.
            while reader.events.len() < BATCH {
                match client.recv().now_or_never() {
                    Some(event) => self.read(&mut reader, event?.ok_or(CaptureError::Ended)?)?,
                    None => break,
                }
            }
            if reader.committed.is_none() && reader.events.len() < BATCH {
                // Between transactions a keepalive's position has nothing
                // left to apply before it.
                if let Some(idle) = reader.idle_at.take() {
                    client.update_applied_lsn(idle);
                }
                continue;
            }
            if !reader.events.is_empty() {
                self.apply_or_lose(reader.events.take(), lease).await?;
            }
            if let Some((end, commit_time)) = reader.committed.take() {
                client.update_applied_lsn(end);
                reader.applied = end;
                let late = SystemTime::now()
                    .duration_since(commit_time)
                    .unwrap_or_default();
                self.metrics.capture_lag_seconds.set(late.as_secs_f64());
            }
            if lease.beat_if_due().await && !lease.is_witness() {
                return Err(CaptureError::LeaseLost);
            }
        }
    }

    /// One replication event into `reader`.
    fn read(&self, reader: &mut Reader, event: ReplicationEvent) -> Result<(), CaptureError> {
        match event {
            ReplicationEvent::Begin {
                commit_time_micros, ..
            } => reader.reading_since = Some(pg_time(commit_time_micros)),
            ReplicationEvent::XLogData { data, .. } => {
                let message = reader
                    .parser
                    .parse_wal_message(&data)
                    .map_err(|e| CaptureError::Decode(e.to_string()))?;
                self.decode(message.message, &mut reader.relations, &mut reader.events);
            }
            ReplicationEvent::Commit {
                end_lsn,
                commit_time_micros,
                ..
            } => {
                reader.committed = Some((end_lsn, pg_time(commit_time_micros)));
                reader.reading_since = None;
            }
            ReplicationEvent::KeepAlive { wal_end, .. }
                if reader.reading_since.is_none()
                    && reader.committed.is_none()
                    && reader.events.is_empty()
                    && wal_end > reader.applied =>
            {
                reader.applied = wal_end;
                reader.idle_at = Some(wal_end);
            }
            _ => {}
        }
        Ok(())
    }

    /// The events of one pgoutput message.
    fn decode(
        &self,
        message: LogicalReplicationMessage,
        relations: &mut HashMap<u32, Relation>,
        events: &mut Events,
    ) {
        let mapped = |rel: &Relation| -> Vec<&TableMapping> {
            rel.mappings.iter().map(|i| &self.cfg.tables[*i]).collect()
        };
        match message {
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                columns,
                ..
            } => {
                let mappings = self
                    .cfg
                    .tables
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| {
                        *m.table.schema == *namespace && *m.table.name == *relation_name
                    })
                    .map(|(i, _)| i)
                    .collect();
                relations.insert(relation_id, Relation { columns, mappings });
            }
            LogicalReplicationMessage::Insert { relation_id, tuple } => {
                if let Some(rel) = relations.get(&relation_id) {
                    let new = Tuple {
                        columns: &rel.columns,
                        data: &tuple,
                    };
                    for m in mapped(rel) {
                        events.change(m, Change::Insert(&new));
                    }
                }
            }
            LogicalReplicationMessage::Update {
                relation_id,
                old_tuple,
                new_tuple,
                ..
            } => {
                if let Some(rel) = relations.get(&relation_id) {
                    let new = Tuple {
                        columns: &rel.columns,
                        data: &new_tuple,
                    };
                    let old = old_tuple.as_ref().map(|data| Tuple {
                        columns: &rel.columns,
                        data,
                    });
                    for m in mapped(rel) {
                        events.change(
                            m,
                            Change::Update {
                                old: old.as_ref(),
                                new: &new,
                            },
                        );
                    }
                }
            }
            LogicalReplicationMessage::Delete {
                relation_id,
                old_tuple,
                ..
            } => {
                if let Some(rel) = relations.get(&relation_id) {
                    let old = Tuple {
                        columns: &rel.columns,
                        data: &old_tuple,
                    };
                    for m in mapped(rel) {
                        events.change(m, Change::Delete(&old));
                    }
                }
            }
            LogicalReplicationMessage::Truncate { relation_ids, .. } => {
                for id in relation_ids {
                    if let Some(rel) = relations.get(&id) {
                        for m in mapped(rel) {
                            events.truncate(m);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// [`LogicalConsumer::apply`], giving up only when the lease is lost.
    async fn apply_or_lose(
        &self,
        events: Vec<Result<Event, Poison>>,
        lease: &mut Witness,
    ) -> Result<(), CaptureError> {
        let mut pending = events;
        let mut failures = 0u32;
        loop {
            pending = self.apply_once(pending).await;
            if pending.is_empty() {
                return Ok(());
            }
            failures += 1;
            let wait = backoff::exponential(RETRY_BASE, RETRY_MAX, failures);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.invalidator.feeds_ready() => {}
            }
            lease.beat_if_due().await;
            if !lease.is_witness() {
                return Err(CaptureError::LeaseLost);
            }
        }
    }

    /// Applies until every event is applied or dead-lettered.
    async fn apply(&self, events: Vec<Result<Event, Poison>>) {
        let mut pending = events;
        let mut failures = 0u32;
        while !pending.is_empty() {
            pending = self.apply_once(pending).await;
            if !pending.is_empty() {
                failures += 1;
                tokio::time::sleep(super::super::backoff::exponential(
                    RETRY_BASE, RETRY_MAX, failures,
                ))
                .await;
            }
        }
    }

    /// One attempt; returns the events the store failed.
    async fn apply_once(&self, events: Vec<Result<Event, Poison>>) -> Vec<Result<Event, Poison>> {
        let outcomes = self
            .invalidator
            .apply(Source::Capture, events.clone())
            .await;
        let mut failed = Vec::new();
        for (event, outcome) in events.into_iter().zip(outcomes) {
            match outcome {
                ApplyOutcome::Applied => {}
                ApplyOutcome::Poison(p) => {
                    warn!(reason = p.reason(), error = %p, "change capture: event dead-lettered");
                    self.metrics
                        .capture_dead_letters
                        .with_label_values(&[p.reason()])
                        .inc();
                    self.metrics
                        .dead_letters
                        .with_label_values(&["capture"])
                        .inc();
                }
                ApplyOutcome::Failed(_) => failed.push(event),
            }
        }
        failed
    }

    /// `sidecache_capture_lag_bytes` (WAL written that this consumer has
    /// not applied) and, while a transaction is being read, the seconds
    /// since it committed.
    async fn read_lag(
        &self,
        sql: &tokio_postgres::Client,
        applied: Lsn,
        reading: Option<SystemTime>,
    ) {
        if let Ok(row) = sql
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
        {
            let current: Result<String, _> = row.try_get(0);
            if let Some(current) = current.ok().and_then(|c| Lsn::parse(&c).ok()) {
                let behind = current.as_u64().saturating_sub(applied.as_u64());
                self.metrics
                    .capture_lag_bytes
                    .set(i64::try_from(behind).unwrap_or(i64::MAX));
            }
        }
        if let Some(since) = reading {
            let late = SystemTime::now().duration_since(since).unwrap_or_default();
            self.metrics.capture_lag_seconds.set(late.as_secs_f64());
        }
    }
}

/// Postgres timestamps count microseconds from 2000-01-01 UTC.
fn pg_time(micros: i64) -> SystemTime {
    const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;
    let epoch = SystemTime::UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    match u64::try_from(micros) {
        Ok(us) => epoch + Duration::from_micros(us),
        Err(_) => epoch,
    }
}

/// Aborts the SQL connection's driver when the session ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
