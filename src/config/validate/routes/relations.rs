//! `routes[i].also_invalidates`: each relation's target route exists, every
//! param it needs is given (and no other), its value templates name only
//! the source route's params, and the relations form no cycle.

use crate::config::file::FileRelation;
use crate::config::relations::{Piece, Relation, ValueTemplate};
use crate::config::route::Route;
use crate::config::ConfigError;

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
pub(super) fn resolve(
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

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, parse, APP};
    use crate::config::{Config, Route};

    /// `also_invalidates`, `tags_from`, `version_from`
    /// (docs/invalidation.md#dependent-invalidation): errors name the YAML
    /// path.
    #[test]
    fn relations_are_validated_against_the_route_table() {
        let routes = |relations: &str, list_relations: &str| {
            format!(
                r#"
routes:
  - name: app
    path: /t/{{tenant}}/a/{{id}}
    params: {{ tenant: "[a-z]+", id: "[0-9]+" }}
    ttl: 60s
    also_invalidates: {relations}
  - name: list
    path: /t/{{tenant}}/a
    params: {{ tenant: "[a-z]+" }}
    ttl: 60s
    also_invalidates: {list_relations}
  - name: summary
    path: /t/{{tenant}}/summary
    params: {{ tenant: "[a-z]+" }}
    ttl: 60s
"#
            )
        };
        let ok = parse(&routes(
            r#"[{ route: list, params: { tenant: "{tenant}" } }]"#,
            r#"[{ route: summary, params: { tenant: "{tenant}" } }]"#,
        ))
        .expect("valid");
        let app = cfg_route(&ok, "app");
        assert_eq!(app.also_invalidates.len(), 1);
        assert_eq!(
            app.also_invalidates[0].render(&["acme".into(), "7".into()]),
            ["acme"]
        );
        for (relations, list_relations, path, says) in [
            (
                r#"[{ route: nope }]"#,
                "[]",
                "routes[0].also_invalidates[0].route",
                "unknown route",
            ),
            (
                r#"[{ route: list }]"#,
                "[]",
                "routes[0].also_invalidates[0].params",
                "needs param \"tenant\"",
            ),
            (
                r#"[{ route: list, params: { tenant: "{who}" } }]"#,
                "[]",
                "routes[0].also_invalidates[0].params.tenant",
                "{who} is not a param",
            ),
            (
                r#"[{ route: list, params: { tenant: "{tenant}", id: "{id}" } }]"#,
                "[]",
                "routes[0].also_invalidates[0].params.id",
                "has no param",
            ),
            (
                r#"[{ route: list, params: { tenant: "{tenant}" } }]"#,
                r#"[{ route: app, params: { tenant: "{tenant}", id: "1" } }]"#,
                "routes[1].also_invalidates[0]",
                "cycle: app -> list -> app",
            ),
            (
                r#"[{ route: app, params: { tenant: "{tenant}", id: "{id}" } }]"#,
                "[]",
                "routes[0].also_invalidates[0]",
                "cycle: app -> app",
            ),
        ] {
            let e = err(&routes(relations, list_relations));
            assert!(e.contains(path) && e.contains(says), "{relations}: {e}");
        }
        let e = err(&APP.replace("ttl: 60s", "ttl: 60s\n    tags_from: \"bad header\""));
        assert!(e.contains("routes[0].tags_from"), "{e}");
        let e = err(&APP.replace("ttl: 60s", "ttl: 60s\n    version_from: \"x y\""));
        assert!(e.contains("routes[0].version_from"), "{e}");
    }

    fn cfg_route<'a>(cfg: &'a Config, name: &str) -> &'a Route {
        cfg.routes.find(name).expect("route")
    }
}
