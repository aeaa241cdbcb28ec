//! The Postgres outbox worker (docs/invalidation.md#postgres-outbox): the
//! service writes one row per change in the same transaction as the change;
//! this worker turns rows into invalidations, at least once, with nothing lost.
//!
//! One cycle is one transaction: claim due rows `ORDER BY next_at, id LIMIT batch FOR
//! UPDATE SKIP LOCKED` (several sidecars can share a table; a row is in at
//! most one claim at a time) and delete them in the same statement, apply
//! them to the store in one batch, then commit. If any row failed or is
//! poison, the transaction rolls back instead and a second one deletes the
//! applied rows, gives failed rows `attempts+1` and `last_error`, and marks
//! poison rows `dead_at`. While claims come back full, each is twice the
//! last (up to `MAX_CLAIM`). A failed row is released due, with a
//! NOTIFY, when the store is unavailable to this instance (its feeds'
//! breaker opened: another instance's store may work); it backs off
//! (`next_at`, 1 s doubling to 60 s, jittered) when the store answered but
//! refused it.
//!
//! Store health
//! (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events): the
//! worker takes no rows while the feeds' breaker is open
//! (`Invalidator::feeds_ready_at`), neither in the fan-out nor in a claim; it
//! looks again when the breaker lets a probe through, or, a witness, as soon as
//! the store answers its early probe (`Invalidator::feeds_ready`: a Redis
//! restarted in 30 ms serves reads long before a cooldown ends, and the events
//! committed meanwhile must not wait for it). That breaker is the feeds' own:
//! the request path's does not stop it. A crash anywhere before the commit
//! leaves every claimed row in place to be applied again (harmless:
//! idempotent).
//!
//! Fan-out (docs/invalidation.md#no-feed-waits-for-one-instance): a worker
//! stopped between its claim and its commit (SIGSTOP, a GC pause, CPU
//! throttling) keeps its rows locked, and `SKIP LOCKED` hides them from every
//! other worker until it resumes; a worker whose store fails pushes its rows
//! into backoff, where the others' claims do not look either. So on every
//! wake-up each *witness* (`k` instances, [`super::witness`]) first reads the
//! pending rows (not dead-lettered, due or in backoff) without locking them (a
//! plain `SELECT` is never blocked by row locks) and applies those it has not
//! applied yet, with the mark `o:<id>:<created_at µs>`
//! (`lua/invalidate_marked.lua`): the first application replaces the
//! generation, the others find it covered and change nothing. No lock is held
//! while it applies. The claim cycle stays the reliable path (delete, retry
//! with backoff, dead letters); rows this worker already applied are deleted
//! there without another store call.
//!
//! Only witnesses LISTEN: a NOTIFY costs `k` wake-ups, not one per
//! instance. The other instances poll every `idle_poll_interval` (a safety
//! net that claims whatever is pending, e.g. while every witness is
//! stopped) and beat for a slot; one that takes a slot LISTENs, then reads
//! the pending rows at once.
//!
//! Wake-ups: a witness's connection `LISTEN`s on `notify_channel` (the
//! `outbox-ddl` trigger notifies per inserting statement). Notifications
//! only arrive on a connection whose `Connection` future we poll ourselves
//! (`poll_message`), so the worker drives it and forwards notifications over
//! a channel. The table is always polled after (re)connecting, because
//! notifications sent while disconnected are lost; then, by a witness, every
//! `poll_interval` while rows are pending, and every `idle_poll_interval`
//! once none is (LISTEN is up on this same connection, so that poll is a safety
//! net, and idle instances cost Postgres almost nothing:
//! docs/invalidation.md#what-the-worker-does). The connection (TLS per the
//! URL's `sslmode`) is made by [`crate::pg`].
//!
//! Gauges (`pending`, `oldest`, `dead`): reported by the holder of witness
//! slot 0, from its fan-out read (the same statement returns them, at most
//! every `GAUGE_EVERY`); the others report 0.

use super::backoff::{self, Reconnect};
use super::event::{Event, Poison};
use super::invalidator::{ApplyOutcome, Invalidator, Source};
use super::witness::Witness;
use crate::config::OutboxConfig;
use crate::metrics::Metrics;
use std::collections::HashSet;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client, Statement};
use tracing::{debug, info, warn};

/// Retry schedule of a failed row: 1 s doubling to 60 s, jittered.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// Reconnect schedule after losing Postgres: 25 ms doubling to 1 s,
/// jittered. Capped low (docs/invalidation.md#what-the-worker-does): after a
/// Postgres restart the first commits wait for the reconnect, and LISTEN + the
/// catch-up poll follow it at once.
const RECONNECT_BASE: Duration = Duration::from_millis(25);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// While Postgres restarts, the worker retries at this pace instead of
/// backing off (the history checker saw reads stale for up to ~0.6 s after a
/// restart, the backoff's wait:
/// docs/invalidation.md#checked-from-outside-the-history-checker). Nothing
/// listening costs the database nothing (the kernel refuses); during crash
/// recovery each try costs the postmaster a short-lived child that answers
/// 57P03, and the first commits after recovery wait for this reconnect (57 ms
/// seen with the backoff) ...
const RECONNECT_REFUSED: Duration = Duration::from_millis(25);
/// ... for this long into an outage; a longer one falls back to the
/// backoff, so a fleet does not keep knocking at a host that is down
/// ([`Reconnect`]).
const FAST_RECONNECT_FOR: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one claim-apply-commit cycle; a hung server or network then
/// costs a reconnect, not a stuck worker.
const CYCLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the gauge leader (witness slot 0) also reads the
/// pending/oldest/dead gauges with its fan-out read; the others report 0.
const GAUGE_EVERY: Duration = Duration::from_secs(2);
/// `last_error` is for humans; keep rows small.
const MAX_ERROR_TEXT: usize = 500;
/// A drain doubles its claim while claims come back full, up to this many
/// rows (or `batch`, if larger): a bulk change of 100 000 rows then costs
/// ~60 transactions instead of 1 000, each still well inside
/// [`CYCLE_TIMEOUT`] (docs/invalidation.md#bulk-changes).
const MAX_CLAIM: u32 = 2048;

/// Why a worker session ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboxError {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Connect(#[from] crate::pg::PgError),
    #[error("cannot connect within {0:?}")]
    ConnectTimeout(Duration),
    #[error("a claim cycle took longer than {0:?}")]
    CycleTimeout(Duration),
    #[error("connection closed")]
    Closed,
}

impl OutboxError {
    /// Postgres is restarting: nothing listens on its port (the connect was
    /// refused), or the postmaster is up but not yet accepting sessions
    /// (SQLSTATE 57P03, "the database system is starting up" during crash
    /// recovery). Either way it is about to be back.
    fn is_restarting(&self) -> bool {
        is_restarting(self)
    }
}

/// Whether Postgres is restarting, read off an error's chain: nothing
/// listens on its port (the connect was refused), or the postmaster is up
/// but not yet accepting sessions (SQLSTATE 57P03, "the database system is
/// starting up" during crash recovery). Either way it is about to be back.
pub(crate) fn is_restarting(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
            return db.code() == &tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW;
        }
        source = err.source();
    }
    false
}

/// What one wake-up found.
#[derive(Debug, Default)]
struct WokeUp {
    /// Nothing pending: poll at `idle_poll_interval`.
    idle: bool,
    /// The store is unavailable to this instance until then.
    store_back_at: Option<Instant>,
}

/// What one cycle did, for draining decisions and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CycleReport {
    pub claimed: usize,
    pub applied: usize,
    pub failed: usize,
    pub dead: usize,
}

/// The outbox worker. Build one per process with [`OutboxWorker::new`] and
/// spawn [`OutboxWorker::run`].
pub struct OutboxWorker {
    cfg: OutboxConfig,
    invalidator: Arc<Invalidator>,
    metrics: Metrics,
    /// `invalidation.witnesses`.
    witnesses: u32,
}

/// The SQL of one table, prepared once per connection.
struct Statements {
    /// The rows not dead-lettered, unlocked, also those in backoff (the
    /// fan-out).
    pending: Statement,
    /// `pending`, with the gauges (the leader's read: no statement of its own;
    /// docs/invalidation.md#what-the-worker-does).
    pending_gauges: Statement,
    claim: Statement,
    delete: Statement,
    retry: Statement,
    dead: Statement,
    /// `pg_notify($1, '')`: wakes the workers when rows are released.
    notify: Statement,
}

/// Columns of `pending_gauges` after the row's own: pending, dead, oldest.
const GAUGE_COLUMNS: usize = 8;

impl Statements {
    async fn prepare(client: &Client, table: &str) -> Result<Statements, tokio_postgres::Error> {
        // `table` is a validated identifier (config), safe to splice.
        // `tags` through the row's JSON: a table from before the column
        // was added (see `outbox-ddl`) reads as NULL instead of failing.
        let columns = "id, route, params::text, kind, revision, attempts, \
                       (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint AS created_us, \
                       (to_jsonb(o) -> 'tags')::text AS tags";
        let pending = format!(
            "SELECT {columns} FROM {table} o WHERE dead_at IS NULL ORDER BY next_at, id LIMIT $1"
        );
        Ok(Statements {
            pending: client.prepare(&pending).await?,
            // One row at least (NULL id: nothing pending), each with the
            // table's gauges.
            pending_gauges: client
                .prepare(&format!(
                    "SELECT p.*, g.* FROM \
                     (SELECT count(*) FILTER (WHERE dead_at IS NULL) AS pending_rows, \
                     count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead_rows, \
                     COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) \
                     FILTER (WHERE dead_at IS NULL)), 0)::float8 AS oldest FROM {table}) g \
                     LEFT JOIN LATERAL ({pending}) p ON true"
                ))
                .await?,
            // Claimed rows are deleted at once: a cycle whose rows all apply
            // (nearly every one) only commits; one that does not rolls back
            // and settles its rows in a second transaction (`cycle`).
            claim: client
                .prepare(&format!(
                    "DELETE FROM {table} o WHERE o.id IN (SELECT id FROM {table} \
                     WHERE dead_at IS NULL AND next_at <= now() \
                     ORDER BY next_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                     RETURNING {columns}"
                ))
                .await?,
            delete: client
                .prepare(&format!("DELETE FROM {table} WHERE id = ANY($1::bigint[])"))
                .await?,
            retry: client
                .prepare(&format!(
                    "UPDATE {table} AS o SET attempts = o.attempts + 1, \
                     next_at = now() + make_interval(secs => u.delay), last_error = u.err \
                     FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS u(id, delay, err) \
                     WHERE o.id = u.id"
                ))
                .await?,
            dead: client
                .prepare(&format!(
                    "UPDATE {table} AS o SET dead_at = now(), last_error = u.err \
                     FROM unnest($1::bigint[], $2::text[]) AS u(id, err) WHERE o.id = u.id"
                ))
                .await?,
            notify: client.prepare("SELECT pg_notify($1, '')").await?,
        })
    }
}

/// Aborts the connection driver when the session ends, however it ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl OutboxWorker {
    pub fn new(cfg: OutboxConfig, invalidator: Arc<Invalidator>) -> OutboxWorker {
        let metrics = invalidator.metrics().clone();
        OutboxWorker {
            cfg,
            invalidator,
            metrics,
            witnesses: 2,
        }
    }

    /// `invalidation.witnesses` (default 2).
    pub(crate) fn with_witnesses(mut self, k: u32) -> OutboxWorker {
        self.witnesses = k;
        self
    }

    /// Runs until `shutdown` becomes true (or its sender is dropped),
    /// reconnecting with jittered exponential backoff whenever the session
    /// fails. A cycle in progress when shutdown arrives is finished or, if
    /// it cannot finish, rolled back by Postgres (rows stay, nothing lost).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut reconnect = Reconnect::new(
            RECONNECT_BASE,
            RECONNECT_MAX,
            RECONNECT_REFUSED,
            FAST_RECONNECT_FOR,
        );
        info!(
            table = %self.cfg.table,
            channel = %self.cfg.notify_channel,
            "outbox worker starting"
        );
        // Survives reconnects: a short outage keeps the slot.
        let mut witness = Witness::new(
            self.invalidator.clone(),
            "outbox",
            &self.cfg.table,
            self.witnesses,
        );
        loop {
            if *shutdown.borrow() {
                break;
            }
            let session = self.session(&mut shutdown, &mut reconnect, &mut witness);
            let restarting = match session.await {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, "outbox worker lost Postgres; reconnecting");
                    e.is_restarting()
                }
            };
            let delay = reconnect.next_delay(restarting);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
            }
        }
        witness.release().await;
        self.clear_gauges();
        info!("outbox worker stopped");
    }

    /// One connection's life: connect, beat, LISTEN if a witness, poll, then
    /// wait for NOTIFY, the poll interval or the next beat, forever. `Ok`
    /// only on shutdown.
    async fn session(
        &self,
        shutdown: &mut watch::Receiver<bool>,
        reconnect: &mut Reconnect,
        witness: &mut Witness,
    ) -> Result<(), OutboxError> {
        let mut pg = crate::pg::PgConnector::parse(&self.cfg.url)?;
        pg.config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(15))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .application_name("sidecache-outbox");
        let (mut client, mut connection) = tokio::time::timeout(CONNECT_TIMEOUT, pg.connect())
            .await
            .map_err(|_| OutboxError::ConnectTimeout(CONNECT_TIMEOUT))??;
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<()>();
        // The driver owns the connection: it must be polled for queries to
        // make progress at all, and it is where notifications surface.
        let driver = tokio::spawn(async move {
            loop {
                match poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(_))) => {
                        let _ = wake_tx.send(());
                    }
                    Some(Ok(AsyncMessage::Notice(notice))) => {
                        debug!(%notice, "postgres notice");
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        debug!(error = %e, "outbox connection failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        let _driver = AbortOnDrop(driver.abort_handle());
        // The outbox swings from empty to 100 000 rows (a bulk change under
        // capture triggers) faster than autovacuum analyzes it, so the
        // planner's estimates lag: with the statistics of an empty table it
        // takes a bitmap scan and sorts every pending row on each claim
        // (seconds per claim), though the due index already holds them in
        // the claim's order. This session runs only the worker's own
        // statements, none of which needs a sort, so sorting is priced
        // out; and plans are made per execution, so a plan cached while the
        // table was small (a sequential scan for the deletes) does not stay
        // (bench/README.md#change-capture).
        if let Err(e) = client.batch_execute("SET enable_sort = off").await {
            debug!(error = %e, "enable_sort not set");
        }
        // Postgres 12+ (older servers refuse it: the statements are correct
        // either way).
        if let Err(e) = client
            .batch_execute("SET plan_cache_mode = force_custom_plan")
            .await
        {
            debug!(error = %e, "plan_cache_mode not set (Postgres before 12?)");
        }
        let statements = Statements::prepare(&client, &self.cfg.table).await?;
        info!("outbox worker connected");

        let mut gauges_at = Instant::now();
        // Rows this worker applied in the fan-out and still sees due.
        let mut seen = HashSet::new();
        let mut was_witness = false;
        let mut gauges_stale = false;
        // Always poll after (re)connecting: NOTIFYs sent meanwhile are lost.
        let mut poll_now = true;
        let mut next_poll = Instant::now();
        // A witness whose store failed: it looks again the moment the store
        // answers (`feeds_ready`), not at the breaker's cooldown's end.
        let mut store_lost = false;
        // The role first: a witness LISTENs before its first poll.
        witness.beat_if_due().await;
        loop {
            let is_witness = witness.is_witness();
            if is_witness != was_witness {
                // LISTEN before the poll: a row committed after this
                // statement comes with a NOTIFY, one before it is polled.
                if self.cfg.notify {
                    let verb = if is_witness { "LISTEN" } else { "UNLISTEN" };
                    client
                        .batch_execute(&format!("{verb} {}", self.cfg.notify_channel))
                        .await?;
                }
                was_witness = is_witness;
                info!(witness = is_witness, "outbox worker: witness role changed");
                if !is_witness {
                    seen.clear();
                    self.clear_gauges();
                } else {
                    poll_now = true;
                }
            }
            let leader = is_witness && witness.slot() == Some(0);
            if poll_now || Instant::now() >= next_poll {
                poll_now = false;
                let gauges = leader && Instant::now() >= gauges_at;
                let woke = self
                    .wake_up(
                        &mut client,
                        &statements,
                        &mut seen,
                        witness,
                        gauges,
                        shutdown,
                        reconnect,
                    )
                    .await?;
                if gauges {
                    gauges_at = Instant::now() + GAUGE_EVERY;
                }
                // Idle (nothing pending, LISTEN up on this very connection):
                // the poll is only a safety net for a lost NOTIFY
                // (docs/invalidation.md#what-the-worker-does); with
                // `notify: false` polling is how a witness learns of rows.
                // Not a witness: only a safety net, whatever is pending.
                // Unavailable store: look again when the feeds' breaker
                // lets a probe through.
                next_poll = Instant::now()
                    + match (woke.idle && self.cfg.notify) || !is_witness {
                        true => self.cfg.idle_poll_interval,
                        false => self.cfg.poll_interval,
                    };
                if let Some(at) = woke.store_back_at {
                    next_poll = next_poll.min(at);
                }
                store_lost = woke.store_back_at.is_some() && is_witness;
                // The leader's gauges (read before its claims) miss what
                // a wake-up that found rows changed: wake up for the next
                // refresh.
                gauges_stale = leader && (!woke.idle || (gauges_stale && !gauges));
                if gauges_stale {
                    next_poll = next_poll.min(gauges_at);
                }
            }
            // After the wake-up: an event's read never waits for a beat.
            if witness.beat_if_due().await {
                // The role changed: (UN)LISTEN now; a new witness reads
                // the pending rows at once.
                continue;
            }
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return Ok(());
                    }
                }
                wake = wake_rx.recv() => {
                    if wake.is_none() {
                        return Err(OutboxError::Closed);
                    }
                    // Many inserts, one cycle.
                    while wake_rx.try_recv().is_ok() {}
                    poll_now = was_witness;
                }
                _ = self.invalidator.feeds_ready(), if store_lost => {
                    store_lost = false;
                    poll_now = true;
                }
                _ = tokio::time::sleep_until(next_poll.min(witness.due_at())) => {}
            }
        }
    }

    /// One wake-up: a witness's fan-out (anyone else only looks whether
    /// rows are pending), then, if rows are pending, claim cycles while full
    /// batches come back. Takes no rows while the store is unavailable to
    /// this instance
    /// (docs/invalidation.md#an-instance-whose-store-fails-takes-no-events).
    /// `gauges`: the fan-out read also refreshes the gauges.
    #[allow(clippy::too_many_arguments)]
    async fn wake_up(
        &self,
        client: &mut Client,
        statements: &Statements,
        seen: &mut HashSet<i64>,
        witness: &mut Witness,
        gauges: bool,
        shutdown: &watch::Receiver<bool>,
        reconnect: &mut Reconnect,
    ) -> Result<WokeUp, OutboxError> {
        let mut woke = WokeUp::default();
        if let Some(at) = self.invalidator.feeds_ready_at() {
            woke.store_back_at = Some(at);
            return Ok(woke);
        }
        let fan_out = self.fan_out(client, statements, seen, witness.is_witness(), gauges);
        let pending = tokio::time::timeout(CYCLE_TIMEOUT, fan_out)
            .await
            .map_err(|_| OutboxError::CycleTimeout(CYCLE_TIMEOUT))??;
        // The session works: forget earlier reconnect failures (a session
        // that connects but fails every statement keeps backing off).
        reconnect.reset();
        if pending == 0 {
            // Nothing to claim: a row inserted since comes with a NOTIFY.
            woke.idle = true;
            return Ok(woke);
        }
        // Drain: keep claiming while full batches come back and the store
        // takes them, each claim twice the last up to `MAX_CLAIM`; a long
        // drain keeps beating (or the slot expires).
        let mut claim = self.cfg.batch;
        loop {
            if let Some(at) = self.invalidator.feeds_ready_at() {
                woke.store_back_at = Some(at);
                return Ok(woke);
            }
            let cycle = self.cycle(client, statements, seen, claim);
            let report = tokio::time::timeout(CYCLE_TIMEOUT, cycle)
                .await
                .map_err(|_| OutboxError::CycleTimeout(CYCLE_TIMEOUT))??;
            let full = report.claimed >= claim as usize;
            if !full || report.failed > 0 || *shutdown.borrow() {
                woke.store_back_at = self.invalidator.feeds_ready_at();
                return Ok(woke);
            }
            claim = claim.saturating_mul(2).min(MAX_CLAIM.max(self.cfg.batch));
            witness.beat_if_due().await;
        }
    }

    /// The fan-out (module doc): applies the pending rows not in `seen`,
    /// without locking them, and remembers those applied. `seen` keeps only
    /// rows still pending, so it is bounded by `batch`. Returns how many
    /// rows are pending (at most `batch`). `apply` false (not a witness):
    /// only counts them. `gauges`: reads the gauges with the rows.
    async fn fan_out(
        &self,
        client: &Client,
        st: &Statements,
        seen: &mut HashSet<i64>,
        apply: bool,
        gauges: bool,
    ) -> Result<usize, OutboxError> {
        let batch = i64::from(self.cfg.batch);
        let rows = match gauges {
            false => client.query(&st.pending, &[&batch]).await?,
            true => {
                let rows = client.query(&st.pending_gauges, &[&batch]).await?;
                if let Some(row) = rows.first() {
                    self.set_gauges(row)?;
                }
                rows
            }
        };
        let mut due = HashSet::with_capacity(rows.len());
        let mut fresh = Vec::new();
        let mut events = Vec::new();
        for row in &rows {
            // NULL: the gauge read's row when nothing is pending.
            let Some(id) = row.try_get::<_, Option<i64>>(0)? else {
                continue;
            };
            due.insert(id);
            if apply && !seen.contains(&id) {
                fresh.push(id);
                events.push((row_event(row), row_mark(row)?));
            }
        }
        seen.retain(|id| due.contains(id));
        if events.is_empty() {
            return Ok(due.len());
        }
        let outcomes = self
            .invalidator
            .apply_marked(Source::OutboxFanout, events)
            .await;
        for (id, outcome) in fresh.into_iter().zip(&outcomes) {
            // Poison and failed rows are the claim cycle's to settle.
            if matches!(outcome, ApplyOutcome::Applied) {
                seen.insert(id);
            }
        }
        Ok(due.len())
    }

    /// One claim-apply-commit transaction. Rows in `seen` were applied by
    /// this worker's fan-out: deleted without another store call.
    async fn cycle(
        &self,
        client: &mut Client,
        st: &Statements,
        seen: &HashSet<i64>,
        claim: u32,
    ) -> Result<CycleReport, OutboxError> {
        let tx = client.transaction().await?;
        let rows = tx.query(&st.claim, &[&i64::from(claim)]).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(CycleReport::default());
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut attempts = Vec::with_capacity(rows.len());
        let mut events = Vec::new();
        for row in &rows {
            let id = row.try_get::<_, i64>(0)?;
            ids.push(id);
            attempts.push(row.try_get::<_, i32>(5)?);
            if !seen.contains(&id) {
                events.push((row_event(row), row_mark(row)?));
            }
        }
        let mut applied_now = self
            .invalidator
            .apply_marked(Source::Outbox, events)
            .await
            .into_iter();
        let outcomes: Vec<ApplyOutcome> = ids
            .iter()
            .map(|id| match seen.contains(id) {
                true => ApplyOutcome::Applied,
                false => applied_now.next().unwrap_or(ApplyOutcome::Failed(
                    crate::store::StoreError::Protocol("no outcome".into()),
                )),
            })
            .collect();
        // Counted as this path's own applications, so that
        // `source="outbox"` still counts every row once.
        let by_fan_out = ids.iter().filter(|id| seen.contains(id)).count();
        self.metrics
            .invalidations
            .with_label_values(&[
                Source::Outbox.as_str(),
                ApplyOutcome::Applied.as_str(),
                "event",
            ])
            .inc_by(by_fan_out as u64);

        if outcomes.iter().all(|o| matches!(o, ApplyOutcome::Applied)) {
            // The claim deleted them.
            tx.commit().await?;
            return Ok(CycleReport {
                claimed: rows.len(),
                applied: rows.len(),
                ..CycleReport::default()
            });
        }
        // Some row failed or is poison: undo the claim's delete and settle
        // each row by its outcome. Between the two transactions another
        // worker may claim the rows again: it applies them once more
        // (idempotent), and our statements then find them gone or wait for
        // its commit.
        tx.rollback().await?;
        let tx = client.transaction().await?;
        let mut applied = Vec::new();
        let (mut retry_ids, mut retry_delays, mut retry_errors) =
            (Vec::new(), Vec::new(), Vec::new());
        let (mut dead_ids, mut dead_reasons) = (Vec::new(), Vec::new());
        // Failed because the store is unavailable to this instance (its
        // feeds' breaker opened): release the rows at once, due, and wake
        // the other workers, whose store may work. Failed while the store
        // answers (a refused write): back off, or every worker would retry
        // the row on every wake-up.
        let release = self.invalidator.feeds_ready_at().is_some();
        for ((id, tries), outcome) in ids.iter().zip(&attempts).zip(&outcomes) {
            match outcome {
                ApplyOutcome::Applied => applied.push(*id),
                ApplyOutcome::Failed(e) => {
                    let attempt = u32::try_from(*tries).unwrap_or(0);
                    let delay = match release {
                        true => Duration::ZERO,
                        false => {
                            backoff::jittered(backoff::exponential(RETRY_BASE, RETRY_MAX, attempt))
                                .max(Duration::from_millis(500))
                        }
                    };
                    retry_ids.push(*id);
                    retry_delays.push(delay.as_secs_f64());
                    retry_errors.push(truncate(e.to_string()));
                }
                ApplyOutcome::Poison(p) => {
                    dead_ids.push(*id);
                    dead_reasons.push(truncate(p.to_string()));
                }
            }
        }
        if !applied.is_empty() {
            tx.execute(&st.delete, &[&applied]).await?;
        }
        if !retry_ids.is_empty() {
            tx.execute(&st.retry, &[&retry_ids, &retry_delays, &retry_errors])
                .await?;
            if release && self.cfg.notify {
                // Delivered at the commit, when the rows are unlocked.
                tx.execute(&st.notify, &[&self.cfg.notify_channel]).await?;
            }
        }
        if !dead_ids.is_empty() {
            tx.execute(&st.dead, &[&dead_ids, &dead_reasons]).await?;
        }
        tx.commit().await?;

        for (id, reason) in dead_ids.iter().zip(&dead_reasons) {
            warn!(id, %reason, table = %self.cfg.table, "outbox row dead-lettered (dead_at set)");
        }
        self.metrics
            .dead_letters
            .with_label_values(&[Source::Outbox.as_str()])
            .inc_by(dead_ids.len() as u64);
        match retry_errors.first() {
            Some(e) if release => {
                warn!(rows = retry_ids.len(), error = %e, "outbox rows not applied: store unavailable here; released to the other workers");
            }
            Some(e) => {
                warn!(rows = retry_ids.len(), error = %e, "outbox rows not applied; will retry with backoff");
            }
            None => {}
        }
        Ok(CycleReport {
            claimed: rows.len(),
            applied: applied.len(),
            failed: retry_ids.len(),
            dead: dead_ids.len(),
        })
    }

    /// Not the gauge leader: another instance reports the table.
    fn clear_gauges(&self) {
        self.metrics.outbox_pending.set(0);
        self.metrics.outbox_dead.set(0);
        self.metrics.outbox_oldest_seconds.set(0.0);
    }

    /// The gauges from a `pending_gauges` row.
    fn set_gauges(&self, row: &tokio_postgres::Row) -> Result<(), OutboxError> {
        self.metrics
            .outbox_pending
            .set(row.try_get::<_, i64>(GAUGE_COLUMNS)?);
        self.metrics
            .outbox_dead
            .set(row.try_get::<_, i64>(GAUGE_COLUMNS + 1)?);
        self.metrics
            .outbox_oldest_seconds
            .set(row.try_get::<_, f64>(GAUGE_COLUMNS + 2)?);
        Ok(())
    }
}

/// A row's mark (`lua/invalidate_marked.lua`): its id, and its creation
/// time so that ids a reset sequence hands out again never match.
fn row_mark(row: &tokio_postgres::Row) -> Result<String, tokio_postgres::Error> {
    let id: i64 = row.try_get(0)?;
    let created_us: i64 = row.try_get(6)?;
    Ok(format!("o:{id}:{created_us}"))
}

/// A claimed row as an event; anything unreadable is poison for this row
/// only (the rows behind it still apply).
fn row_event(row: &tokio_postgres::Row) -> Result<Event, Poison> {
    let bad = |e: tokio_postgres::Error| Poison::Malformed(e.to_string());
    // A tag row has no route and may have no params.
    let route: Option<String> = row.try_get(1).map_err(bad)?;
    let params: Option<String> = row.try_get(2).map_err(bad)?;
    let kind: String = row.try_get(3).map_err(bad)?;
    let revision: Option<i64> = row.try_get(4).map_err(bad)?;
    let tags: Option<String> = row.try_get(7).map_err(bad)?;
    let params: serde_json::Value = match params {
        Some(p) => serde_json::from_str(&p).map_err(|e| Poison::Malformed(e.to_string()))?,
        None => serde_json::Value::Object(Default::default()),
    };
    let tags: Vec<String> = match tags {
        Some(t) => serde_json::from_str::<Option<Vec<String>>>(&t)
            .map_err(|e| Poison::Malformed(format!("tags: {e}")))?
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let route = route.unwrap_or_default();
    Event::from_parts(&route, &params, &kind, revision, tags)
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_ERROR_TEXT {
        let mut cut = MAX_ERROR_TEXT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_restarting_postgres_is_told_apart_from_other_failures() {
        // A port nobody listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let refused = connect_error(port).await;
        assert!(refused.is_restarting(), "{refused}");
        assert!(!OutboxError::ConnectTimeout(CONNECT_TIMEOUT).is_restarting());

        // A postmaster in crash recovery answers the startup message with
        // 57P03; another FATAL (here 28P01, a wrong password) is no restart.
        for (code, restarting) in [("57P03", true), ("28P01", false)] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let server = tokio::spawn(refuse_startup(listener, code));
            let err = connect_error(port).await;
            assert_eq!(err.is_restarting(), restarting, "{code}: {err}");
            server.await.expect("fake postmaster");
        }
    }

    async fn connect_error(port: u16) -> OutboxError {
        let url = format!("postgres://u@127.0.0.1:{port}/db?sslmode=disable");
        let err = crate::pg::PgConnector::parse(&url)
            .expect("url")
            .connect()
            .await
            .map(|_| ())
            .expect_err("no session");
        OutboxError::from(err)
    }

    /// Reads the startup message and answers it with a FATAL `code`.
    async fn refuse_startup(listener: tokio::net::TcpListener, code: &str) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.expect("accept");
        let len = socket.read_u32().await.expect("startup length") as usize;
        let mut startup = vec![0; len - 4];
        socket.read_exact(&mut startup).await.expect("startup");
        let mut fields = Vec::new();
        for (tag, value) in [(b'S', "FATAL"), (b'C', code), (b'M', "refused by the test")] {
            fields.push(tag);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut message = vec![b'E'];
        message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(&fields);
        socket.write_all(&message).await.expect("error response");
    }
}
