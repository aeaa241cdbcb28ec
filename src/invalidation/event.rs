//! The invalidation event model shared by every source (admin endpoint,
//! outbox rows, stream entries, write-through): `{route, params, kind,
//! revision?}`, validated against the live route table. Param values are
//! normalised like request paths (`config::path`), so an event names the
//! object that a read of the same path finds. An event that names an
//! unknown route or params that fail their patterns (or that no path could
//! carry) is poison: it is dead-lettered by its source, never retried.

use crate::config::{path, Config, Route};
use crate::keys;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    #[default]
    Invalidate,
    Create,
    Delete,
}

impl EventKind {
    pub fn parse(s: &str) -> Option<EventKind> {
        match s {
            "invalidate" | "" => Some(EventKind::Invalidate),
            "create" => Some(EventKind::Create),
            "delete" => Some(EventKind::Delete),
            _ => None,
        }
    }
}

/// An event as it arrives (JSON body, outbox row, stream fields).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub route: String,
    /// Values may be JSON strings or integers (`"id": 42`).
    #[serde(default, deserialize_with = "string_or_int_values")]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub kind: EventKind,
    #[serde(default)]
    pub revision: Option<i64>,
}

fn string_or_int_values<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Text(String),
        Int(i64),
    }
    let raw = BTreeMap::<String, Value>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| match v {
            Value::Text(s) => (k, s),
            Value::Int(n) => (k, n.to_string()),
        })
        .collect())
}

/// An event checked against the route table: ready to apply.
#[derive(Debug, Clone)]
pub struct Validated {
    pub route: Arc<Route>,
    /// Param values in template order.
    pub params: Vec<String>,
    pub kind: EventKind,
    /// The object's generation key.
    pub gen_key: String,
}

/// Why an event can never be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Poison {
    #[error("unknown route {0:?}")]
    UnknownRoute(String),
    #[error("param {0:?} is missing")]
    MissingParam(String),
    #[error("param {0:?} does not match its pattern")]
    BadParam(String),
    /// Empty, a `/` in a one-segment param, a `..` that leaves the value,
    /// or an escape whose meaning origins disagree on (`%2F`).
    #[error("param {0:?} is not a value a request path could carry")]
    NotInPath(String),
    #[error("route has no param {0:?}")]
    ExtraParam(String),
    #[error("malformed event: {0}")]
    Malformed(String),
}

impl Event {
    pub fn from_json(bytes: &[u8]) -> Result<Event, Poison> {
        serde_json::from_slice(bytes).map_err(|e| Poison::Malformed(e.to_string()))
    }

    /// Builds an event from separately stored parts (an outbox row, stream
    /// fields). `params` must be a JSON object whose values are strings or
    /// integers (`jsonb_build_object('id', id)` with a bigint id is common);
    /// anything else is poison. `kind` empty means `invalidate`.
    pub fn from_parts(
        route: &str,
        params: &serde_json::Value,
        kind: &str,
        revision: Option<i64>,
    ) -> Result<Event, Poison> {
        let serde_json::Value::Object(map) = params else {
            return Err(Poison::Malformed("params is not a JSON object".into()));
        };
        let mut out = BTreeMap::new();
        for (name, value) in map {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
                _ => {
                    return Err(Poison::Malformed(format!(
                        "param {name:?} is not a string or an integer"
                    )))
                }
            };
            out.insert(name.clone(), text);
        }
        let kind = EventKind::parse(kind)
            .ok_or_else(|| Poison::Malformed(format!("unknown kind {kind:?}")))?;
        Ok(Event {
            route: route.to_owned(),
            params: out,
            kind,
            revision,
        })
    }

    pub fn validate(&self, cfg: &Config) -> Result<Validated, Poison> {
        let route = cfg
            .routes
            .find(&self.route)
            .ok_or_else(|| Poison::UnknownRoute(self.route.clone()))?;
        if let Some(extra) = self
            .params
            .keys()
            .find(|k| !route.params.iter().any(|p| &p.name == *k))
        {
            return Err(Poison::ExtraParam(extra.clone()));
        }
        let mut values = Vec::with_capacity(route.params.len());
        for (i, p) in route.params.iter().enumerate() {
            let v = self
                .params
                .get(&p.name)
                .ok_or_else(|| Poison::MissingParam(p.name.clone()))?;
            // The value a read of the object's path would carry, so the
            // event names the object that read finds (`css/./a.css` and
            // `css/a.css` are one object); a value no path can carry is poison.
            let v = path::normalize_value(v, route.is_prefix(i))
                .ok_or_else(|| Poison::NotInPath(p.name.clone()))?;
            if !p.pattern.is_match(&v) {
                return Err(Poison::BadParam(p.name.clone()));
            }
            values.push(v);
        }
        Ok(Validated::new(cfg, route, values, self.kind))
    }
}

impl Validated {
    /// An event for `params` that already match `route`'s patterns.
    pub fn new(
        cfg: &Config,
        route: &Arc<Route>,
        params: Vec<String>,
        kind: EventKind,
    ) -> Validated {
        let identity = keys::identity(&route.name, &params);
        Validated {
            gen_key: keys::generation_key(&cfg.store.namespace, &identity),
            route: Arc::clone(route),
            params,
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let yaml = r#"
version: 1
listen: 127.0.0.1:1
admin: { listen: 127.0.0.1:2 }
upstream: { url: "http://127.0.0.1:9" }
routes:
  - name: files
    path: /t/{tenant}/static/{path...}
    params: { tenant: "[a-z~]+", path: "[a-z./]+" }
    ttl: 60s
"#;
        Config::parse(yaml, &|_| None).expect("config")
    }

    fn event(tenant: &str, path: &str) -> Event {
        Event {
            route: "files".into(),
            params: BTreeMap::from([
                ("tenant".into(), tenant.into()),
                ("path".into(), path.into()),
            ]),
            kind: EventKind::Invalidate,
            revision: None,
        }
    }

    #[test]
    fn values_name_the_object_a_read_of_their_path_finds() {
        let cfg = config();
        let gen_key = |t: &str, p: &str| event(t, p).validate(&cfg).map(|v| v.gen_key);
        // What a read of /t/acme/static/css/./site.css finds.
        let read = match cfg
            .routes
            .classify(&http::Method::GET, "/t/acme/static/css/./site.css")
        {
            crate::config::RouteMatch::Read(route, params) => {
                Validated::new(&cfg, &route, params, EventKind::Invalidate).gen_key
            }
            other => panic!("not a read: {other:?}"),
        };
        for (t, p) in [
            ("acme", "css/site.css"),
            ("acme", "css/./site.css"),
            ("acme", "/css//site.css"),
            ("acme", "img/../css/site.css"),
            ("%61cme", "css/site.css"),
        ] {
            assert_eq!(gen_key(t, p).as_deref(), Ok(read.as_str()), "{t} {p}");
        }
        assert_eq!(gen_key("%7e", "a").map(|_| ()), Ok(()), "~ decoded");
        for (t, p, want) in [
            ("acme", "../x", Poison::NotInPath("path".into())),
            ("acme", "", Poison::NotInPath("path".into())),
            ("acme", "css%2Fsite.css", Poison::NotInPath("path".into())),
            ("a/b", "x", Poison::NotInPath("tenant".into())),
            ("..", "x", Poison::NotInPath("tenant".into())),
            ("acme", "CSS", Poison::BadParam("path".into())),
        ] {
            assert_eq!(gen_key(t, p), Err(want), "{t} {p}");
        }
    }
}
