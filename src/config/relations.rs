//! Route relations (`also_invalidates`): what else an event for a route
//! invalidates, e.g. the list and summary an object appears in. Validated
//! against the whole route table (in `validate`: the target route exists,
//! every param it needs is given, templates only name the source route's
//! params, no cycles), so applying an event can walk the relations without
//! checks that could fail at run time; only a substituted value that fails
//! the target's pattern is skipped (no read could have cached that object).

/// One related object: `route`'s params, each built from the source
/// route's param values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub route: String,
    /// In the target route's param order.
    pub params: Vec<ValueTemplate>,
}

/// A param value template: text and `{param}` references to the source
/// route's params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueTemplate(pub(super) Vec<Piece>);

/// One piece of a [`ValueTemplate`], built by `validate` (which checks
/// each `{param}` reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    Text(String),
    /// Index into the source route's params.
    Param(usize),
}

impl ValueTemplate {
    /// The value for the source object's param values (template order).
    pub(crate) fn render(&self, source: &[String]) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Param(i) => out.push_str(source.get(*i).map_or("", String::as_str)),
            }
        }
        out
    }
}

impl Relation {
    /// The related object's param values for the source object's.
    pub(crate) fn render(&self, source: &[String]) -> Vec<String> {
        self.params.iter().map(|t| t.render(source)).collect()
    }
}
