//! `routes[i].bloom`: the scope template, checked against the route's
//! params (exactly one param is left out of it: the member id), the source
//! query, the filter's sizing and how often it is rebuilt.

use crate::config::bloom::{BloomConfig, ScopePart};
use crate::config::bloom_sizing::{Sizing, SizingError};
use crate::config::file::FileBloom;
use crate::config::route::Param;
use crate::config::ConfigError;
use std::time::Duration;

/// Shortest `rebuild_every`: a build reads the whole catalogue of a scope.
const MIN_REBUILD_EVERY: Duration = Duration::from_secs(10);

/// Validates `routes[i].bloom` (`at` is `routes[i]`).
pub(super) fn validate(
    at: &str,
    raw: FileBloom,
    params: &[Param],
) -> Result<BloomConfig, ConfigError> {
    let path = |field: &str| format!("{at}.bloom.{field}");
    let scope =
        parse_scope(&raw.scope, params).map_err(|m| ConfigError::invalid(path("scope"), m))?;
    let used: Vec<usize> = scope
        .iter()
        .filter_map(|p| match p {
            ScopePart::Param(i) => Some(*i),
            ScopePart::Literal(_) => None,
        })
        .collect();
    let free: Vec<usize> = (0..params.len()).filter(|i| !used.contains(i)).collect();
    let id_param = match free[..] {
        [one] => one,
        [] => {
            return Err(ConfigError::invalid(
                path("scope"),
                "uses every path param; one param must be left as the member id",
            ))
        }
        _ => {
            let names: Vec<&str> = free.iter().map(|i| params[*i].name.as_str()).collect();
            return Err(ConfigError::invalid(
                path("scope"),
                format!(
                    "params {names:?} are outside the scope; exactly one may be (the member id)"
                ),
            ));
        }
    };
    if raw.source.trim().is_empty() {
        return Err(ConfigError::invalid(path("source"), "must be a SQL query"));
    }
    let sizing = Sizing::new(raw.capacity, raw.fp_rate).map_err(|e| {
        let field = match e {
            SizingError::ZeroCapacity => "capacity",
            SizingError::TooLarge { .. } => "capacity",
            _ => "fp_rate",
        };
        ConfigError::invalid(path(field), e.to_string())
    })?;
    if raw.rebuild_every.0 < MIN_REBUILD_EVERY {
        return Err(ConfigError::invalid(
            path("rebuild_every"),
            format!("must be at least {MIN_REBUILD_EVERY:?}"),
        ));
    }
    Ok(BloomConfig {
        scope,
        scope_template: raw.scope,
        id_param,
        source: raw.source,
        capacity: raw.capacity,
        fp_rate: raw.fp_rate,
        rebuild_every: raw.rebuild_every.0,
        sizing,
    })
}

/// `"{tenant}"`, `"eu-{region}"`, `""`: literal text and `{param}` references.
fn parse_scope(template: &str, params: &[Param]) -> Result<Vec<ScopePart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                parts.push(ScopePart::Literal(rest.to_owned()));
                break;
            }
            Some(i) if rest[i..].starts_with('}') => {
                return Err(format!("{template:?}: '}}' without '{{'"));
            }
            Some(i) => {
                if i > 0 {
                    parts.push(ScopePart::Literal(rest[..i].to_owned()));
                }
                let after = &rest[i + 1..];
                let end = after
                    .find('}')
                    .ok_or_else(|| format!("{template:?}: '{{' is not closed"))?;
                let name = &after[..end];
                let index = params.iter().position(|p| p.name == name).ok_or_else(|| {
                    format!("{template:?}: {{{name}}} is not a param of the route's path")
                })?;
                if parts.contains(&ScopePart::Param(index)) {
                    return Err(format!("{template:?}: {{{name}}} appears twice"));
                }
                parts.push(ScopePart::Param(index));
                rest = &after[end + 1..];
            }
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pattern::ParamPattern;
    use crate::config::units::HumanDuration;

    fn params(names: &[&str]) -> Vec<Param> {
        names
            .iter()
            .map(|n| Param {
                name: (*n).to_owned(),
                pattern: ParamPattern::new(".*").unwrap(),
            })
            .collect()
    }

    fn raw(scope: &str) -> FileBloom {
        FileBloom {
            scope: scope.into(),
            source: "SELECT id::text FROM apps WHERE tenant = $1".into(),
            capacity: 10_000,
            fp_rate: 0.01,
            rebuild_every: HumanDuration(Duration::from_secs(600)),
        }
    }

    fn message(e: ConfigError) -> String {
        e.to_string()
    }

    #[test]
    fn scope_and_id_param() {
        let p = params(&["tenant", "id"]);
        let b = validate("routes[0]", raw("{tenant}"), &p).unwrap();
        assert_eq!(b.id_param, 1);
        assert!(b.is_scoped());
        assert_eq!(b.scope_value(&["acme", "42"]), "acme");
        assert_eq!(b.sizing, Sizing { m: 95_851, k: 7 });

        let b = validate("routes[0]", raw("eu-{tenant}-x"), &p).unwrap();
        assert_eq!(b.scope_value(&["acme", "42"]), "eu-acme-x");

        let single = params(&["id"]);
        let b = validate("routes[0]", raw(""), &single).unwrap();
        assert!(!b.is_scoped());
        assert_eq!(b.scope_value(&["42"]), "");
    }

    #[test]
    fn errors_name_the_yaml_path() {
        let p = params(&["tenant", "id"]);
        let cases = [
            (raw("{nope}"), "routes[0].bloom.scope"),
            (raw("{tenant"), "routes[0].bloom.scope"),
            (raw("tenant}"), "routes[0].bloom.scope"),
            (raw("{tenant}{id}"), "routes[0].bloom.scope"),
            (raw(""), "routes[0].bloom.scope"),
            (
                FileBloom {
                    fp_rate: 1.0,
                    ..raw("{tenant}")
                },
                "routes[0].bloom.fp_rate",
            ),
            (
                FileBloom {
                    capacity: 0,
                    ..raw("{tenant}")
                },
                "routes[0].bloom.capacity",
            ),
            (
                FileBloom {
                    source: " ".into(),
                    ..raw("{tenant}")
                },
                "routes[0].bloom.source",
            ),
            (
                FileBloom {
                    rebuild_every: HumanDuration(Duration::from_secs(1)),
                    ..raw("{tenant}")
                },
                "routes[0].bloom.rebuild_every",
            ),
        ];
        for (r, want) in cases {
            let scope = r.scope.clone();
            let e = message(validate("routes[0]", r, &p).unwrap_err());
            assert!(e.contains(want), "{scope:?}: {e}");
        }
    }
}
