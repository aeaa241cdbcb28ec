//! Change capture: invalidations from the service's own tables, with the
//! service unchanged (`invalidation.capture`; design in
//! `docs/invalidation.md`, "Change capture").
//!
//! - [`ddl`]: the SQL `sidecache capture-ddl` prints: triggers that write
//!   outbox rows (`mode: triggers`, applied by the outbox worker), or the
//!   publication and replica identities (`mode: logical`).
//! - [`rows`]: a changed row to events, through the mapping's templates.
//! - [`logical`]: the replication slot's consumer (`mode: logical`).
//! - [`check`]: whether the database fits the mapping (tables, columns,
//!   the triggers or the publication), at start and in `check --db`.

pub mod ddl;
pub(crate) mod logical;
pub(crate) mod rows;

pub use logical::CaptureError;

use crate::config::capture::{CaptureConfig, CaptureMode, TableMapping};

/// Connects to the capture database and checks it ([`check_schema`]).
pub async fn check(cfg: &CaptureConfig) -> Result<(), CaptureError> {
    let mut pg = crate::pg::PgConnector::parse(&cfg.url)?;
    pg.config
        .connect_timeout(std::time::Duration::from_secs(5))
        .application_name("sidecache-check");
    let (client, connection) = pg.connect().await?;
    let driver = tokio::spawn(connection);
    let result = check_schema(&client, cfg).await;
    driver.abort();
    result
}

/// Every mapped table and column exists; in `mode: triggers` the capture
/// triggers are installed, in `mode: logical` the publication carries every
/// table and each table's replica identity covers the columns an old row
/// must carry. Errors name what is missing and how to fix it.
pub(crate) async fn check_schema(
    client: &tokio_postgres::Client,
    cfg: &CaptureConfig,
) -> Result<(), CaptureError> {
    let mut problems = Vec::new();
    for m in &cfg.tables {
        let rows = client
            .query(
                "SELECT a.attname::text, c.relreplident::text, \
                 COALESCE(a.attnum = ANY(i.indkey::int2[]), false) AS in_identity \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 LEFT JOIN pg_index i ON i.indrelid = c.oid AND \
                 ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)) \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
                &[&m.table.schema, &m.table.name],
            )
            .await?;
        if rows.is_empty() {
            problems.push(format!("table {} does not exist", m.table));
            continue;
        }
        let mut columns = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row.try_get(0)?;
            let identity: String = row.try_get(1)?;
            let in_identity: bool = row.try_get(2)?;
            columns.push((name, identity, in_identity));
        }
        for c in m.columns() {
            if !columns.iter().any(|(name, _, _)| name == c) {
                problems.push(format!("column {}.{c} does not exist", m.table));
            }
        }
        match cfg.mode {
            CaptureMode::Triggers => problems.extend(missing_triggers(client, m).await?),
            CaptureMode::Logical => {
                let full = columns.iter().any(|(_, identity, _)| identity == "f");
                let uncovered: Vec<&str> = m
                    .old_row_columns()
                    .into_iter()
                    .filter(|c| !columns.iter().any(|(n, _, covered)| n == c && *covered))
                    .collect();
                if !full && !uncovered.is_empty() {
                    problems.push(format!(
                        "{}: its replica identity does not carry {} in an old row \
                         (run the SQL of `sidecache capture-ddl`: REPLICA IDENTITY FULL)",
                        m.table,
                        uncovered.join(", ")
                    ));
                }
            }
        }
    }
    if cfg.mode == CaptureMode::Logical {
        let published: Vec<(String, String)> = client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                &[&cfg.publication],
            )
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        for m in &cfg.tables {
            if !published.contains(&(m.table.schema.clone(), m.table.name.clone())) {
                problems.push(format!(
                    "publication {:?} does not carry {} (run the SQL of `sidecache capture-ddl`)",
                    cfg.publication, m.table
                ));
            }
        }
    }
    problems.dedup();
    match problems.is_empty() {
        true => Ok(()),
        false => Err(CaptureError::Schema(format!(
            "invalidation.capture: {}",
            problems.join("; ")
        ))),
    }
}

/// The capture triggers `capture-ddl` installs that the table lacks.
async fn missing_triggers(
    client: &tokio_postgres::Client,
    m: &TableMapping,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let names = ddl::trigger_names(&m.table);
    let rows = client
        .query(
            "SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND NOT t.tgisinternal",
            &[&m.table.schema, &m.table.name],
        )
        .await?;
    let present: Vec<String> = rows
        .iter()
        .filter_map(|r| r.try_get::<_, String>(0).ok())
        .collect();
    Ok(names
        .into_iter()
        .filter(|n| !present.contains(n))
        .map(|n| {
            format!(
                "{}: trigger {n} is not installed (run the SQL of `sidecache capture-ddl`)",
                m.table
            )
        })
        .collect())
}
