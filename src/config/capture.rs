//! `invalidation.capture`: which rows of the service's own tables name
//! which cached objects. A mapping's params and tags are templates over
//! the row's columns (`"tenant:{tenant}"`); both capture modes (triggers
//! that write outbox rows, a logical replication consumer) render the same
//! templates, one in SQL and one in Rust, so they name the same objects.
//! See `docs/invalidation.md`, "Change capture".

use std::fmt;

/// `capture.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Triggers on the mapped tables write outbox rows in the changing
    /// transaction; the outbox worker applies them.
    Triggers,
    /// A logical replication slot (pgoutput) is read; the service's
    /// transactions write nothing more.
    Logical,
}

impl CaptureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureMode::Triggers => "triggers",
            CaptureMode::Logical => "logical",
        }
    }
}

/// `invalidation.capture`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    pub mode: CaptureMode,
    /// Where the mapped tables live (a `postgres://` URL or key=value
    /// string; may hold a password: never logged).
    pub url: String,
    /// Logical mode: the replication slot and the publication it reads.
    pub slot: String,
    pub publication: String,
    pub tables: Vec<TableMapping>,
}

/// One mapped table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMapping {
    pub table: TableName,
    pub route: String,
    /// One template per route param, in the route's param order.
    pub params: Vec<(String, Template)>,
    pub tags: Vec<Template>,
    /// A column holding the row's version: raises the object's floor.
    pub revision: Option<String>,
    /// `on_insert: create`: an insert grows the route's Bloom filter.
    pub create_on_insert: bool,
}

impl TableMapping {
    /// Every column the mapping reads (params, tags, revision), each once,
    /// in first-use order.
    pub(crate) fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let templates = self.params.iter().map(|(_, t)| t).chain(&self.tags);
        let names = templates
            .flat_map(Template::columns)
            .chain(self.revision.as_deref());
        for name in names {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }

    /// The columns an old row must carry (an `UPDATE` or `DELETE` names
    /// the objects and tags it leaves): params' and tags', each once.
    pub(crate) fn old_row_columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let templates = self.params.iter().map(|(_, t)| t).chain(&self.tags);
        for name in templates.flat_map(Template::columns) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }
}

/// A table name, `schema.table` (schema `public` when the config gives
/// none). Both parts are plain identifiers (checked), so they can be
/// spliced into SQL and compared with what pgoutput reports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    pub(crate) fn parse(text: &str) -> Result<TableName, String> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (s, n),
            None => ("public", text),
        };
        for part in [schema, name] {
            if !is_identifier(part) {
                return Err(format!(
                    "{text:?} is not a table name: use schema.table with plain identifiers \
                     (letters, digits, _; not starting with a digit)"
                ));
            }
        }
        Ok(TableName {
            schema: schema.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// A plain SQL identifier as Postgres stores an unquoted one: lowercase
/// letters, digits and `_`, not starting with a digit, at most 63 bytes.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}

/// Literal text and `{column}` references: `"tenant:{tenant}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Column(String),
}

impl Template {
    /// Parses a template. `{` opens a column reference that `}` closes; a
    /// column is a plain identifier; braces are not allowed elsewhere.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Text(rest.to_owned()));
                    break;
                }
                Some(at) if rest.as_bytes()[at] == b'}' => {
                    return Err(format!("{text:?}: a `}}` without its `{{`"));
                }
                Some(at) => {
                    if at > 0 {
                        parts.push(Part::Text(rest[..at].to_owned()));
                    }
                    let after = &rest[at + 1..];
                    let Some(end) = after.find('}') else {
                        return Err(format!("{text:?}: a `{{` without its `}}`"));
                    };
                    let column = &after[..end];
                    if !is_identifier(column) {
                        return Err(format!(
                            "{text:?}: {{{column}}} is not a column name (lowercase letters, \
                             digits and _, not starting with a digit)"
                        ));
                    }
                    parts.push(Part::Column(column.to_owned()));
                    rest = &after[end + 1..];
                }
            }
        }
        if !parts.iter().any(|p| matches!(p, Part::Column(_))) {
            return Err(format!("{text:?} names no column (write {{column}})"));
        }
        Ok(Template { parts })
    }

    /// The columns referenced, in order (repeats included).
    pub(crate) fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Column(c) => Some(c.as_str()),
            Part::Text(_) => None,
        })
    }

    /// The value for one row: `None` when a referenced column is NULL (or
    /// unknown to `value`), which names no object.
    pub(crate) fn render<'r>(
        &self,
        mut value: impl FnMut(&str) -> Option<&'r str>,
    ) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Column(c) => out.push_str(value(c)?),
            }
        }
        Some(out)
    }

    /// The same value as a SQL expression over the row alias `row`: NULL
    /// when a referenced column is NULL (`||` propagates NULL).
    pub(crate) fn sql(&self, row: &str) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => sql_literal(t),
                Part::Column(c) => format!("{row}.{c}::text"),
            })
            .collect();
        parts.join(" || ")
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(t) => f.write_str(t)?,
                Part::Column(c) => write!(f, "{{{c}}}")?,
            }
        }
        Ok(())
    }
}

/// `'text'` with quotes doubled (standard_conforming_strings, the default
/// since Postgres 9.1, so backslashes are literal).
pub(crate) fn sql_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_render_and_print_sql() {
        let t = Template::parse("tenant:{tenant}/{id}").expect("valid");
        assert_eq!(t.columns().collect::<Vec<_>>(), ["tenant", "id"]);
        let row = |c: &str| match c {
            "tenant" => Some("acme"),
            "id" => Some("7"),
            _ => None,
        };
        assert_eq!(t.render(row).as_deref(), Some("tenant:acme/7"));
        assert_eq!(t.render(|_| None), None, "a NULL column names nothing");
        assert_eq!(
            t.sql("n"),
            "'tenant:' || n.tenant::text || '/' || n.id::text"
        );
        assert_eq!(
            Template::parse("it's {x}").expect("valid").sql("o"),
            "'it''s ' || o.x::text"
        );
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (text, says) in [
            ("{id", "without its `}`"),
            ("id}", "without its `{`"),
            ("{Id}", "not a column name"),
            ("{1d}", "not a column name"),
            ("{}", "not a column name"),
            ("{a b}", "not a column name"),
            ("plain", "names no column"),
        ] {
            let err = Template::parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn table_names_default_to_public() {
        let t = TableName::parse("app_config").expect("valid");
        assert_eq!(t.to_string(), "public.app_config");
        assert_eq!(
            TableName::parse("billing.plans").expect("valid").schema,
            "billing"
        );
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse("App").is_err());
        assert!(TableName::parse("x; drop").is_err());
    }

    #[test]
    fn a_mapping_lists_its_columns_once() {
        let m = TableMapping {
            table: TableName::parse("t").expect("valid"),
            route: "app".into(),
            params: vec![
                ("tenant".into(), Template::parse("{tenant}").expect("valid")),
                ("id".into(), Template::parse("{id}").expect("valid")),
            ],
            tags: vec![Template::parse("tenant:{tenant}:{kind}").expect("valid")],
            revision: Some("version".into()),
            create_on_insert: false,
        };
        assert_eq!(m.columns(), ["tenant", "id", "kind", "version"]);
        assert_eq!(m.old_row_columns(), ["tenant", "id", "kind"]);
    }
}
