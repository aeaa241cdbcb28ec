//! The SQL of `sidecache capture-ddl`.
//!
//! `mode: logical` ([`publication`]): the publication of the mapped tables
//! and, per table, `REPLICA IDENTITY FULL`, so that an `UPDATE` or `DELETE`
//! carries the old row's key and tag columns (with the default identity,
//! pgoutput sends only the primary key of the old row, and nothing when the
//! key did not change).
//!
//! `mode: triggers` ([`install`], [`drop`]): per mapped
//! table, statement-level `AFTER INSERT`, `AFTER UPDATE` and `AFTER DELETE`
//! triggers that read the statement's transition tables and write one
//! outbox row per distinct object (and per distinct tag) in the changing
//! transaction, plus an `AFTER TRUNCATE` trigger that writes a route-wide
//! purge. The outbox worker applies the rows like any others.
//!
//! Statement-level triggers with transition tables, not row triggers: a
//! bulk `UPDATE` of 100 000 rows runs one `INSERT … SELECT DISTINCT` per
//! trigger instead of 100 000 function calls, and an object changed twice
//! in one statement gets one row. Postgres allows one event per trigger
//! with transition tables, hence three.
//!
//! Nothing here may fail the service's statement: values are cast with
//! `::text` (never fails), a revision that is not an integer is dropped
//! (`CASE … ~ …`), and a NULL key value becomes a JSON `null` (or a NULL
//! tag) that the worker dead-letters with its reason.

use crate::config::capture::{sql_literal, CaptureConfig, TableMapping, TableName};
use crate::config::OutboxConfig;

const NEW: &str = "sidecache_new";
const OLD: &str = "sidecache_old";

/// The three row events, with what each reads.
#[derive(Clone, Copy)]
enum Change {
    Insert,
    Update,
    Delete,
}

impl Change {
    fn word(self) -> &'static str {
        match self {
            Change::Insert => "INSERT",
            Change::Update => "UPDATE",
            Change::Delete => "DELETE",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Change::Insert => "ins",
            Change::Update => "upd",
            Change::Delete => "del",
        }
    }

    fn referencing(self) -> String {
        match self {
            Change::Insert => format!("NEW TABLE AS {NEW}"),
            Change::Update => format!("OLD TABLE AS {OLD} NEW TABLE AS {NEW}"),
            Change::Delete => format!("OLD TABLE AS {OLD}"),
        }
    }
}

/// Names of one table's functions and triggers (Postgres truncates
/// identifiers at 63 bytes; the suffix is kept).
fn object_name(table: &TableName, suffix: &str) -> String {
    let mut base = format!("sidecache_{}", table.name);
    base.truncate(63 - suffix.len() - 1);
    format!("{base}_{suffix}")
}

/// The capture triggers of `table`, as [`install`] names them.
pub(crate) fn trigger_names(table: &TableName) -> Vec<String> {
    ["ins", "upd", "del", "trunc"]
        .iter()
        .map(|suffix| object_name(table, suffix))
        .collect()
}

/// Mappings grouped by table, in config order.
fn by_table(cfg: &CaptureConfig) -> Vec<(&TableName, Vec<&TableMapping>)> {
    let mut out: Vec<(&TableName, Vec<&TableMapping>)> = Vec::new();
    for m in &cfg.tables {
        match out.iter_mut().find(|(t, _)| *t == &m.table) {
            Some((_, ms)) => ms.push(m),
            None => out.push((&m.table, vec![m])),
        }
    }
    out
}

/// The install script: the outbox (its own idempotent DDL first, so one
/// script is enough), then every table's triggers, in one transaction.
pub fn install(cfg: &CaptureConfig, outbox: &OutboxConfig) -> Result<String, String> {
    let mut sql = super::super::ddl::outbox_ddl(
        &outbox.table,
        outbox.notify.then_some(outbox.notify_channel.as_str()),
    )?;
    sql.push_str("\n-- sidecache change capture (mode: triggers): every change of a mapped\n");
    sql.push_str("-- table writes outbox rows in its own transaction.\nBEGIN;\n");
    for (table, mappings) in by_table(cfg) {
        for change in [Change::Insert, Change::Update, Change::Delete] {
            let function = format!("{}.{}", table.schema, object_name(table, change.suffix()));
            let trigger = object_name(table, change.suffix());
            let body = change_body(change, &mappings, &outbox.table);
            sql.push_str(&format!(
                "\nCREATE OR REPLACE FUNCTION {function}() RETURNS trigger\n\
                 LANGUAGE plpgsql AS $sidecache$\nBEGIN\n{body}    RETURN NULL;\nEND\n$sidecache$;\n\
                 DROP TRIGGER IF EXISTS {trigger} ON {table};\n\
                 CREATE TRIGGER {trigger}\n    AFTER {word} ON {table}\n    REFERENCING {refs}\n    \
                 FOR EACH STATEMENT EXECUTE FUNCTION {function}();\n",
                word = change.word(),
                refs = change.referencing(),
            ));
        }
        let function = format!("{}.{}", table.schema, object_name(table, "trunc"));
        let trigger = object_name(table, "trunc");
        let mut body = String::new();
        for route in distinct(mappings.iter().map(|m| m.route.as_str())) {
            body.push_str(&format!(
                "    INSERT INTO {outbox} (route, params) VALUES ({route}, '{{}}');\n",
                outbox = outbox.table,
                route = sql_literal(route),
            ));
        }
        sql.push_str(&format!(
            "\n-- TRUNCATE: every object of the mapped routes (a route-wide purge).\n\
             CREATE OR REPLACE FUNCTION {function}() RETURNS trigger\n\
             LANGUAGE plpgsql AS $sidecache$\nBEGIN\n{body}    RETURN NULL;\nEND\n$sidecache$;\n\
             DROP TRIGGER IF EXISTS {trigger} ON {table};\n\
             CREATE TRIGGER {trigger}\n    AFTER TRUNCATE ON {table}\n    \
             FOR EACH STATEMENT EXECUTE FUNCTION {function}();\n"
        ));
    }
    sql.push_str("\nCOMMIT;\n");
    Ok(sql)
}

/// The removal script (`capture-ddl --drop`): triggers and functions; the
/// outbox table stays (it may hold rows not applied yet).
pub fn drop(cfg: &CaptureConfig) -> String {
    let mut sql =
        String::from("-- Removes sidecache's capture triggers; the outbox table stays.\nBEGIN;\n");
    for (table, _) in by_table(cfg) {
        for suffix in ["ins", "upd", "del", "trunc"] {
            let name = object_name(table, suffix);
            sql.push_str(&format!(
                "DROP TRIGGER IF EXISTS {name} ON {table};\nDROP FUNCTION IF EXISTS {}.{name}();\n",
                table.schema
            ));
        }
    }
    sql.push_str("COMMIT;\n");
    sql
}

/// The statements of one trigger function: objects, then tags.
fn change_body(change: Change, mappings: &[&TableMapping], outbox: &str) -> String {
    // (row alias, whether its revision counts): the new row's version
    // raises the floor; the old row only names the object it leaves.
    let rows: &[(&str, bool)] = match change {
        Change::Insert => &[(NEW, true)],
        Change::Update => &[(NEW, true), (OLD, false)],
        Change::Delete => &[(OLD, false)],
    };
    let mut selects = Vec::new();
    for m in mappings {
        let kind = match change {
            Change::Insert if m.create_on_insert => "create",
            Change::Delete => "delete",
            _ => "invalidate",
        };
        for (pick, (alias, with_revision)) in rows.iter().enumerate() {
            let params: Vec<String> = m
                .params
                .iter()
                .map(|(name, t)| format!("{}, {}", sql_literal(name), t.sql("r")))
                .collect();
            let revision = match (&m.revision, with_revision) {
                (Some(column), true) => format!(
                    "CASE WHEN r.{column}::text ~ '^-?[0-9]{{1,18}}$' THEN r.{column}::text::bigint END"
                ),
                _ => "NULL::bigint".to_owned(),
            };
            selects.push(format!(
                "        SELECT {route} AS route, jsonb_build_object({params}) AS params, \
                 '{kind}' AS kind, {revision} AS revision, {pick} AS pick FROM {alias} r",
                route = sql_literal(&m.route),
                params = params.join(", "),
            ));
        }
    }
    let mut body = format!(
        "    INSERT INTO {outbox} (route, params, kind, revision)\n    \
         SELECT DISTINCT ON (c.route, c.params) c.route, c.params, c.kind, c.revision FROM (\n{}\n    \
         ) c ORDER BY c.route, c.params, c.pick;\n",
        selects.join("\n        UNION ALL\n")
    );
    let mut tag_selects = Vec::new();
    for m in mappings {
        for t in &m.tags {
            for (alias, _) in rows {
                tag_selects.push(format!(
                    "        SELECT {} AS tag FROM {alias} r",
                    t.sql("r")
                ));
            }
        }
    }
    if !tag_selects.is_empty() {
        body.push_str(&format!(
            "    INSERT INTO {outbox} (tags)\n    SELECT ARRAY[t.tag] FROM (SELECT DISTINCT tag FROM (\n{}\n    \
             ) u) t;\n",
            tag_selects.join("\n        UNION ALL\n")
        ));
    }
    body
}

/// The `mode: logical` script: the publication (created, or its table
/// list replaced) and each table's replica identity. Idempotent.
pub fn publication(cfg: &CaptureConfig) -> String {
    let tables: Vec<String> = by_table(cfg).iter().map(|(t, _)| t.to_string()).collect();
    let list = tables.join(", ");
    let name = &cfg.publication;
    let mut sql = format!(
        "-- sidecache change capture (mode: logical): the slot {slot} reads this\n\
         -- publication; sidecache creates the slot itself. The role in\n\
         -- invalidation.capture.url needs REPLICATION (or superuser) and\n\
         -- wal_level must be logical.\n\
         BEGIN;\n\
         DO $sidecache$ BEGIN\n    \
         IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {quoted}) THEN\n        \
         ALTER PUBLICATION {name} SET TABLE {list};\n    \
         ELSE\n        \
         CREATE PUBLICATION {name} FOR TABLE {list}\n            \
         WITH (publish = 'insert, update, delete, truncate');\n    \
         END IF;\n\
         END $sidecache$;\n",
        slot = cfg.slot,
        quoted = sql_literal(name),
    );
    sql.push_str(
        "\n-- The old row of an UPDATE or DELETE must carry every mapped key and tag\n\
         -- column. FULL always does; if the primary key covers all of them, the\n\
         -- default identity does too, with less WAL per change.\n",
    );
    for (table, mappings) in by_table(cfg) {
        let columns = distinct(mappings.iter().flat_map(|m| m.old_row_columns()));
        sql.push_str(&format!(
            "-- {table}: {}\nALTER TABLE {table} REPLICA IDENTITY FULL;\n",
            columns.join(", ")
        ));
    }
    sql.push_str("COMMIT;\n");
    sql
}

fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}
