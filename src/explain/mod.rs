//! Explain one URL (`GET /admin/lookup?url=...`, `sidecache lookup`): the
//! route a GET of it matches (or why none does), its identity, variant and
//! store keys, what the store holds for it (entry, age, TTLs, stamped vs
//! current generation, the lease and who holds it), whether this instance's
//! near cache has it, the Bloom filter's answer, and what a GET would get
//! now, and why. It only reads: nothing is counted, removed, built or
//! filled. [`cli`] prints the same as a table from a shell.
//!
//! Headers that select a variant (`vary`) or decide a bypass
//! (`Authorization`, `Cookie`) are those of the request being explained:
//! give them as extra query parameters (`&accept=application/json`). The
//! `vary` headers of the admin request itself count too, unless a
//! parameter names them; its `Authorization` never does (it carries the
//! admin token).

pub mod cli;

use crate::bloom::Blooms;
use crate::config::route::Segment;
use crate::config::{Config, Route, RouteMatch};
use crate::keys::{self, CacheKey};
use crate::pipeline::entry::Entry;
use crate::pipeline::lookup::{check_entry, Verdict};
use crate::pipeline::publish::now_ms;
use crate::store::bloom::BloomAnswer;
use crate::store::{GuardedStore, Inspection, Snapshot};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Method;
use serde_json::{json, Value};
use std::time::Duration;

/// Why a lookup cannot be explained at all (answered 400).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExplainError {
    #[error("?url= is required: the path (and query) to explain, like /api/items/1?x=2")]
    MissingUrl,
    #[error("url {0:?} is not a path like /api/items/1 or an http:// URL")]
    BadUrl(String),
    #[error("parameter {0:?} is not a valid header name or value")]
    BadHeader(String),
}

/// The request to explain: a path with its query, and its headers.
#[derive(Debug)]
pub(crate) struct Subject {
    pub path_and_query: String,
    pub headers: HeaderMap,
}

impl Subject {
    /// From the admin request's query (`url=...` plus one parameter per
    /// header) and headers (only the route's `vary` ones are taken later).
    pub(crate) fn from_query(query: Option<&str>) -> Result<Subject, ExplainError> {
        let mut url = None;
        let mut headers = HeaderMap::new();
        for (name, value) in form_urlencoded(query.unwrap_or("")) {
            if name == "url" {
                url = Some(value);
                continue;
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ExplainError::BadHeader(name.clone()))?;
            let value =
                HeaderValue::from_str(&value).map_err(|_| ExplainError::BadHeader(name.clone()))?;
            headers.append(header, value);
        }
        let url = url
            .filter(|u| !u.is_empty())
            .ok_or(ExplainError::MissingUrl)?;
        let uri: http::Uri = url.parse().map_err(|_| ExplainError::BadUrl(url.clone()))?;
        let path_and_query = uri
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .filter(|pq| pq.starts_with('/'))
            .ok_or(ExplainError::BadUrl(url))?;
        Ok(Subject {
            path_and_query,
            headers,
        })
    }

    fn path(&self) -> &str {
        self.path_and_query
            .split_once('?')
            .map_or(self.path_and_query.as_str(), |(p, _)| p)
    }

    fn query(&self) -> Option<&str> {
        self.path_and_query.split_once('?').map(|(_, q)| q)
    }
}

/// `name=value&...` decoded (`+` is a space, `%XX` a byte).
fn form_urlencoded(query: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let pair = bytes
                .get(i + 1)
                .copied()
                .and_then(hex)
                .zip(bytes.get(i + 2).copied().and_then(hex));
            match (bytes[i], pair) {
                (b'+', _) => out.push(b' '),
                (b'%', Some((hi, lo))) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                (b, _) => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(n).to_ascii_lowercase(), decode(v))
        })
        .collect()
}

/// Everything the explanation reads from.
pub(crate) struct Sources<'a> {
    pub cfg: &'a Config,
    pub store: &'a GuardedStore,
    pub blooms: &'a Blooms,
    /// The admin request's own headers (`vary` ones are used).
    pub admin_headers: &'a HeaderMap,
}

/// The explanation as JSON (docs/operations.md#explain-one-url).
pub(crate) async fn explain(src: &Sources<'_>, subject: &Subject) -> Value {
    let cfg = src.cfg;
    let path = subject.path();
    let mut out = json!({
        "url": subject.path_and_query,
        "method": "GET",
    });
    let (route, params) = match cfg.routes.classify(&Method::GET, path) {
        RouteMatch::Read(route, params) => (route, params),
        RouteMatch::BadParam(route, param) => {
            out["route"] = json!(route.name);
            out["template"] = json!(route.template);
            out["verdict"] = json!("400");
            out["why"] = json!(format!(
                "path parameter {param:?} = {:?} does not match its pattern {:?}",
                param_value(&route, path, &param).unwrap_or_default(),
                pattern_of(&route, &param)
            ));
            return out;
        }
        RouteMatch::Write(..) | RouteMatch::Forward => {
            out["route"] = Value::Null;
            out["verdict"] = json!("FORWARD");
            out["why"] = json!("no cache route matches a GET of this path: forwarded untouched");
            out["routes"] = Value::Array(
                cfg.routes
                    .routes
                    .iter()
                    .map(|r| json!({"route": r.name, "template": r.template, "why_not": why_not(r, path)}))
                    .collect(),
            );
            return out;
        }
    };
    out["route"] = json!(route.name);
    out["template"] = json!(route.template);
    out["params"] = Value::Object(
        route
            .params
            .iter()
            .zip(&params)
            .map(|(p, v)| (p.name.clone(), json!(v)))
            .collect(),
    );
    let learned = crate::pipeline::vary::learned(src.store, cfg, &route, &params).await;
    let headers = request_headers(&route, subject, &learned, src.admin_headers);
    let key = keys::cache_key(
        &cfg.store.namespace,
        &route,
        &params,
        subject.query(),
        &learned,
        &headers,
    );
    out["identity"] = json!(key.identity);
    out["variant"] = json!(key.variant);
    out["normalized_query"] = json!(key.query);
    // `vary_from_origin`: the names learned from the object's answers
    // (null on other routes), whose values are in `vary` below as well.
    out["learned_vary"] = match route.origin_vary {
        Some(_) => json!(learned.iter().map(|n| n.as_str()).collect::<Vec<_>>()),
        None => Value::Null,
    };
    out["vary"] = Value::Object(
        route
            .vary
            .iter()
            .chain(&learned)
            .map(|h| {
                let v: Vec<String> = headers
                    .get_all(h)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                (h.as_str().to_owned(), json!(v))
            })
            .collect(),
    );
    out["keys"] = json!({
        "entry": key.keys.entry(),
        "generation": key.keys.generation(),
        "lease": key.keys.lease(),
    });
    let bypass = bypass_reason(&route, &headers, subject.query());
    out["bypass"] = json!(bypass);

    let inspection = src.store.inspect(&key.keys).await;
    let near = near_json(src, &key, inspection.as_ref().ok());
    out["near_cache"] = near;
    out["bloom"] = bloom_json(src, &route, &params).await;
    let inspection = match inspection {
        Ok(i) => i,
        Err(e) => {
            out["store"] = json!(format!("unavailable: {e}"));
            out["verdict"] = json!(if bypass.is_some() {
                "BYPASS"
            } else {
                "DEGRADED"
            });
            out["why"] = json!(bypass.unwrap_or_else(|| format!(
                "the store cannot be read ({e}): a GET goes to the upstream, nothing is cached"
            )));
            return out;
        }
    };
    out["store"] = json!("ok");
    out["generation"] = json!({
        "current": inspection.generation.as_ref().map(|(g, _)| text(g)),
        "ttl_ms": inspection.generation.as_ref().map(|(_, t)| ttl_ms(*t)),
    });
    out["lease"] = match &inspection.lease {
        Some((owner, ttl)) => json!({
            "held": true,
            "owner": text(owner),
            "by": text(owner).rsplit_once('/').map(|(who, _)| who.to_owned()),
            "ttl_ms": ttl_ms(*ttl),
        }),
        None => json!({"held": false}),
    };
    let now = now_ms();
    let (mut entry_json, mut verdict, mut why) = judge(&route, &key, &inspection, now);
    // A servable tagged entry is served only while its tags are current.
    let stamped = inspection
        .entry
        .as_ref()
        .and_then(|(raw, _)| Entry::decode(raw).ok())
        .map(|e| e.tags)
        .unwrap_or_default();
    if !stamped.is_empty() {
        let current = src.store.tags_current(&stamped).await;
        entry_json["tags"] = json!(stamped.iter().map(|(k, _)| text(k)).collect::<Vec<_>>());
        entry_json["tags_current"] = json!(current.as_ref().ok());
        if matches!(verdict.as_str(), "HIT" | "NEGATIVE" | "STALE") && !matches!(current, Ok(true))
        {
            verdict = "MISS".into();
            why = "a tag the entry carries was invalidated since it was stored (or cannot be read): never served".into();
            entry_json["servable"] = json!(false);
        }
    }
    out["entry"] = entry_json;
    let (verdict, why) = match bypass {
        Some(reason) => ("BYPASS".to_owned(), reason),
        None if verdict == "MISS" && out["bloom"]["answer"] == "absent" => (
            "BLOOM".to_owned(),
            "no entry, and the Bloom filter says the id certainly does not exist: 404".to_owned(),
        ),
        None => (verdict, why),
    };
    let why = match (&inspection.lease, verdict.as_str()) {
        (Some(_), "MISS") => format!(
            "{why}; a fill holds the lease, so a GET would wait for it (up to {:?})",
            route.wait
        ),
        _ => why,
    };
    out["verdict"] = json!(verdict);
    out["why"] = json!(why);
    out
}

/// The headers of the explained request: the query's, then the admin
/// request's `vary` (and learned) headers that the query does not name (never its
/// `Authorization`, which carries the admin token).
fn request_headers(
    route: &Route,
    subject: &Subject,
    learned: &[http::HeaderName],
    admin: &HeaderMap,
) -> HeaderMap {
    let mut headers = subject.headers.clone();
    for name in route.vary.iter().chain(learned) {
        if headers.contains_key(name) || name == http::header::AUTHORIZATION {
            continue;
        }
        for v in admin.get_all(name) {
            headers.append(name.clone(), v.clone());
        }
    }
    headers
}

fn bypass_reason(route: &Route, headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    for h in [http::header::AUTHORIZATION, http::header::COOKIE] {
        if headers.contains_key(&h) && !route.varies_on(&h) {
            return Some(format!(
                "the request carries {h} and the route does not list it in vary: forwarded uncached"
            ));
        }
    }
    keys::has_unlisted_param(&route.query, &route.query_ignore, query).then(|| {
        "the query names a parameter outside the route's query list: forwarded uncached".to_owned()
    })
}

/// The entry as JSON, and what a GET would get from it now.
fn judge(route: &Route, key: &CacheKey, found: &Inspection, now: u64) -> (Value, String, String) {
    let Some((raw, entry_ttl)) = &found.entry else {
        let why = "no entry for this variant: a GET fills it from the upstream";
        return (json!({"exists": false}), "MISS".into(), why.into());
    };
    let mut json = json!({
        "exists": true,
        "bytes_stored": raw.len(),
        "ttl_ms": ttl_ms(*entry_ttl),
    });
    let entry = match Entry::decode(raw) {
        Ok(e) => e,
        Err(e) => {
            json["decodes"] = json!(false);
            let why = format!("the entry is corrupt ({}): a GET removes it and fills", e.0);
            return (json, "MISS".into(), why);
        }
    };
    json["decodes"] = json!(true);
    json["status"] = json!(entry.status);
    json["negative"] = json!(entry.negative);
    json["body_bytes"] = json!(entry.body.len());
    json["age_s"] = json!(now.saturating_sub(entry.stored_at_ms) / 1000);
    json["fresh_for_ms"] = json!(entry.fresh_until_ms as i64 - now as i64);
    json["grace_ms"] = json!(entry.grace_ms);
    json["stale_if_error_ms"] = json!(entry.stale_if_error_ms);
    json["stamped_generation"] = json!(text(&entry.generation));
    let current = found.generation.as_ref().map(|(g, _)| g.clone());
    json["generation_current"] = json!(current.as_ref() == Some(&entry.generation));
    let snapshot = Snapshot {
        entry: Some(raw.clone()),
        generation: current.clone(),
        memo: None,
    };
    let (verdict, why) = match check_entry(snapshot, key) {
        Verdict::Corrupt(why, _) => ("MISS", format!("the entry does not belong here ({why}): a GET removes it and fills")),
        Verdict::Miss(_) if current.is_none() => (
            "MISS",
            "the generation key is gone (evicted, restart, DEL): the entry cannot be proven current and is never served".into(),
        ),
        Verdict::Miss(_) => (
            "MISS",
            "the entry's generation is not current (invalidated since it was stored): never served".into(),
        ),
        Verdict::Hit(e) if !e.expired(now) => (
            if e.negative { "NEGATIVE" } else { "HIT" },
            format!("a current, fresh entry: served for another {} ms", e.fresh_until_ms - now),
        ),
        Verdict::Hit(e) if e.within_grace(now) => (
            "STALE",
            "expired but within grace: served at once while one background refresh runs".into(),
        ),
        Verdict::Hit(e) if e.within_stale_if_error(now) => (
            "MISS",
            format!(
                "expired (grace {:?} spent): a GET refills; if that fails, the entry answers STALE (stale_if_error)",
                route.grace
            ),
        ),
        Verdict::Hit(e) if revalidatable(route, &e) => (
            "MISS",
            "expired: a GET revalidates it (If-None-Match / If-Modified-Since from the entry; a 304 refreshes it)".into(),
        ),
        Verdict::Hit(_) => ("MISS", "expired: a GET refills it".into()),
    };
    json["servable"] = json!(matches!(verdict, "HIT" | "NEGATIVE" | "STALE"));
    (json, verdict.into(), why)
}

/// Whether a fill would revalidate `entry` (it is of the current
/// generation here, so the ticket will match).
fn revalidatable(route: &Route, entry: &Entry) -> bool {
    crate::pipeline::revalidate::Validators::of(entry, &entry.generation, route).is_some()
}

fn near_json(src: &Sources<'_>, key: &CacheKey, store: Option<&Inspection>) -> Value {
    let enabled = src
        .cfg
        .store
        .redis
        .as_ref()
        .is_some_and(|r| r.near_cache.is_some());
    if !enabled {
        return json!({"enabled": false});
    }
    match src.store.peek_near(&key.keys) {
        None => json!({"enabled": true, "present": false}),
        Some(snap) => {
            let same = store.map(|i| {
                i.entry.as_ref().map(|(e, _)| e) == snap.entry.as_ref()
                    && i.generation.as_ref().map(|(g, _)| g) == snap.generation.as_ref()
            });
            json!({"enabled": true, "present": true, "agrees_with_store": same})
        }
    }
}

async fn bloom_json(src: &Sources<'_>, route: &Route, params: &[String]) -> Value {
    let Some(bloom) = route.bloom.as_ref() else {
        return Value::Null;
    };
    let answer = match src.blooms.peek(src.cfg, route, bloom, params).await {
        Ok(BloomAnswer::Absent) => "absent",
        Ok(BloomAnswer::Maybe) => "maybe",
        Ok(BloomAnswer::Unknown) => "unknown",
        Err(_) => "error",
    };
    json!({
        "scope": bloom.scope_value(params),
        "id": params.get(bloom.id_param),
        "answer": answer,
    })
}

/// Why `route` does not match `path` (for a request no route takes).
pub(crate) fn why_not(route: &Route, path: &str) -> String {
    if !route.is_cache_method(&Method::GET) {
        return "GET is not in its methods".into();
    }
    let parts: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    if parts.len() != route.segments.len() {
        return format!(
            "{} path segments, the template has {}",
            parts.len(),
            route.segments.len()
        );
    }
    for (i, (seg, part)) in route.segments.iter().zip(&parts).enumerate() {
        match seg {
            Segment::Literal(lit) if lit != part => {
                return format!("segment {} is {part:?}, the template has {lit:?}", i + 1)
            }
            Segment::Param(p) if !route.params[*p].pattern.is_match(part) => {
                let param = &route.params[*p];
                return format!(
                    "param {} = {part:?} does not match {:?}",
                    param.name,
                    pattern_of(route, &param.name)
                );
            }
            _ => {}
        }
    }
    "it matches".into()
}

fn param_value(route: &Route, path: &str, param: &str) -> Option<String> {
    let parts: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    route
        .segments
        .iter()
        .zip(parts)
        .find_map(|(seg, part)| match seg {
            Segment::Param(p) if route.params[*p].name == param => Some(part.to_owned()),
            _ => None,
        })
}

/// A param's pattern as configured (stored anchored).
fn pattern_of(route: &Route, param: &str) -> String {
    route
        .params
        .iter()
        .find(|p| p.name == param)
        .map(|p| {
            let s = p.pattern.as_str();
            s.strip_prefix("^(?:")
                .and_then(|s| s.strip_suffix(")$"))
                .unwrap_or(s)
                .to_owned()
        })
        .unwrap_or_default()
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ttl_ms(ttl: Option<Duration>) -> Value {
    match ttl {
        Some(d) => json!(d.as_millis() as u64),
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> std::sync::Arc<Route> {
        crate::config::testing::route(
            "  - name: app\n    path: /api/tenants/{tenant}/apps/{id}\n    params: { tenant: \"[a-z]+\", id: \"[1-9][0-9]*\" }\n    ttl: 1s\n",
        )
    }

    #[test]
    fn says_why_a_route_does_not_match() {
        let r = route();
        assert_eq!(
            why_not(&r, "/api/tenants/acme/apps"),
            "4 path segments, the template has 5"
        );
        assert_eq!(
            why_not(&r, "/api/tenants/acme/app/1"),
            "segment 4 is \"app\", the template has \"apps\""
        );
        assert_eq!(
            why_not(&r, "/api/tenants/ACME/apps/1"),
            "param tenant = \"ACME\" does not match \"[a-z]+\""
        );
        assert_eq!(why_not(&r, "/api/tenants/acme/apps/1"), "it matches");
    }

    #[test]
    fn subject_from_the_admin_query() {
        let s = Subject::from_query(Some(
            "url=%2Fapi%2Fx%3Fb%3D2%26a%3D1&Accept=application%2Fjson&x-a=1+2",
        ))
        .expect("valid");
        assert_eq!(s.path_and_query, "/api/x?b=2&a=1");
        assert_eq!(s.path(), "/api/x");
        assert_eq!(s.query(), Some("b=2&a=1"));
        assert_eq!(s.headers.get("accept").expect("accept"), "application/json");
        assert_eq!(s.headers.get("x-a").expect("x-a"), "1 2");
        let abs = Subject::from_query(Some("url=http://h:1/p")).expect("valid");
        assert_eq!(abs.path_and_query, "/p");
        for bad in [
            None,
            Some(""),
            Some("url="),
            Some("url=nope"),
            Some("url=/a&bad%20name=1"),
        ] {
            assert!(Subject::from_query(bad).is_err(), "{bad:?}");
        }
    }
}
