//! `routes[i].bloom`: the typed Bloom filter settings of a route (checked
//! against the route's params in `validate`).
//!
//! The member id checked against the filter is the one route param that the
//! `scope` template does not use (for `/api/tenants/{tenant}/apps/{id}` with
//! `scope: "{tenant}"`, it is `id`), so a route with `bloom` needs exactly
//! one such param. `source` is the SQL that lists the members of one scope
//! value, passed as `$1` (text).

use super::bloom_sizing::Sizing;
use std::time::Duration;

/// One piece of a scope template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePart {
    Literal(String),
    /// Index into the route's params.
    Param(usize),
}

#[derive(Debug, Clone)]
pub struct BloomConfig {
    /// The scope template, e.g. `{tenant}`; empty: one filter for the route.
    pub scope: Vec<ScopePart>,
    /// The scope as written, for logs and the route listing.
    pub scope_template: String,
    /// Index of the route param whose value is the member id.
    pub id_param: usize,
    /// SQL listing the ids of one scope value (`$1`, text).
    pub source: String,
    pub capacity: u64,
    pub fp_rate: f64,
    pub rebuild_every: Duration,
    /// `m` and `k`, derived from `capacity` and `fp_rate`.
    pub sizing: Sizing,
}

impl BloomConfig {
    /// The scope value of a request: the template with its params filled in
    /// from `params` (values in the route's param order).
    pub(crate) fn scope_value<S: AsRef<str>>(&self, params: &[S]) -> String {
        let mut out = String::new();
        for part in &self.scope {
            match part {
                ScopePart::Literal(s) => out.push_str(s),
                ScopePart::Param(i) => out.push_str(params.get(*i).map_or("", |p| p.as_ref())),
            }
        }
        out
    }

    /// True if the scope depends on request params (one filter per value);
    /// false for one filter per route.
    pub(crate) fn is_scoped(&self) -> bool {
        self.scope.iter().any(|p| matches!(p, ScopePart::Param(_)))
    }
}
