//! From a changed row to the events it implies (logical mode; the trigger
//! SQL in [`super::ddl`] renders the same templates in Postgres). An
//! `INSERT` names the new row's object and tags, a `DELETE` the old row's,
//! an `UPDATE` both (one object when its key did not change), a `TRUNCATE`
//! every object of the mapped routes. A row whose key is NULL names no
//! object: its event is poison, dead-lettered with the reason, and the
//! rest of the transaction applies.

use super::super::event::{Event, EventKind, Poison};
use crate::config::capture::TableMapping;
use std::collections::{BTreeMap, HashSet};

/// One column of a row as pgoutput sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Null,
    Text(&'a str),
    /// A TOASTed value the `UPDATE` did not change: pgoutput leaves it
    /// out of the new row (the old row has it with `REPLICA IDENTITY FULL`).
    Unchanged,
}

/// A row: the relation's column names and the tuple's values, in order.
pub(crate) trait Row {
    fn value(&self, column: &str) -> Option<Value<'_>>;
}

/// The new row, reading unchanged values from the old one.
struct Updated<'a, R: Row> {
    new: &'a R,
    old: Option<&'a R>,
}

impl<R: Row> Row for Updated<'_, R> {
    fn value(&self, column: &str) -> Option<Value<'_>> {
        match self.new.value(column) {
            Some(Value::Unchanged) => self.old.and_then(|o| o.value(column)),
            other => other,
        }
    }
}

/// The text of `column`; `None` for NULL, unknown or not sent.
fn text<'r>(row: &'r impl Row, column: &str) -> Option<&'r str> {
    match row.value(column)? {
        Value::Text(t) => Some(t),
        Value::Null | Value::Unchanged => None,
    }
}

/// What happened to a row.
pub(crate) enum Change<'a, R: Row> {
    Insert(&'a R),
    /// `old` is sent only when the replica identity covers a changed key
    /// column (or is `FULL`).
    Update {
        old: Option<&'a R>,
        new: &'a R,
    },
    Delete(&'a R),
}

/// Collects a transaction's events, each object and tag once.
#[derive(Default)]
pub(crate) struct Events {
    pub events: Vec<Result<Event, Poison>>,
    seen: HashSet<(String, BTreeMap<String, String>)>,
    seen_tags: HashSet<String>,
}

impl Events {
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events so far; what was seen is forgotten with them (a batch
    /// applied mid-transaction may be followed by the same object again,
    /// which costs one more replacement, never a miss of an event).
    pub(crate) fn take(&mut self) -> Vec<Result<Event, Poison>> {
        self.seen.clear();
        self.seen_tags.clear();
        std::mem::take(&mut self.events)
    }

    /// The events of one row change under one mapping.
    pub(crate) fn change<R: Row>(&mut self, m: &TableMapping, change: Change<'_, R>) {
        match change {
            Change::Insert(new) => {
                let kind = match m.create_on_insert {
                    true => EventKind::Create,
                    false => EventKind::Invalidate,
                };
                self.row(m, new, kind, true);
            }
            Change::Update { old, new } => {
                let new = Updated { new, old };
                self.row(m, &new, EventKind::Invalidate, true);
                if let Some(old) = old {
                    self.row(m, old, EventKind::Invalidate, false);
                }
            }
            Change::Delete(old) => self.row(m, old, EventKind::Delete, false),
        }
    }

    /// `TRUNCATE`: every object of the route.
    pub(crate) fn truncate(&mut self, m: &TableMapping) {
        let event = Event {
            route: m.route.clone(),
            params: BTreeMap::new(),
            kind: EventKind::Invalidate,
            revision: None,
            tags: Vec::new(),
        };
        if self.seen.insert((event.route.clone(), BTreeMap::new())) {
            self.events.push(Ok(event));
        }
    }

    fn row(&mut self, m: &TableMapping, row: &impl Row, kind: EventKind, with_revision: bool) {
        self.object(m, row, kind, with_revision);
        for t in &m.tags {
            match t.render(|c| text(row, c)) {
                Some(tag) => {
                    if self.seen_tags.insert(tag.clone()) {
                        self.events.push(Ok(Event {
                            route: String::new(),
                            params: BTreeMap::new(),
                            kind: EventKind::Invalidate,
                            revision: None,
                            tags: vec![tag],
                        }));
                    }
                }
                None => self
                    .events
                    .push(Err(Poison::NullValue(format!("{}: tag {t}", m.table)))),
            }
        }
    }

    fn object(&mut self, m: &TableMapping, row: &impl Row, kind: EventKind, with_revision: bool) {
        let mut params = BTreeMap::new();
        for (name, t) in &m.params {
            match t.render(|c| text(row, c)) {
                Some(v) => {
                    params.insert(name.clone(), v);
                }
                None => {
                    self.events.push(Err(Poison::NullValue(format!(
                        "{}: param {name} ({t})",
                        m.table
                    ))));
                    return;
                }
            }
        }
        // A version that is not an integer raises no floor (as in the
        // trigger SQL): the object is still invalidated.
        let revision = match (&m.revision, with_revision) {
            (Some(column), true) => text(row, column).and_then(|v| v.parse::<i64>().ok()),
            _ => None,
        };
        let key = (m.route.clone(), params);
        if self.seen.contains(&key) {
            // The same object from the old row of an update: the new row's
            // event (with its revision) already names it.
            return;
        }
        self.seen.insert(key.clone());
        self.events.push(Ok(Event {
            route: key.0,
            params: key.1,
            kind,
            revision,
            tags: Vec::new(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::capture::{TableName, Template};

    struct R(Vec<(&'static str, Value<'static>)>);

    impl Row for R {
        fn value(&self, column: &str) -> Option<Value<'_>> {
            self.0.iter().find(|(c, _)| *c == column).map(|(_, v)| *v)
        }
    }

    fn mapping() -> TableMapping {
        TableMapping {
            table: TableName::parse("app_config").expect("valid"),
            route: "app".into(),
            params: vec![
                ("tenant".into(), Template::parse("{tenant}").expect("valid")),
                ("id".into(), Template::parse("{id}").expect("valid")),
            ],
            tags: vec![Template::parse("tenant:{tenant}").expect("valid")],
            revision: Some("version".into()),
            create_on_insert: true,
        }
    }

    fn row(tenant: Value<'static>, id: &'static str, version: &'static str) -> R {
        R(vec![
            ("tenant", tenant),
            ("id", Value::Text(id)),
            ("version", Value::Text(version)),
        ])
    }

    fn described(events: &Events) -> Vec<String> {
        events
            .events
            .iter()
            .map(|e| match e {
                Ok(e) if e.tags.is_empty() => {
                    format!("{:?} {} {:?} {:?}", e.kind, e.route, e.params, e.revision)
                }
                Ok(e) => format!("tags {:?}", e.tags),
                Err(p) => format!("poison: {p}"),
            })
            .collect()
    }

    #[test]
    fn an_update_that_moves_a_row_names_both_objects_and_tags() {
        let (old, new) = (
            row(Value::Text("acme"), "2", "1"),
            row(Value::Text("globex"), "2", "2"),
        );
        let mut events = Events::default();
        events.change(
            &mapping(),
            Change::Update {
                old: Some(&old),
                new: &new,
            },
        );
        assert_eq!(
            described(&events),
            [
                r#"Invalidate app {"id": "2", "tenant": "globex"} Some(2)"#,
                r#"tags ["tenant:globex"]"#,
                r#"Invalidate app {"id": "2", "tenant": "acme"} None"#,
                r#"tags ["tenant:acme"]"#,
            ]
        );
    }

    #[test]
    fn an_update_in_place_names_its_object_once() {
        let (old, new) = (
            row(Value::Text("acme"), "1", "1"),
            row(Value::Text("acme"), "1", "2"),
        );
        let mut events = Events::default();
        events.change(
            &mapping(),
            Change::Update {
                old: Some(&old),
                new: &new,
            },
        );
        events.change(
            &mapping(),
            Change::Update {
                old: None,
                new: &new,
            },
        );
        assert_eq!(
            described(&events),
            [
                r#"Invalidate app {"id": "1", "tenant": "acme"} Some(2)"#,
                r#"tags ["tenant:acme"]"#,
            ]
        );
    }

    #[test]
    fn inserts_create_deletes_delete_and_unchanged_values_come_from_the_old_row() {
        let mut events = Events::default();
        events.change(&mapping(), Change::Insert(&row(Value::Text("a"), "1", "x")));
        events.change(&mapping(), Change::Delete(&row(Value::Text("b"), "2", "3")));
        let old = row(Value::Text("c"), "3", "1");
        let new = row(Value::Unchanged, "3", "2");
        events.take();
        events.change(
            &mapping(),
            Change::Update {
                old: Some(&old),
                new: &new,
            },
        );
        assert_eq!(
            described(&events)[0],
            r#"Invalidate app {"id": "3", "tenant": "c"} Some(2)"#
        );
        let mut events = Events::default();
        events.change(&mapping(), Change::Insert(&row(Value::Text("a"), "1", "x")));
        events.change(&mapping(), Change::Delete(&row(Value::Text("b"), "2", "3")));
        let d = described(&events);
        assert_eq!(
            d[0], r#"Create app {"id": "1", "tenant": "a"} None"#,
            "not an integer: no floor"
        );
        assert_eq!(d[2], r#"Delete app {"id": "2", "tenant": "b"} None"#);
    }

    #[test]
    fn a_null_key_is_poison_and_the_rest_applies() {
        let mut events = Events::default();
        events.change(&mapping(), Change::Insert(&row(Value::Null, "1", "1")));
        events.change(&mapping(), Change::Insert(&row(Value::Text("a"), "2", "1")));
        let d = described(&events);
        assert_eq!(
            d[0],
            "poison: public.app_config: param tenant ({tenant}) is NULL"
        );
        assert_eq!(
            d[1],
            "poison: public.app_config: tag tenant:{tenant} is NULL"
        );
        assert_eq!(d[2], r#"Create app {"id": "2", "tenant": "a"} Some(1)"#);
    }

    #[test]
    fn truncate_purges_each_route_once() {
        let mut events = Events::default();
        events.truncate(&mapping());
        events.truncate(&mapping());
        assert_eq!(described(&events), ["Invalidate app {} None"]);
    }
}
