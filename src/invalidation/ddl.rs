//! The SQL that installs the outbox (`sidecache outbox-ddl`): the table with
//! the columns of docs/invalidation.md#1-install-the-table, a partial index
//! over the rows a worker may claim, and a statement-level `AFTER INSERT`
//! trigger that wakes `LISTEN`ing workers (with `notify: false` no trigger:
//! the workers poll). Table and channel names are spliced
//! into SQL; config validation ([`check_identifier`]) lets only plain
//! identifiers pass.

/// The default table and notification channel (same as the config defaults).
pub const DEFAULT_TABLE: &str = "sidecache_outbox";
pub const DEFAULT_CHANNEL: &str = "sidecache_outbox";

use crate::config::validate::check_identifier;

/// The DDL for `table` whose trigger notifies `channel`; with no channel
/// (`invalidation.outbox.notify: false`) the trigger is dropped instead.
/// Idempotent (`IF NOT EXISTS`, `CREATE OR REPLACE`), so it can be re-run.
/// Errors name the bad identifier.
pub fn outbox_ddl(table: &str, channel: Option<&str>) -> Result<String, String> {
    check_identifier(table)?;
    if let Some(channel) = channel {
        check_identifier(channel)?;
        if channel.contains('.') {
            return Err(format!("{channel:?}: a channel name has no schema"));
        }
    }
    // Names derived from the table; schema-qualified tables keep the index
    // and function in the same schema.
    let (schema, base) = match table.split_once('.') {
        Some((s, b)) => (format!("{s}."), b),
        None => (String::new(), table),
    };
    let short = |suffix: &str| {
        let mut name = format!("{base}_{suffix}");
        name.truncate(63);
        name
    };
    let due_index = short("due");
    let function = format!("{schema}{}", short("notify"));
    let trigger = short("notify");
    let tables = format!(
        r#"-- sidecache outbox: write one row per change, in the same transaction as
-- the change. sidecache deletes applied rows; dead rows (dead_at set) stay
-- for inspection.
CREATE TABLE IF NOT EXISTS {table} (
    id          bigserial PRIMARY KEY,
    route       text,
    params      jsonb       NOT NULL DEFAULT '{{}}',
    tags        text[],
    kind        text        NOT NULL DEFAULT 'invalidate',
    revision    bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    attempts    int         NOT NULL DEFAULT 0,
    next_at     timestamptz NOT NULL DEFAULT now(),
    last_error  text,
    dead_at     timestamptz
);

-- Tag events (a row with tags and no route): tables created before
-- sidecache knew tags get the column, and route may be left out.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS tags text[];
ALTER TABLE {table} ALTER COLUMN route DROP NOT NULL;
ALTER TABLE {table} ALTER COLUMN params SET DEFAULT '{{}}';

-- Rows a worker may claim: not dead-lettered, in claim order.
CREATE INDEX IF NOT EXISTS {due_index} ON {table} (next_at, id) WHERE dead_at IS NULL;
"#
    );
    let wake = match channel {
        Some(channel) => format!(
            r#"-- One wake-up per inserting statement; workers poll as a fallback.
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger}
    AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
"#
        ),
        // A NOTIFY serializes the commits of every notifying transaction
        // (docs/invalidation.md#which-mode), so it can be left out.
        None => format!(
            r#"-- No wake-up trigger (notify: false): the workers poll at poll_interval.
DROP TRIGGER IF EXISTS {trigger} ON {table};
DROP FUNCTION IF EXISTS {function}();
"#
        ),
    };
    Ok(format!("{tables}\n{wake}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_names_table_and_channel() {
        let sql = outbox_ddl("app.events", Some("wake")).unwrap();
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.events ("));
        assert!(sql.contains("pg_notify('wake', '')"));
        assert!(sql.contains("FUNCTION app.events_notify()"));
        assert!(sql.contains("WHERE dead_at IS NULL"));
        assert!(sql.contains("ADD COLUMN IF NOT EXISTS tags text[]"));
        assert!(outbox_ddl("x", Some("a.b")).is_err());
        assert!(outbox_ddl("x'; --", Some("c")).is_err());
        let quiet = outbox_ddl("app.events", None).unwrap();
        assert!(!quiet.contains("pg_notify"));
        assert!(quiet.contains("DROP TRIGGER IF EXISTS events_notify ON app.events;"));
    }
}
