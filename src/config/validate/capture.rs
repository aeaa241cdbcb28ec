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
