//! The invalidation event model shared by every source (admin endpoint,
//! outbox rows, stream entries, write-through): `{route, params, kind,
//! revision?}` or `{tags}`, validated against the live route table. A
//! valid event lists every generation key it replaces: its object's, the
//! objects its route's `also_invalidates` relate to (transitively), or its
//! tags'; and the version floor its revision raises. Param values are
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
pub(crate) enum EventKind {
    #[default]
    Invalidate,
    Create,
    Delete,
}

impl EventKind {
    pub(crate) fn parse(s: &str) -> Option<EventKind> {
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
pub(crate) struct Event {
    /// Empty for a tag event.
    #[serde(default)]
    pub route: String,
    /// Values may be JSON strings or integers (`"id": 42`).
    #[serde(default, deserialize_with = "string_or_int_values")]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub kind: EventKind,
    #[serde(default)]
    pub revision: Option<i64>,
    /// Cache tags to invalidate instead of an object.
    #[serde(default)]
    pub tags: Vec<String>,
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
pub(crate) struct Validated {
    /// The object the event names; `None` for a tag event.
    pub object: Option<Object>,
    pub kind: EventKind,
    /// Every generation key the event replaces: its object's first, then
    /// related objects', or its tags'.
    pub targets: Vec<Target>,
    /// The object's floor key and the revision to raise it to (routes
    /// with `version_from`, events with a `revision`).
    pub floor: Option<(String, i64)>,
}

#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub route: Arc<Route>,
    /// Param values in template order.
    pub params: Vec<String>,
}

/// One generation key an event replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub gen_key: String,
    pub kind: TargetKind,
}

/// What a replaced generation belongs to: the `kind` label of
/// `sidecache_invalidations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetKind {
    /// The object the event names.
    Object,
    /// An object of a route the event's route relates to.
    Related,
    /// A cache tag.
    Tag,
    /// Every object of a route.
    Route,
}

impl TargetKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TargetKind::Object => "object",
            TargetKind::Related => "related",
            TargetKind::Tag => "tag",
            TargetKind::Route => "route",
        }
    }
}

/// Why an event can never be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Poison {
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
    #[error("an event names a route or tags, not both")]
    TagsAndRoute,
    #[error("bad tags: {0}")]
    BadTags(#[from] crate::tags::TagError),
    /// Change capture: a row whose key (or tag) column is NULL names no
    /// object.
    #[error("{0} is NULL")]
    NullValue(String),
}

impl Poison {
    /// The `reason` label of the dead-letter metrics.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Poison::UnknownRoute(_) => "unknown_route",
            Poison::MissingParam(_) => "missing_param",
            Poison::BadParam(_) => "bad_param",
            Poison::NotInPath(_) => "not_in_path",
            Poison::ExtraParam(_) => "extra_param",
            Poison::Malformed(_) => "malformed",
            Poison::TagsAndRoute => "tags_and_route",
            Poison::BadTags(_) => "bad_tags",
            Poison::NullValue(_) => "null_value",
        }
    }
}

impl Event {
    pub(crate) fn from_json(bytes: &[u8]) -> Result<Event, Poison> {
        serde_json::from_slice(bytes).map_err(|e| Poison::Malformed(e.to_string()))
    }

    /// Builds an event from separately stored parts (an outbox row, stream
    /// fields). `params` must be a JSON object whose values are strings or
    /// integers (`jsonb_build_object('id', id)` with a bigint id is common);
    /// anything else is poison. `kind` empty means `invalidate`.
    pub(crate) fn from_parts(
        route: &str,
        params: &serde_json::Value,
        kind: &str,
        revision: Option<i64>,
        tags: Vec<String>,
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
            tags,
        })
    }

    pub(crate) fn validate(&self, cfg: &Config) -> Result<Validated, Poison> {
        if !self.tags.is_empty() {
            if !self.route.is_empty() || !self.params.is_empty() {
                return Err(Poison::TagsAndRoute);
            }
            let tags = crate::tags::checked(self.tags.clone())?;
            return Ok(Validated::tags(cfg, &tags, self.kind));
        }
        if self.route.is_empty() {
            return Err(Poison::Malformed("no route and no tags".into()));
        }
        let route = cfg
            .routes
            .find(&self.route)
            .ok_or_else(|| Poison::UnknownRoute(self.route.clone()))?;
        if self.params.is_empty() && !route.params.is_empty() {
            return Ok(Validated::route_wide(cfg, route, self.kind));
        }
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
        let mut event = Validated::new(cfg, route, values, self.kind);
        if let (Some(revision), Some(object)) = (self.revision, &event.object) {
            if object.route.version_from.is_some() {
                let identity = keys::identity(&object.route.name, &object.params);
                event.floor = Some((keys::floor_key(&cfg.store.namespace, &identity), revision));
            }
        }
        Ok(event)
    }
}

impl Validated {
    /// An event for `params` that already match `route`'s patterns, with
    /// the objects its route relates to.
    pub(crate) fn new(
        cfg: &Config,
        route: &Arc<Route>,
        params: Vec<String>,
        kind: EventKind,
    ) -> Validated {
        let ns = &cfg.store.namespace;
        let mut targets = vec![Target {
            gen_key: keys::generation_key(ns, &keys::identity(&route.name, &params)),
            kind: TargetKind::Object,
        }];
        related(cfg, route, &params, &mut targets);
        Validated {
            object: Some(Object {
                route: Arc::clone(route),
                params,
            }),
            kind,
            targets,
            floor: None,
        }
    }

    /// A route-wide purge (`{"route": "app"}`, no params): the route's
    /// generation, which every entry of the route is stamped with.
    fn route_wide(cfg: &Config, route: &Route, kind: EventKind) -> Validated {
        Validated {
            object: None,
            kind,
            targets: vec![Target {
                gen_key: keys::route_generation_key(&cfg.store.namespace, &route.name),
                kind: TargetKind::Route,
            }],
            floor: None,
        }
    }

    /// An event for tags already checked.
    fn tags(cfg: &Config, tags: &[String], kind: EventKind) -> Validated {
        let targets = tags
            .iter()
            .map(|t| Target {
                gen_key: keys::tag_generation_key(&cfg.store.namespace, t),
                kind: TargetKind::Tag,
            })
            .collect();
        Validated {
            object: None,
            kind,
            targets,
            floor: None,
        }
    }
}

/// Adds the objects `route`'s relations name for `params`, and theirs in
/// turn (config validation refuses cycles). A related value that fails
/// its route's pattern names no object a read could have cached: skipped.
fn related(cfg: &Config, route: &Route, params: &[String], out: &mut Vec<Target>) {
    for relation in &route.also_invalidates {
        let Some(target) = cfg.routes.find(&relation.route) else {
            continue;
        };
        let values = relation.render(params);
        let matches = target
            .params
            .iter()
            .zip(&values)
            .all(|(p, v)| p.pattern.is_match(v));
        if !matches {
            tracing::debug!(route = %target.name, "related object skipped: a value fails its pattern");
            continue;
        }
        let gen_key =
            keys::generation_key(&cfg.store.namespace, &keys::identity(&target.name, &values));
        if out.iter().any(|t| t.gen_key == gen_key) {
            continue;
        }
        out.push(Target {
            gen_key,
            kind: TargetKind::Related,
        });
        related(cfg, target, &values, out);
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
            tags: vec![],
        }
    }

    #[test]
    fn values_name_the_object_a_read_of_their_path_finds() {
        let cfg = config();
        let gen_key = |t: &str, p: &str| {
            event(t, p)
                .validate(&cfg)
                .map(|v| v.targets[0].gen_key.clone())
        };
        // What a read of /t/acme/static/css/./site.css finds.
        let read = match cfg
            .routes
            .classify(&http::Method::GET, "/t/acme/static/css/./site.css")
        {
            crate::config::RouteMatch::Read(route, params) => {
                Validated::new(&cfg, &route, params, EventKind::Invalidate).targets[0]
                    .gen_key
                    .clone()
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

    #[test]
    fn relations_are_walked_transitively_and_tags_checked() {
        let yaml = r#"
version: 1
listen: 127.0.0.1:1
admin: { listen: 127.0.0.1:2 }
upstream: { url: "http://127.0.0.1:9" }
routes:
  - name: app
    path: /t/{tenant}/a/{id}
    params: { tenant: "[a-z]+", id: "[0-9]+" }
    ttl: 60s
    also_invalidates:
      - { route: list, params: { tenant: "{tenant}" } }
      - { route: summary, params: { tenant: "{tenant}" } }
      - { route: byid, params: { id: "x{id}" } }
  - name: list
    path: /t/{tenant}/a
    params: { tenant: "[a-z]+" }
    ttl: 60s
    also_invalidates: [{ route: summary, params: { tenant: "{tenant}" } }]
  - name: summary
    path: /t/{tenant}/s
    params: { tenant: "[a-z]+" }
    ttl: 60s
  - name: byid
    path: /i/{id}
    params: { id: "[0-9]+" }
    ttl: 60s
"#;
        let cfg = Config::parse(yaml, &|_| None).expect("config");
        let event = Event {
            route: "app".into(),
            params: BTreeMap::from([("tenant".into(), "acme".into()), ("id".into(), "7".into())]),
            kind: EventKind::Invalidate,
            revision: Some(3),
            tags: vec![],
        };
        let v = event.validate(&cfg).expect("valid");
        let keys: Vec<(&str, TargetKind)> = v
            .targets
            .iter()
            .map(|t| (t.gen_key.as_str(), t.kind))
            .collect();
        // The summary once (also reached through the list); `byid`'s value
        // "x7" fails its pattern: no such object, skipped.
        assert_eq!(
            keys,
            [
                ("sc:o:{app:acme:7}:g", TargetKind::Object),
                ("sc:o:{list:acme}:g", TargetKind::Related),
                ("sc:o:{summary:acme}:g", TargetKind::Related),
            ]
        );
        assert_eq!(v.floor, None, "no version_from: no floor");

        let tags = |tags: &[&str], route: &str| Event {
            route: route.into(),
            params: BTreeMap::new(),
            kind: EventKind::Invalidate,
            revision: None,
            tags: tags.iter().map(|t| t.to_string()).collect(),
        };
        let v = tags(&["b", "a:1", "b"], "").validate(&cfg).expect("tags");
        let keys: Vec<&str> = v.targets.iter().map(|t| t.gen_key.as_str()).collect();
        assert_eq!(keys, ["sc:t:{a%3A1}:g", "sc:t:{b}:g"]);
        assert!(v.targets.iter().all(|t| t.kind == TargetKind::Tag));
        assert_eq!(
            tags(&["a"], "app").validate(&cfg).err(),
            Some(Poison::TagsAndRoute)
        );
        assert!(matches!(
            tags(&["a\u{1}"], "").validate(&cfg),
            Err(Poison::BadTags(_))
        ));
        assert!(matches!(
            tags(&[], "").validate(&cfg),
            Err(Poison::Malformed(_))
        ));
    }
}
