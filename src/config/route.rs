//! Route templates (`/api/tenants/{tenant}/apps/{id}`, `/static/{path...}`),
//! their anchored param patterns, and the route table that decides, per
//! request, whether it is a cache read, a write on a cached object, a bad
//! request, or plain forwarding. Templates are matched against the path's
//! normal form ([`super::path`]), never its raw text.

use super::path;
use super::pattern::ParamPattern;
use http::Method;
use std::sync::Arc;
use std::time::Duration;

/// One path segment of a template.
#[derive(Debug, Clone)]
pub enum Segment {
    Literal(String),
    /// Index into [`Route::params`].
    Param(usize),
    /// `{name...}`, always the last segment: the rest of the path (one or
    /// more segments). Index into [`Route::params`].
    Prefix(usize),
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    /// Anchored: `^(?:pattern)$`.
    pub pattern: ParamPattern,
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
    /// Parameters dropped from the key and the fill, never a bypass reason.
    pub query_ignore: super::query_ignore::QueryIgnore,
    /// Lower-case header names whose values are part of the variant.
    pub vary: Vec<http::HeaderName>,
    pub ttl: Ttl,
    pub jitter: Duration,
    pub negative_ttl: Duration,
    /// After expiry, how long an entry (still of the current generation)
    /// is served `STALE` at once while one background refresh runs.
    pub grace: Duration,
    /// `ttl: origin`: how wide a stale window the origin's own
    /// `stale-while-revalidate` may open (zero: it can only narrow `grace`).
    pub max_grace: Duration,
    /// After expiry, how long an entry (still of the current generation)
    /// answers instead of a failed refill.
    pub stale_if_error: Duration,
    /// After expiry, how long an entry with validators (`ETag`,
    /// `Last-Modified`) stays in the store so that a fill can revalidate it
    /// with a conditional request instead of fetching the whole body.
    pub keep: Duration,
    /// Hit-for-pass: how long an object variant whose fill's answer could
    /// not be stored for a reason of its own is forwarded without a fill
    /// (zero: off).
    pub hit_for_pass: Duration,
    /// With the store unreachable, a miss joins the object's running
    /// degraded fetch only if it started less than this ago (zero: never).
    pub degraded_join_window: Duration,
    pub cache_status: Vec<u16>,
    /// `ttl: origin` without `cache_status`: an answer of any other status
    /// (206 and 304 aside) is stored too when it gives explicit freshness.
    pub fresh_any_status: bool,
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
    /// Stage 8 reads the answer's `CDN-Cache-Control` (RFC 9213), when it
    /// is present and valid, in place of its `Cache-Control`.
    pub cdn_cache_control: bool,
    /// `vary_from_origin`: each object's variants are also keyed on the
    /// request headers its answers name in `Vary` (learned per object).
    pub origin_vary: Option<OriginVary>,
    /// Upstream fetches for fills this route may run at once, within
    /// `fill.max_concurrency`.
    pub fill_budget: usize,
    /// The `Cache-Control` clients receive with answers from the cache.
    pub client_cache_control: ClientCacheControl,
    /// Whether entries without an origin `ETag` get a derived one.
    pub etag: EtagMode,
    /// Objects of other routes an event for this route invalidates too
    /// (transitively; validated acyclic).
    pub also_invalidates: Vec<super::relations::Relation>,
    /// Response header whose values tag the entry (`Surrogate-Key`).
    pub tags_from: Option<http::HeaderName>,
    /// Response header with the answer's version, compared with the
    /// object's floor before publishing.
    pub version_from: Option<http::HeaderName>,
    /// This route's request counters, looked up once (not config).
    pub counters: crate::metrics::RouteCounters,
}

/// `ttl`: where an entry's freshness comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// `ttl: 60s`: every positive entry is fresh this long (+ jitter).
    Fixed(Duration),
    /// `ttl: origin`: from the answer's `s-maxage`, `max-age` or `Expires`,
    /// at most `max`; `default` when it gives none (zero: not stored).
    Origin { max: Duration, default: Duration },
}

/// The bounds of `vary_from_origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginVary {
    /// `max_vary_headers`: an answer naming more headers (beyond `vary`)
    /// is not stored.
    pub max_headers: usize,
    /// `max_vary_value`: a request with a longer value of a learned header
    /// is forwarded uncached (BYPASS).
    pub max_value: usize,
}

/// `client_cache_control`: what clients are told about keeping an answer
/// that came from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCacheControl {
    /// The origin's header as stored.
    Pass,
    /// This header instead of the origin's.
    Literal(http::HeaderValue),
    /// `max-age` set so that the client keeps it no longer than it stays
    /// fresh here.
    Remaining,
}

/// `etag`: where a stored answer's `ETag` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtagMode {
    /// The origin's, if it sent one; otherwise none.
    Origin,
    /// The origin's if it sent one, else a strong tag derived from the body
    /// (SHA-256, first 128 bits) at publish time.
    Auto,
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

impl std::fmt::Display for Ttl {
    /// `60s`, or `origin` (the caps are separate columns and fields).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ttl::Fixed(d) => write!(f, "{d:?}"),
            Ttl::Origin { .. } => f.write_str("origin"),
        }
    }
}

impl Ttl {
    /// `max_ttl` and `default_ttl` of `ttl: origin`.
    pub fn origin_caps(&self) -> Option<(Duration, Duration)> {
        match *self {
            Ttl::Fixed(_) => None,
            Ttl::Origin { max, default } => Some((max, default)),
        }
    }
}

impl std::fmt::Display for ClientCacheControl {
    /// As written in the config: `pass`, `remaining` or the literal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientCacheControl::Pass => f.write_str("pass"),
            ClientCacheControl::Remaining => f.write_str("remaining"),
            ClientCacheControl::Literal(v) => f.write_str(v.to_str().unwrap_or("?")),
        }
    }
}

impl Route {
    /// How long an entry may be kept after it expires: the widest of the
    /// stale windows and `keep`.
    pub(crate) fn stale_keep(&self) -> Duration {
        self.grace
            .max(self.max_grace)
            .max(self.stale_if_error)
            .max(self.keep)
    }

    /// The longest an entry of this route can be fresh.
    pub(crate) fn max_fresh(&self) -> Duration {
        let positive = match self.ttl {
            Ttl::Fixed(ttl) => ttl + self.jitter,
            Ttl::Origin { max, .. } => max,
        };
        positive.max(self.negative_ttl)
    }

    /// The path a fill requests: the template with `params` (normalised,
    /// in template order) filled in, which is the normal form of every path
    /// that matched with these values.
    pub(crate) fn fill_path<S: AsRef<str>>(&self, params: &[S]) -> String {
        let mut path = String::with_capacity(self.template.len() + 16);
        for seg in &self.segments {
            path.push('/');
            match seg {
                Segment::Literal(lit) => path.push_str(lit),
                Segment::Param(i) | Segment::Prefix(i) => {
                    path.push_str(params.get(*i).map_or("", |p| p.as_ref()))
                }
            }
        }
        path
    }

    /// Whether param `i` is the template's `{name...}` prefix param.
    pub(crate) fn is_prefix(&self, i: usize) -> bool {
        matches!(self.segments.last(), Some(Segment::Prefix(p)) if *p == i)
    }

    pub(crate) fn varies_on(&self, name: &http::HeaderName) -> bool {
        self.vary.iter().any(|v| v == name)
    }

    /// Matches a normalised `path` against the template. `None`: the shape
    /// differs. `Some(Err(param))`: shape matches but `param` fails its
    /// pattern.
    pub(crate) fn match_path<'p>(&self, path: &'p str) -> Option<Result<Params<'p>, &str>> {
        // `None` once the path is used up.
        let mut rest = Some(path.strip_prefix('/')?);
        // On the stack: every route tried for a request used to allocate
        // a `Vec` here, most of them only to find the shape differs.
        let mut values = Params::new();
        for seg in &self.segments {
            let remaining = rest?;
            if let Segment::Prefix(_) = seg {
                // One or more segments: `/static/` has none.
                if remaining.is_empty() {
                    return None;
                }
                values.push(remaining);
                rest = None;
                continue;
            }
            // A byte search, not `split_once('/')`: its char searcher costs
            // more to set up than the segments (a few bytes each) take to scan
            // (bench/README.md).
            let (part, tail) = match remaining.bytes().position(|b| b == b'/') {
                // `/` is ASCII: both sides are on char boundaries.
                Some(i) => (&remaining[..i], Some(&remaining[i + 1..])),
                None => (remaining, None),
            };
            rest = tail;
            match seg {
                Segment::Literal(lit) if lit == part => {}
                Segment::Literal(_) => return None,
                Segment::Param(_) | Segment::Prefix(_) => values.push(part),
            }
        }
        if rest.is_some() {
            return None;
        }
        for (param, value) in self.params.iter().zip(&values) {
            if !param.pattern.is_match(value) {
                return Some(Err(param.name.as_str()));
            }
        }
        Some(Ok(values))
    }

    pub(crate) fn is_cache_method(&self, m: &Method) -> bool {
        self.methods.contains(m)
    }
}

/// A path's param values while it is matched, in template order; inline
/// up to four (the routes seen have one to three params).
pub(crate) type Params<'p> = smallvec::SmallVec<[&'p str; 4]>;

/// What the route table says about one request. Param values are those of
/// the path's normal form, in template order.
#[derive(Debug)]
pub(crate) enum RouteMatch {
    /// A cache read: method listed, path and params valid.
    Read(Arc<Route>, Vec<String>),
    /// A non-read method on a cached object's path (write-through candidate).
    Write(Arc<Route>, Vec<String>),
    /// Method listed, template matches, a param fails its pattern: 400.
    BadParam(Arc<Route>, String),
    /// Not ours (no template matches the normal form, or the path has no
    /// trusted normal form): forward untouched.
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

    /// Classifies a request by its method and raw path; the path is
    /// normalised first ([`path::normalize`]), and one without a trusted
    /// normal form is forwarded.
    pub(crate) fn classify(&self, method: &Method, raw_path: &str) -> RouteMatch {
        let Ok(path) = path::normalize(raw_path) else {
            return RouteMatch::Forward;
        };
        let owned = |values: Params| values.iter().map(|v| (*v).to_owned()).collect();
        for route in &self.routes {
            let Some(m) = route.match_path(&path) else {
                continue;
            };
            let is_read = route.is_cache_method(method);
            return match (m, is_read) {
                (Ok(values), true) => RouteMatch::Read(route.clone(), owned(values)),
                (Err(param), true) => RouteMatch::BadParam(route.clone(), param.to_owned()),
                (Ok(values), false) if is_write_method(method) => {
                    RouteMatch::Write(route.clone(), owned(values))
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
pub(crate) fn is_write_method(m: &Method) -> bool {
    !matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Parses a template into segments and param names (in order). `{name}`
/// is one segment; `{name...}` (at most one, and only as the last segment)
/// the rest of the path. Literal segments must be in normal form
/// ([`path::is_normal_segment`]): requests are matched after normalisation,
/// so `/a//b`, `/a/./b` or `/%7euser` could never match.
pub(crate) fn parse_template(template: &str) -> Result<(Vec<Segment>, Vec<String>), String> {
    let rest = template
        .strip_prefix('/')
        .ok_or_else(|| format!("template {template:?} must start with '/'"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let prefixes: Vec<&str> = parts
        .iter()
        .copied()
        .filter(|p| p.starts_with('{') && p.ends_with("...}"))
        .collect();
    if let [first, second, ..] = prefixes[..] {
        return Err(format!(
            "two prefix params ({first} and {second}); a template has at most one, as its last segment"
        ));
    }
    let mut segments = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, part) in parts.iter().copied().enumerate() {
        let last = i + 1 == parts.len();
        if let Some(inner) = part.strip_prefix('{') {
            let name = inner
                .strip_suffix('}')
                .ok_or_else(|| format!("segment {part:?} opens '{{' but does not close it"))?;
            let (name, prefix) = match name.strip_suffix("...") {
                Some(name) => (name, true),
                None => (name, false),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "param name {name:?} must be non-empty letters, digits or '_'"
                ));
            }
            if names.iter().any(|n| n == name) {
                return Err(format!("param {name:?} appears twice"));
            }
            if prefix && !last {
                return Err(format!(
                    "prefix param {part} must be the last segment (it takes the rest of the path)"
                ));
            }
            segments.push(if prefix {
                Segment::Prefix(names.len())
            } else {
                Segment::Param(names.len())
            });
            names.push(name.to_owned());
        } else if part.contains(['{', '}']) {
            return Err(format!(
                "segment {part:?}: a param must be a whole segment like {{id}}"
            ));
        } else if part.is_empty() && (last || rest.is_empty()) {
            // "/" alone, or a trailing slash: an empty last segment, which
            // normalisation keeps.
            segments.push(Segment::Literal(String::new()));
        } else if !path::is_normal_segment(part) {
            return Err(format!(
                "segment {part:?} is not in normal form (empty, '.', '..', an encoded \
                 unreserved character or lower-case hex): request paths are normalised \
                 before matching, so it could never match"
            ));
        } else {
            segments.push(Segment::Literal(part.to_owned()));
        }
    }
    Ok((segments, names))
}

/// True if some request path could match both routes with a shared method.
/// Two params (or a param and a prefix) may or may not intersect: that
/// counts as a conflict; a literal is checked against the other's pattern.
pub(crate) fn overlaps(a: &Route, b: &Route) -> bool {
    if !a.methods.iter().any(|m| b.methods.contains(m)) {
        return false;
    }
    let mut i = 0;
    loop {
        match (a.segments.get(i), b.segments.get(i)) {
            (None, None) => return true,
            (Some(Segment::Prefix(p)), Some(_)) => return rest_may_match(a, *p, b, i),
            (Some(_), Some(Segment::Prefix(p))) => return rest_may_match(b, *p, a, i),
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(x), Some(y)) => {
                let may = match (x, y) {
                    (Segment::Literal(l), Segment::Literal(r)) => l == r,
                    (Segment::Literal(l), Segment::Param(j)) => b.params[*j].pattern.is_match(l),
                    (Segment::Param(j), Segment::Literal(r)) => a.params[*j].pattern.is_match(r),
                    _ => true,
                };
                if !may {
                    return false;
                }
            }
        }
        i += 1;
    }
}

/// Whether `route`'s prefix param `p` could take the segments of `other`
/// from index `from` on: only all-literal tails can be checked.
fn rest_may_match(route: &Route, p: usize, other: &Route, from: usize) -> bool {
    let mut tail = Vec::new();
    for seg in &other.segments[from..] {
        match seg {
            Segment::Literal(l) => tail.push(l.as_str()),
            Segment::Param(_) | Segment::Prefix(_) => return true,
        }
    }
    let tail = tail.join("/");
    !tail.is_empty() && route.params[p].pattern.is_match(&tail)
}
