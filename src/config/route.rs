//! Route templates (`/api/tenants/{tenant}/apps/{id}`), their anchored param
//! patterns, and the route table that decides, per request, whether it is a
//! cache read, a write on a cached object, a bad request, or plain forwarding.

use http::Method;
use regex::Regex;
use std::sync::Arc;
use std::time::Duration;

/// One path segment of a template.
#[derive(Debug, Clone)]
pub enum Segment {
    Literal(String),
    /// Index into [`Route::params`].
    Param(usize),
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    /// Anchored: `^(?:pattern)$`.
    pub pattern: Regex,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryMode {
    /// The whole query, parameters sorted, is part of the key.
    Include,
    /// The query is dropped from the key and from the fill request.
    Ignore,
    /// Only these parameters (sorted) are kept, in the key and the fill request.
    Allow(Vec<String>),
}

/// A validated cache rule.
#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub template: String,
    pub segments: Vec<Segment>,
    pub params: Vec<Param>,
    pub methods: Vec<Method>,
    pub query: QueryMode,
    /// Lower-case header names whose values are part of the variant.
    pub vary: Vec<http::HeaderName>,
    pub ttl: Duration,
    pub jitter: Duration,
    pub negative_ttl: Duration,
    /// After expiry, how long an entry (still of the current generation)
    /// is served `STALE` at once while one background refresh runs.
    pub grace: Duration,
    /// After expiry, how long an entry (still of the current generation)
    /// answers instead of a failed refill.
    pub stale_if_error: Duration,
    pub cache_status: Vec<u16>,
    pub negative_status: Vec<u16>,
    pub lease: Duration,
    pub wait: Duration,
    pub invalidate_on_write: bool,
    /// Stage 4: the route's Bloom filter, if configured.
    pub bloom: Option<super::bloom::BloomConfig>,
    /// `Host` on fill requests; `None`: the upstream's authority.
    pub host: Option<http::HeaderValue>,
    /// Client headers copied onto fill requests besides `vary` (lower case).
    pub fill_headers: Vec<http::HeaderName>,
    /// Whether the origin's `Cache-Control` freshness and `Vary` may refuse
    /// storing an answer.
    pub origin_cache_control: OriginCacheControl,
    /// Upstream fetches for fills this route may run at once, within
    /// `fill.max_concurrency`.
    pub fill_budget: usize,
}

/// `origin_cache_control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginCacheControl {
    /// `no-cache`, zero `max-age`/`s-maxage` and a `Vary` outside the key
    /// keep an answer out of the cache.
    Honor,
    /// The route owner promises the service never varies silently: only
    /// `no-store`, `private` and `Set-Cookie` keep an answer out.
    Ignore,
}

impl Route {
    /// How long an entry is kept after it expires: the wider stale window.
    pub fn stale_keep(&self) -> Duration {
        self.grace.max(self.stale_if_error)
    }

    pub fn varies_on(&self, name: &http::HeaderName) -> bool {
        self.vary.iter().any(|v| v == name)
    }

    /// Matches `path` against the template. `None`: the shape differs.
    /// `Some(Err(param))`: shape matches but `param` fails its pattern.
    pub fn match_path<'p>(&self, path: &'p str) -> Option<Result<Vec<&'p str>, &str>> {
        let rest = path.strip_prefix('/')?;
        let mut values: Vec<&'p str> = Vec::with_capacity(self.params.len());
        let mut parts = rest.split('/');
        for seg in &self.segments {
            let part = parts.next()?;
            match seg {
                Segment::Literal(lit) if lit == part => {}
                Segment::Literal(_) => return None,
                Segment::Param(_) => values.push(part),
            }
        }
        if parts.next().is_some() {
            return None;
        }
        for (param, value) in self.params.iter().zip(&values) {
            if !param.pattern.is_match(value) {
                return Some(Err(param.name.as_str()));
            }
        }
        Some(Ok(values))
    }

    pub fn is_cache_method(&self, m: &Method) -> bool {
        self.methods.contains(m)
    }
}

/// What the route table says about one request.
#[derive(Debug)]
pub enum RouteMatch<'p> {
    /// A cache read: method listed, path and params valid.
    Read(Arc<Route>, Vec<&'p str>),
    /// A non-read method on a cached object's path (write-through candidate).
    Write(Arc<Route>, Vec<&'p str>),
    /// Method listed, template matches, a param fails its pattern: 400.
    BadParam(Arc<Route>, String),
    /// Not ours: forward untouched.
    Forward,
}

#[derive(Debug, Default)]
pub struct RouteTable {
    pub routes: Vec<Arc<Route>>,
}

impl RouteTable {
    pub fn find(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.name == name)
    }

    pub fn classify<'p>(&self, method: &Method, path: &'p str) -> RouteMatch<'p> {
        for route in &self.routes {
            let Some(m) = route.match_path(path) else {
                continue;
            };
            let is_read = route.is_cache_method(method);
            return match (m, is_read) {
                (Ok(values), true) => RouteMatch::Read(route.clone(), values),
                (Err(param), true) => RouteMatch::BadParam(route.clone(), param.to_owned()),
                (Ok(values), false) if is_write_method(method) => {
                    RouteMatch::Write(route.clone(), values)
                }
                // A write with a bad param, or another method: the route has
                // nothing to say; keep looking in case another route matches.
                _ => continue,
            };
        }
        RouteMatch::Forward
    }
}

/// Unsafe methods, whose success invalidates the object (RFC 9111 §4.4):
/// every method but the safe ones, so methods whose safety is unknown
/// (extensions such as `M-SEARCH` or WebDAV's) count as unsafe too.
pub fn is_write_method(m: &Method) -> bool {
    !matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Parses a template into segments and param names (in order).
pub fn parse_template(template: &str) -> Result<(Vec<Segment>, Vec<String>), String> {
    let rest = template
        .strip_prefix('/')
        .ok_or_else(|| format!("template {template:?} must start with '/'"))?;
    let mut segments = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for part in rest.split('/') {
        if let Some(inner) = part.strip_prefix('{') {
            let name = inner
                .strip_suffix('}')
                .ok_or_else(|| format!("segment {part:?} opens '{{' but does not close it"))?;
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "param name {name:?} must be non-empty letters, digits or '_'"
                ));
            }
            if names.iter().any(|n| n == name) {
                return Err(format!("param {name:?} appears twice"));
            }
            segments.push(Segment::Param(names.len()));
            names.push(name.to_owned());
        } else if part.contains(['{', '}']) {
            return Err(format!(
                "segment {part:?}: a param must be a whole segment like {{id}}"
            ));
        } else if part.is_empty() && segments.is_empty() && rest.is_empty() {
            // "/" alone: one empty literal segment, matches "/" only.
            segments.push(Segment::Literal(String::new()));
        } else {
            segments.push(Segment::Literal(part.to_owned()));
        }
    }
    Ok((segments, names))
}

/// True if some request path could match both routes with a shared method.
pub fn overlaps(a: &Route, b: &Route) -> bool {
    if !a.methods.iter().any(|m| b.methods.contains(m)) {
        return false;
    }
    if a.segments.len() != b.segments.len() {
        return false;
    }
    a.segments
        .iter()
        .zip(&b.segments)
        .all(|(x, y)| match (x, y) {
            (Segment::Literal(l), Segment::Literal(r)) => l == r,
            (Segment::Literal(l), Segment::Param(i)) => b.params[*i].pattern.is_match(l),
            (Segment::Param(i), Segment::Literal(r)) => a.params[*i].pattern.is_match(r),
            // Two regexes may or may not intersect; call it ambiguous.
            (Segment::Param(_), Segment::Param(_)) => true,
        })
}
