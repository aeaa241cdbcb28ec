//! The read pipeline for requests that match a cache route
//! (docs/architecture.md#read-pipeline). Each stage is a named function in its
//! own file; this file is the chart that chooses between them
//! ([`Pipeline::try_hit`] for a near-cache hit, else `serve`: stage 0, then
//! `serve_keyed` for stages 1-3 and `serve_missed` for 3a-10), and `filler` runs
//! a fill once one is chosen (stages 5-9):
//!
//! ```text
//! 0 validate + bypass   (route match in server; bypass() here)
//! 1 key                 keys::cache_key
//! 2 read, 3 hit check   lookup::lookup = store read + lookup::check_entry
//!   3a pass             pass::PassMarkers: an object variant whose answers
//!                       are not stored for a reason of its own is
//!                       forwarded (hit-for-pass), no fill
//!   3b stale            stale: expired but current entry; grace answers it
//!                       at once + stale::refresh in the background;
//!                       stale-if-error keeps it for a failed refill
//! 4 bloom               bloom::stage (miss only, routes with `bloom`)
//! 5 coalesce + lease    filler::join: flight::Flights (in-process, per
//!                       generation read), lease::acquire (across
//!                       instances; takes the ticket)
//! 6 double-check        lookup::lookup again under the lease
//! 7 fetch               fill::fetch under fill::FillPermits; conditional
//!                       (revalidate) when the entry of the fill's
//!                       generation is expired and has validators; a
//!                       shareable answer streams to the flight's waiters
//!                       as it arrives (tee, flight::Streaming)
//!   7b degraded         filler::fetch_only: same permits, nothing written;
//!                       joined only while younger than the route's
//!                       degraded_join_window
//! 8 publish             publish::cacheability, GuardedStore::publish_checked;
//!                       depends: version floor and cache tags
//! 9 release             lease::release
//! 10 answer             answer::respond (from an entry), answer::to_client
//!                       (from a fill's answer); client_cc: the route's
//!                       client_cache_control;
//!                       answer::shape: the client's preconditions
//!                       (conditional) and range (range) against the entry
//! ```
//! [`CacheOutcome`] is the result of every request: the `X-Cache` header,
//! the metric label and the log field; with the [`Facts`] the answering
//! stage adds, the `Cache-Status` header (`cache_status`).

pub(crate) mod answer;
pub(crate) mod bloom;
pub(crate) mod cache_control;
pub(crate) mod cache_status;
pub(crate) mod client_cc;
pub(crate) mod conditional;
pub(crate) mod depends;
pub(crate) mod entry;
pub(crate) mod etag;
pub(crate) mod fill;
mod filler;
pub(crate) mod flight;
pub(crate) mod lease;
pub(crate) mod lookup;
pub(crate) mod pass;
pub(crate) mod publish;
pub(crate) mod range;
pub(crate) mod revalidate;
pub(crate) mod stale;
pub(crate) mod tee;
pub(crate) mod vary;

use crate::bloom::Blooms;
use crate::body::Body;
use crate::config::{Config, Route};
use crate::error::ProxyError;
use crate::keys::{self, CacheKey};
use crate::metrics::Metrics;
use crate::outcome::{CacheOutcome, X_CACHE};
use crate::proxy::client::UpstreamClient;
use crate::proxy::upload::UploadBody;
use crate::store::GuardedStore;
use answer::{hit_status, respond, respond_with, to_client, ClientAsk, Shaped};
use cache_status::{Facts, Fwd};
use entry::Entry;
use fill::FillPermits;
use filler::{Fill, Shared};
use flight::Answer;
use flight::Flights;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response};
use hyper::body::Incoming;
use lookup::Found;
use stale::{AfterFailure, StaleReason};
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    flights: Arc<Flights>,
}

/// One cache read past stage 0, as the stages after it see it: borrowed
/// from `serve_inner`'s frame, so nothing is copied per stage or per
/// keying (a fill copies what it keeps).
struct CacheRead<'a> {
    cfg: &'a Arc<Config>,
    route: &'a Arc<Route>,
    /// The raw path param values, in template order.
    params: &'a [String],
    /// The request's head; its body is kept apart, or dropped.
    head: &'a http::request::Parts,
    /// Stage 10's input.
    ask: &'a ClientAsk,
}

/// What [`Pipeline::try_hit`] did on its way to a miss, handed to
/// [`Pipeline::serve`] so that it is not done twice. Boxed where it is
/// passed: the futures it goes through are moved whole.
pub(crate) struct Early {
    key: CacheKey,
    near: lookup::Near,
}

/// What stages 2 + 3 found when it was not a fresh entry.
struct Missed {
    /// The store could not be read.
    degraded: bool,
    /// Of the current generation, past its freshness.
    expired: Option<Arc<Entry>>,
    /// The object's generation as read (none: the key is missing).
    read_generation: Option<bytes::Bytes>,
}

/// What [`Pipeline::serve_keyed`] did with one key.
enum Keyed {
    Served(CacheOutcome, Facts, Response<Body>),
    /// `vary_from_origin`: the answer varies on names the key did not
    /// include and is not this client's variant: key again with these.
    Relearn(Vec<HeaderName>),
    /// Hit-for-pass: forward the request as it came.
    Pass,
}

impl Pipeline {
    pub(crate) fn new(
        store: Arc<GuardedStore>,
        client: UpstreamClient,
        blooms: Arc<Blooms>,
        metrics: Metrics,
        cfg: &Config,
    ) -> Pipeline {
        Pipeline {
            shared: Arc::new(Shared {
                client,
                permits: FillPermits::new(&cfg.fill),
                blooms,
                store,
                metrics,
                passes: pass::PassMarkers::default(),
            }),
            flights: Arc::new(Flights::default()),
        }
    }

    /// Applies limits from a reloaded config (fill permits; route budgets
    /// are read from the route at each fill) and logs its warnings.
    pub(crate) fn reconfigure(&self, cfg: &Config) {
        self.shared.permits.reconfigure(&cfg.fill);
        for w in &cfg.warnings {
            tracing::warn!(path = %w.path, "config: {}", w.message);
        }
    }

    /// A fresh hit from the near cache, answered without waiting: the
    /// stages [`Pipeline::serve`] would run for it (0 bypass, 1 key, 2+3
    /// with the generation and tag checks, 10), with no future to build,
    /// box and move. `Err`: not such a hit; what was done so far, for
    /// `serve` (`None`: nothing, e.g. a bypass or a route that keys on
    /// learned `Vary` names, which needs the store first).
    pub(crate) fn try_hit(
        &self,
        cfg: &Config,
        route: &Route,
        params: &[String],
        req: &Request<Incoming>,
    ) -> Result<(CacheOutcome, Response<Body>), Option<Box<Early>>> {
        let (headers, query) = (req.headers(), req.uri().query());
        // Without a near cache every read waits for the store: nothing to
        // do here that `serve` would not then carry along for nothing.
        let store = &self.shared.store;
        if !store.has_near() || route.origin_vary.is_some() || bypass(route, headers, query) {
            return Err(None);
        }
        let ns = &cfg.store.namespace;
        let key = keys::cache_key(ns, route, params, query, &[], headers);
        match lookup::near_hit(store, &key) {
            Ok(prepared) => {
                let entry = &prepared.entry;
                let status = hit_status(entry);
                let ask = ClientAsk::from_request(req.method(), headers);
                let resp = respond_with(route, entry, prepared.head.clone(), status, &ask);
                let facts = Facts::from_entry(entry);
                Ok((status, self.finish(cfg, route, status, &facts, resp)))
            }
            Err(near) => Err(Some(Box::new(Early { key, near }))),
        }
    }

    /// Serves a cache read. `params` are the raw path param values in
    /// template order, already validated against their patterns; `early`:
    /// what [`Pipeline::try_hit`] did. Also returns what it did (the
    /// response's `X-Cache`), for the access log.
    pub(crate) async fn serve(
        &self,
        cfg: Arc<Config>,
        route: Arc<Route>,
        params: Vec<String>,
        req: Request<Incoming>,
        peer: SocketAddr,
        early: Option<Box<Early>>,
    ) -> (CacheOutcome, Response<Body>) {
        let (status, facts, resp) = self
            .serve_inner(&cfg, &route, params, req, peer, early)
            .await;
        (status, self.finish(&cfg, &route, status, &facts, resp))
    }

    /// Every answer's `X-Cache`, `Cache-Status` and counters.
    fn finish(
        &self,
        cfg: &Config,
        route: &Route,
        status: CacheOutcome,
        facts: &Facts,
        mut resp: Response<Body>,
    ) -> Response<Body> {
        // An answer sidecache made itself (502, 504, 503) came from no
        // service: no `fwd-status`, and the reason as `detail`.
        let facts = match resp.extensions().get::<crate::error::SelfMade>() {
            Some(made) => &Facts {
                fwd_status: None,
                detail: Some(made.0),
                ..*facts
            },
            None => facts,
        };
        let value = cache_status::value(&cfg.cache_name, status, facts);
        let h = resp.headers_mut();
        h.insert(X_CACHE.clone(), status.header_value());
        h.insert(cache_status::CACHE_STATUS.clone(), value);
        if let Some(shaped) = resp.extensions().get::<Shaped>() {
            self.shared
                .metrics
                .client_answers
                .with_label_values(&[&route.name, shaped.as_str()])
                .inc();
        }
        if let Some(overload) = resp.extensions().get::<crate::error::Overload>() {
            self.shared
                .metrics
                .overloaded
                .with_label_values(&[&route.name, overload.as_str()])
                .inc();
        }
        route
            .counters
            .count(&self.shared.metrics, &route.name, status);
        tracing::debug!(route = %route.name, cache = status.as_str(), status = resp.status().as_u16(), "cache read");
        resp
    }

    /// Forwards the request as it came, answered `outcome` (stage 0's
    /// bypass, a too-long learned `Vary` value, hit-for-pass).
    async fn forward_as_is(
        &self,
        cfg: &Config,
        req: Request<Incoming>,
        peer: SocketAddr,
        outcome: CacheOutcome,
    ) -> (CacheOutcome, Facts, Response<Body>) {
        let sh = &self.shared;
        let req = req.map(UploadBody::streamed);
        let timeout = cfg.upstream.timeout;
        let resp =
            crate::proxy::forward::forward(&sh.client, req, peer, timeout, &sh.metrics).await;
        (outcome, forwarded(&resp), resp)
    }

    async fn serve_inner(
        &self,
        cfg: &Arc<Config>,
        route: &Arc<Route>,
        params: Vec<String>,
        req: Request<Incoming>,
        peer: SocketAddr,
        mut early: Option<Box<Early>>,
    ) -> (CacheOutcome, Facts, Response<Body>) {
        let sh = &self.shared;
        // Stage 0: credentials that are not part of the key make the
        // response personal, and a query parameter outside the route's
        // allow-list could change the answer behind the key's back (or bust
        // the cache): forward untouched. (`early`: `try_hit` checked.)
        if early.is_none() && bypass(route, req.headers(), req.uri().query()) {
            return self
                .forward_as_is(cfg, req, peer, CacheOutcome::Bypass)
                .await;
        }
        // Stage 10's input: kept before the request is dropped for the fill.
        let ask = ClientAsk::from_request(req.method(), req.headers());
        // `vary_from_origin`: the names this object's answers vary on; on
        // other routes none, and no answer is keyed again.
        let (mut learned, mut may_relearn) = match route.origin_vary {
            Some(_) => (vary::learned(&sh.store, cfg, route, &params).await, true),
            None => (Vec::new(), false),
        };
        let (parts, body) = req.into_parts();
        // Kept while the request may still be forwarded as it came (a long
        // learned `Vary` value, hit-for-pass).
        let mut body = Some(body);
        let read = CacheRead {
            cfg,
            route,
            params: &params,
            head: &parts,
            ask: &ask,
        };
        loop {
            // A value longer than the route allows would make a variant of
            // its own per hostile client: such a request is not cached.
            let too_long = route
                .origin_vary
                .is_some_and(|b| vary::too_long(&parts.headers, &learned, b.max_value));
            if too_long {
                if let Some(body) = body.take() {
                    let req = Request::from_parts(parts, body);
                    return self
                        .forward_as_is(cfg, req, peer, CacheOutcome::Bypass)
                        .await;
                }
            }
            let keyed = self.serve_keyed(&read, learned, may_relearn, early.take());
            match keyed.await {
                Keyed::Served(status, facts, resp) => return (status, facts, resp),
                Keyed::Pass => {
                    let Some(body) = body.take() else {
                        let bug = ProxyError::Bug("pass without the request's body".into());
                        return (CacheOutcome::Pass, Facts::default(), bug.to_response());
                    };
                    let req = Request::from_parts(parts, body);
                    return self.forward_as_is(cfg, req, peer, CacheOutcome::Pass).await;
                }
                // Once: an origin that changes its `Vary` on every answer
                // gets the second answer served as it is.
                Keyed::Relearn(names) => {
                    sh.metrics
                        .vary_relearned
                        .with_label_values(&[&route.name])
                        .inc();
                    learned = names;
                    may_relearn = false;
                }
            }
        }
    }

    /// Stages 1-10 for the key built with `learned` (see [`Fill::learned`]);
    /// `early`: the key and the near cache's verdict from
    /// [`Pipeline::try_hit`].
    async fn serve_keyed(
        &self,
        read: &CacheRead<'_>,
        learned: Vec<HeaderName>,
        may_relearn: bool,
        early: Option<Box<Early>>,
    ) -> Keyed {
        let (sh, route) = (&self.shared, read.route);
        // Stage 1, unless `try_hit` did it.
        let mut early = early.unwrap_or_else(|| {
            let ns = &read.cfg.store.namespace;
            let (query, headers) = (read.head.uri.query(), &read.head.headers);
            Box::new(Early {
                key: keys::cache_key(ns, route, read.params, query, &learned, headers),
                near: lookup::Near::Unasked,
            })
        });
        // Stages 2 + 3. With the store unavailable there is no entry, so
        // nothing to serve stale either: the degraded path as before.
        let near = std::mem::take(&mut early.near);
        let found = lookup::lookup_from(&sh.store, &early.key, near, &route.name, &sh.metrics);
        let missed = match found.await {
            Ok(Found::Fresh(entry)) => {
                let status = hit_status(&entry);
                let facts = Facts::from_entry(&entry);
                return Keyed::Served(status, facts, respond(route, &entry, status, read.ask));
            }
            Ok(Found::Expired(entry)) => Missed {
                degraded: false,
                expired: Some(Arc::new(entry)),
                read_generation: None,
            },
            Ok(Found::Miss(generation)) => Missed {
                degraded: false,
                expired: None,
                read_generation: generation,
            },
            Err(e) => {
                tracing::debug!(route = %route.name, error = %e, "store read failed; degraded");
                Missed {
                    degraded: true,
                    expired: None,
                    read_generation: None,
                }
            }
        };
        // Boxed: this future is moved whole on every read, hits included,
        // and the fill's states below are most of its size.
        let rest = Box::pin(self.serve_missed(read, learned, may_relearn, early.key, missed));
        rest.await
    }

    /// Stages 3a, 3b and 4-10 for a key that found no fresh entry.
    async fn serve_missed(
        &self,
        read: &CacheRead<'_>,
        learned: Vec<HeaderName>,
        may_relearn: bool,
        key: CacheKey,
        missed: Missed,
    ) -> Keyed {
        let sh = &self.shared;
        let (cfg, route, params, ask) = (read.cfg, read.route, read.params, read.ask);
        let Missed {
            degraded,
            expired,
            read_generation,
        } = missed;
        // Hit-for-pass: this variant's answers are not stored, as its last
        // fill found for the generation this request read.
        let seen = expired.as_ref().map(|e| &e.generation);
        if let Some(generation) = seen.or(read_generation.as_ref()) {
            if sh.passes.is_marked(key.keys.entry(), generation) {
                return Keyed::Pass;
            }
        }
        // Stage 4: only on a real miss (an expired entry of the current
        // generation proves the object exists); with the store unavailable
        // the filter is too, and the degraded path takes over.
        if !degraded && expired.is_none() {
            if let Some(rejected) = bloom::stage(&sh.blooms, cfg, route, params, ask.head).await {
                return Keyed::Served(rejected.0, Facts::default(), rejected.1);
            }
        }
        // What a fill of this key needs, owned: the fill runs in its own task.
        let fill = Fill {
            shared: Arc::clone(sh),
            request: fill::fill_request(
                route,
                &route.fill_path(params),
                &key.query,
                &learned,
                &read.head.headers,
            ),
            cfg: Arc::clone(cfg),
            route: Arc::clone(route),
            key,
            learned,
        };
        let fill = Arc::new(fill);
        // Stage 3b: within grace the expired entry answers at once.
        if let Some(entry) = expired
            .as_ref()
            .filter(|e| e.within_grace(publish::now_ms()))
        {
            filler::start_refresh(&self.flights, &fill, entry.generation.clone());
            let (status, resp) = self.serve_stale(route, entry, StaleReason::Revalidating, ask);
            return Keyed::Served(status, Facts::from_entry(entry), resp);
        }
        let generation = match (&expired, read_generation) {
            _ if degraded => None,
            (Some(entry), _) => Some(entry.generation.clone()),
            (None, Some(generation)) => Some(generation),
            (None, None) => filler::generation(&fill).await,
        };
        // Stages 5-9 (`filler`), or the degraded fetch without a generation.
        let joined = generation.clone();
        let (answer, started) = filler::join(&self.flights, &fill, generation).await;
        // A streamed fill answers at once with its body as it arrives,
        // except a request whose answer needs the whole body.
        let answer = match answer.as_ref() {
            Answer::Streaming(_, streaming) if ask.needs_whole() => streaming.finished().await,
            _ => answer,
        };
        // stale-if-error: a failed refill answers with the expired entry
        // if, read again now, it is still of the current generation and
        // within its window.
        if let (Some(reason), Some(_)) = (stale::failure_reason(&answer), &expired) {
            let again = lookup::lookup(&sh.store, &fill.key, &route.name, &sh.metrics).await;
            match again.map(|found| stale::usable_after_failure(found, publish::now_ms())) {
                Ok(Some(AfterFailure::Fresh(entry))) => {
                    let status = hit_status(&entry);
                    let facts = Facts::from_entry(&entry);
                    return Keyed::Served(status, facts, respond(route, &entry, status, ask));
                }
                Ok(Some(AfterFailure::Stale(entry))) => {
                    let (status, resp) = self.serve_stale(route, &entry, reason, ask);
                    // This request went forward, and the refill failed.
                    let facts = Facts {
                        fwd: Some(Fwd::Stale),
                        fwd_status: upstream_status(&answer),
                        detail: Some("stale-if-error"),
                        ..Facts::from_entry(&entry)
                    };
                    return Keyed::Served(status, facts, resp);
                }
                Ok(None) | Err(_) => {}
            }
        }
        if may_relearn {
            if let Some(names) =
                vary::not_this_variant(route, &answer, &fill.key.query, &read.head.headers)
            {
                return Keyed::Relearn(names);
            }
        }
        // Why a MISS went forward, as far as this request can tell.
        let fwd = if expired.is_some() {
            Fwd::Stale
        } else if route.origin_vary.is_some() && !may_relearn {
            Fwd::VaryMiss
        } else if route.vary.is_empty() && fill.learned.is_empty() {
            Fwd::UriMiss
        } else {
            Fwd::Miss
        };
        let with_fwd = |(status, facts, resp): (CacheOutcome, Facts, Response<Body>)| {
            let fwd = (status == CacheOutcome::Miss).then_some(fwd);
            Keyed::Served(status, Facts { fwd, ..facts }, resp)
        };
        if let Some(served) = to_client(route, &answer, started, ask) {
            return with_fwd(served);
        }
        // The answer belongs to the request that started the flight (its
        // headers went upstream, a Set-Cookie is for it): fetch our own,
        // forwarded as it came if that fill made the object a hit-for-pass.
        let passed = joined.is_some_and(|g| sh.passes.is_marked(fill.key.keys.entry(), &g));
        if passed {
            return Keyed::Pass;
        }
        let own = filler::fetch_only(&fill, CacheOutcome::Miss).await;
        with_fwd(to_client(route, &own, true, ask).unwrap_or_else(|| {
            (
                CacheOutcome::Miss,
                Facts::default(),
                ProxyError::Bug("empty answer".into()).to_response(),
            )
        }))
    }

    fn serve_stale(
        &self,
        route: &Route,
        entry: &Entry,
        reason: StaleReason,
        ask: &ClientAsk,
    ) -> (CacheOutcome, Response<Body>) {
        self.shared
            .metrics
            .stale_served
            .with_label_values(&[&route.name, reason.as_str()])
            .inc();
        let status = CacheOutcome::Stale;
        (status, respond(route, entry, status, ask))
    }
}

/// Stage 0: a request carrying credentials is cached only if the route
/// makes them part of the key, and one whose query names a parameter
/// outside the route's `query: [..]` list (and not in `query_ignore`) is
/// not cached at all.
pub(crate) fn bypass(route: &Route, headers: &HeaderMap, query: Option<&str>) -> bool {
    [header::AUTHORIZATION, header::COOKIE]
        .iter()
        .any(|h| headers.contains_key(h) && !route.varies_on(h))
        || keys::has_unlisted_param(&route.query, &route.query_ignore, query)
}

/// The `Cache-Status` facts of a forwarded (BYPASS) answer.
fn forwarded(resp: &Response<Body>) -> Facts {
    Facts {
        fwd_status: Some(resp.status().as_u16()),
        ..Facts::default()
    }
}

/// The status the service answered a failed refill with, if it answered.
fn upstream_status(answer: &Answer) -> Option<u16> {
    match answer {
        Answer::Shared(_, _, trip) => trip.fwd_status,
        Answer::Starter(_, entry) => Some(entry.status),
        Answer::Streaming(_, streaming) => Some(streaming.head.status),
        Answer::Exclusive(_, slot) => {
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.as_ref().map(|r| r.status().as_u16())
        }
        Answer::Failed(..) => None,
    }
}
