//! `invalidation.capture`: the mode, where the tables live, and each
//! table's mapping to a route's objects (checked against the route table:
//! every param of the route, no other, templates that parse). Whether the
//! tables and columns exist is checked against the database at start and by
//! `sidecache check --db` (`crate::invalidation::capture::check`).

use super::{err, Result};
use crate::config::capture::{
    is_identifier, CaptureConfig, CaptureMode, TableMapping, TableName, Template,
};
use crate::config::file::{defaults, FileCapture, FileCaptureMode, FileOnInsert};
use crate::config::{InvalidationConfig, OutboxConfig, RouteTable};

/// Validates `raw` (if any) into `invalidation.capture`. `mode: triggers`
/// needs the outbox worker that applies the trigger rows: without an
/// `invalidation.outbox`, one is configured with defaults on the capture
/// database.
pub(super) fn capture(
    raw: Option<&FileCapture>,
    invalidation: &mut InvalidationConfig,
    routes: &RouteTable,
) -> Result<()> {
    let Some(raw) = raw else {
        return Ok(());
    };
    let at = "invalidation.capture";
    let url = match (&raw.url, &invalidation.outbox) {
        (Some(url), _) if url.trim().is_empty() => {
            return err(
                format!("{at}.url"),
                "must not be empty (is the variable set?)",
            )
        }
        (Some(url), Some(outbox))
            if raw.mode == FileCaptureMode::Triggers && *url != outbox.url =>
        {
            return err(
                format!("{at}.url"),
                "with mode: triggers the triggers write to the outbox table, which the worker \
                 reads at invalidation.outbox.url: leave url out or give the same URL",
            )
        }
        (Some(url), _) => url.clone(),
        (None, Some(outbox)) => outbox.url.clone(),
        (None, None) => {
            return err(
                format!("{at}.url"),
                "is needed (or invalidation.outbox.url, its default)",
            )
        }
    };
    if let Err(e) = crate::pg::PgConnector::parse(&url) {
        return err(format!("{at}.url"), e.to_string());
    }
    for (key, value) in [("slot", &raw.slot), ("publication", &raw.publication)] {
        if !is_identifier(value) {
            return err(
                format!("{at}.{key}"),
                format!("{value:?}: lowercase letters, digits and _, not starting with a digit"),
            );
        }
    }
    if raw.tables.is_empty() {
        return err(format!("{at}.tables"), "must name at least one table");
    }
    let mut tables = Vec::with_capacity(raw.tables.len());
    for (i, t) in raw.tables.iter().enumerate() {
        let at = format!("{at}.tables[{i}]");
        let table = TableName::parse(&t.table).or_else(|m| err(format!("{at}.table"), m))?;
        let Some(route) = routes.find(&t.route) else {
            return err(
                format!("{at}.route"),
                format!("no route is named {:?}", t.route),
            );
        };
        if let Some(extra) = t
            .params
            .keys()
            .find(|k| !route.params.iter().any(|p| &p.name == *k))
        {
            return err(
                format!("{at}.params.{extra}"),
                format!("route {:?} has no param {extra:?}", route.name),
            );
        }
        let mut params = Vec::with_capacity(route.params.len());
        for p in &route.params {
            let Some(text) = t.params.get(&p.name) else {
                return err(
                    format!("{at}.params"),
                    format!(
                        "misses route {:?}'s param {:?} (every param names the object)",
                        route.name, p.name
                    ),
                );
            };
            let template =
                Template::parse(text).or_else(|m| err(format!("{at}.params.{}", p.name), m))?;
            params.push((p.name.clone(), template));
        }
        let tags = t
            .tags
            .iter()
            .enumerate()
            .map(|(j, text)| Template::parse(text).or_else(|m| err(format!("{at}.tags[{j}]"), m)))
            .collect::<Result<Vec<_>>>()?;
        if let Some(column) = &t.revision {
            if !is_identifier(column) {
                return err(
                    format!("{at}.revision"),
                    format!("{column:?} is not a column name"),
                );
            }
            if route.version_from.is_none() {
                return err(
                    format!("{at}.revision"),
                    format!(
                        "route {:?} has no version_from: a revision raises a floor that only \
                         answers with a version can meet",
                        route.name
                    ),
                );
            }
        }
        tables.push(TableMapping {
            table,
            route: route.name.clone(),
            params,
            tags,
            revision: t.revision.clone(),
            create_on_insert: t.on_insert == FileOnInsert::Create,
        });
    }
    let mode = match raw.mode {
        FileCaptureMode::Triggers => CaptureMode::Triggers,
        FileCaptureMode::Logical => CaptureMode::Logical,
    };
    if mode == CaptureMode::Triggers && invalidation.outbox.is_none() {
        invalidation.outbox = Some(OutboxConfig {
            url: url.clone(),
            table: defaults::outbox_table(),
            poll_interval: defaults::poll_interval().0,
            idle_poll_interval: defaults::idle_poll_interval().0,
            batch: defaults::batch(),
            notify_channel: defaults::outbox_table(),
            notify: true,
        });
    }
    invalidation.capture = Some(CaptureConfig {
        mode,
        url,
        slot: raw.slot.clone(),
        publication: raw.publication.clone(),
        tables,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::capture::CaptureMode;
    use crate::config::testing::{err, parse, APP};

    /// `APP` with an `invalidation.capture` of `mode` whose one table
    /// mapping has the lines `table` (each indented as a mapping key).
    fn capture(mode: &str, table: &str) -> String {
        let table: String = table.lines().map(|l| format!("        {l}\n")).collect();
        format!(
            "invalidation:\n  capture:\n    mode: {mode}\n    url: \"postgres://u@127.0.0.1/db\"\n    \
             tables:\n      - table: app_config\n{table}{APP}"
        )
    }

    const MAPPED: &str = "route: app\nparams: { tenant: \"{tenant}\", id: \"{id}\" }";

    #[test]
    fn a_mapping_becomes_the_capture_config_and_triggers_bring_an_outbox() {
        let cfg = parse(&capture(
            "triggers",
            &format!("{MAPPED}\ntags: [\"t:{{tenant}}\"]"),
        ))
        .expect("valid");
        let c = cfg.invalidation.capture.as_ref().expect("capture");
        assert_eq!(c.mode, CaptureMode::Triggers);
        assert_eq!(
            (c.slot.as_str(), c.publication.as_str()),
            ("sidecache", "sidecache")
        );
        let m = &c.tables[0];
        assert_eq!(m.table.to_string(), "public.app_config");
        assert_eq!(m.columns(), ["tenant", "id"]);
        assert_eq!(m.params[0].0, "tenant", "in the route's param order");
        let outbox = cfg
            .invalidation
            .outbox
            .as_ref()
            .expect("an outbox for the triggers");
        assert_eq!(outbox.url, c.url);
        assert_eq!(outbox.table, "sidecache_outbox");
        let logical = parse(&capture("logical", MAPPED)).expect("valid");
        assert!(
            logical.invalidation.outbox.is_none(),
            "logical needs no outbox"
        );
    }

    #[test]
    fn bad_mappings_are_refused_naming_the_yaml_path() {
        for (table, path, says) in [
            (
                "route: nope\nparams: {}",
                "tables[0].route",
                "no route is named",
            ),
            (
                "route: app\nparams: { tenant: \"{tenant}\" }",
                "tables[0].params",
                "misses route \"app\"'s param \"id\"",
            ),
            (
                "route: app\nparams: { tenant: \"{tenant}\", id: \"{id}\", x: \"{x}\" }",
                "tables[0].params.x",
                "has no param",
            ),
            (
                "route: app\nparams: { tenant: \"{tenant\", id: \"{id}\" }",
                "tables[0].params.tenant",
                "without its `}`",
            ),
            (
                "route: app\nparams: { tenant: \"{Tenant}\", id: \"{id}\" }",
                "tables[0].params.tenant",
                "not a column name",
            ),
            (
                &format!("{MAPPED}\ntags: [\"t:{{tenant}}\", \"fixed\"]"),
                "tables[0].tags[1]",
                "names no column",
            ),
            (
                &format!("{MAPPED}\nrevision: version"),
                "tables[0].revision",
                "no version_from",
            ),
        ] {
            let e = err(&capture("logical", table));
            assert!(
                e.contains(&format!("invalidation.capture.{path}")),
                "{table}: {e}"
            );
            assert!(e.contains(says), "{table}: {e}");
        }
        let e = err(&capture("logical", MAPPED).replace("table: app_config", "table: \"a;b\""));
        assert!(e.contains("invalidation.capture.tables[0].table"), "{e}");
        let e =
            err(&capture("logical", MAPPED)
                .replace("mode: logical", "mode: logical\n    slot: Bad"));
        assert!(e.contains("invalidation.capture.slot"), "{e}");
        let e = err(&capture("sometimes", MAPPED));
        assert!(e.contains("invalidation.capture.mode"), "{e}");
        let no_url =
            capture("logical", MAPPED).replace("    url: \"postgres://u@127.0.0.1/db\"\n", "");
        assert!(err(&no_url).contains("invalidation.capture.url"));
    }
}
