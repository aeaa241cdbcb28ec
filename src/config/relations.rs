//! Route relations (`also_invalidates`): what else an event for a route
//! invalidates, e.g. the list and summary an object appears in. Validated
//! against the whole route table (the target route exists, every param it
//! needs is given, templates only name the source route's params, no
//! cycles), so applying an event can walk the relations without checks
//! that could fail at run time; only a substituted value that fails the
//! target's pattern is skipped (no read could have cached that object).

use super::file::FileRelation;
use super::route::Route;
use super::ConfigError;

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
pub struct ValueTemplate(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// Index into the source route's params.
    Param(usize),
}

impl ValueTemplate {
    /// The value for the source object's param values (template order).
    pub fn render(&self, source: &[String]) -> String {
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
    pub fn render(&self, source: &[String]) -> Vec<String> {
        self.params.iter().map(|t| t.render(source)).collect()
    }
}

fn parse_template(at: &str, text: &str, source: &Route) -> Result<ValueTemplate, ConfigError> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let Some(close) = rest[open..].find('}') else {
            return Err(ConfigError::invalid(at, format!("{text:?}: unclosed {{")));
        };
        let name = &rest[open + 1..open + close];
        let Some(i) = source.params.iter().position(|p| p.name == name) else {
            return Err(ConfigError::invalid(
                at,
                format!(
                    "{{{name}}} is not a param of this route ({:?})",
                    source.template
                ),
            ));
        };
        pieces.push(Piece::Param(i));
        rest = &rest[open + close + 1..];
    }
    if rest.contains('}') {
        return Err(ConfigError::invalid(at, format!("{text:?}: stray }}")));
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(ValueTemplate(pieces))
}

/// Resolves every route's `also_invalidates` (`raw[i]` for `routes[i]`)
/// and refuses cycles. Errors name the YAML path.
pub fn resolve(
    routes: &[Route],
    raw: &[Vec<FileRelation>],
) -> Result<Vec<Vec<Relation>>, ConfigError> {
    let mut out = Vec::with_capacity(routes.len());
    let mut edges: Vec<Vec<usize>> = Vec::with_capacity(routes.len());
    for (i, (source, relations)) in routes.iter().zip(raw).enumerate() {
        let mut resolved = Vec::with_capacity(relations.len());
        let mut targets = Vec::with_capacity(relations.len());
        for (j, rel) in relations.iter().enumerate() {
            let at = format!("routes[{i}].also_invalidates[{j}]");
            let Some(t) = routes.iter().position(|r| r.name == rel.route) else {
                return Err(ConfigError::invalid(
                    format!("{at}.route"),
                    format!("unknown route {:?}", rel.route),
                ));
            };
            let target = &routes[t];
            if let Some(extra) = rel
                .params
                .keys()
                .find(|k| !target.params.iter().any(|p| &p.name == *k))
            {
                return Err(ConfigError::invalid(
                    format!("{at}.params.{extra}"),
                    format!("route {:?} has no param {extra:?}", target.name),
                ));
            }
            let mut params = Vec::with_capacity(target.params.len());
            for p in &target.params {
                let Some(text) = rel.params.get(&p.name) else {
                    return Err(ConfigError::invalid(
                        format!("{at}.params"),
                        format!(
                            "route {:?} needs param {:?}; give it, e.g. {{ {}: \"{{...}}\" }}",
                            target.name, p.name, p.name
                        ),
                    ));
                };
                params.push(parse_template(
                    &format!("{at}.params.{}", p.name),
                    text,
                    source,
                )?);
            }
            resolved.push(Relation {
                route: target.name.clone(),
                params,
            });
            targets.push(t);
        }
        out.push(resolved);
        edges.push(targets);
    }
    if let Some((i, j, cycle)) = find_cycle(&edges) {
        let names: Vec<&str> = cycle.iter().map(|&r| routes[r].name.as_str()).collect();
        return Err(ConfigError::invalid(
            format!("routes[{i}].also_invalidates[{j}]"),
            format!("relations form a cycle: {}", names.join(" -> ")),
        ));
    }
    Ok(out)
}

/// A cycle in `edges`, as (route, relation index) of its closing edge and
/// the routes along it (first repeated at the end).
fn find_cycle(edges: &[Vec<usize>]) -> Option<(usize, usize, Vec<usize>)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit(
        n: usize,
        edges: &[Vec<usize>],
        marks: &mut [Mark],
        path: &mut Vec<usize>,
    ) -> Option<(usize, usize, Vec<usize>)> {
        marks[n] = Mark::OnPath;
        path.push(n);
        for (j, &t) in edges[n].iter().enumerate() {
            match marks[t] {
                Mark::OnPath => {
                    let start = path.iter().position(|&p| p == t).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(t);
                    return Some((n, j, cycle));
                }
                Mark::New => {
                    if let Some(found) = visit(t, edges, marks, path) {
                        return Some(found);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks[n] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; edges.len()];
    let mut path = Vec::new();
    (0..edges.len()).find_map(|n| {
        if marks[n] == Mark::New {
            visit(n, edges, &mut marks, &mut path)
        } else {
            None
        }
    })
}
