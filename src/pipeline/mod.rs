//! The read pipeline for requests that match a cache route (SPEC §5). Each
//! stage is a named function in its own file:
//!
//! ```text
//! 0 validate + bypass   (route match in server; bypass() here)
//! 1 key                 keys::cache_key
//! 2 read, 3 hit check   lookup::lookup = store read + lookup::check_entry
//!   3b stale            stale: expired but current entry; grace answers it
//!                       at once + stale::refresh in the background;
//!                       stale-if-error keeps it for a failed refill
//! 4 bloom               bloom::stage (miss only, routes with `bloom`)
//! 5 coalesce + lease    flight::Flights (in-process, per generation read),
//!                       lease::acquire (across instances; takes the ticket)
//! 6 double-check        lookup::lookup again under the lease
//! 7 fetch               fill::fetch under fill::FillPermits; conditional
//!                       (revalidate) when the entry of the fill's
//!                       generation is expired and has validators
//!   7b degraded         fetch_only: same permits, nothing written
//! 8 publish             publish::cacheability, GuardedStore::publish_checked;
//!                       depends: version floor and cache tags
//! 9 release             lease::release
//! 10 answer             client_cc: the route's client_cache_control;
//!                       answer::shape: the client's preconditions
//!                       (conditional) and range (range) against the entry
//! ```
//! `status::CacheStatus`
//! is the result of every request: the `X-Cache` header, the metric label
//! and the log field.

pub mod answer;
pub mod bloom;
pub mod cache_control;
pub mod client_cc;
pub mod conditional;
pub mod depends;
pub mod entry;
pub mod etag;
pub mod fill;
pub mod flight;
pub mod lease;
pub mod lookup;
pub mod publish;
pub mod range;
pub mod revalidate;
pub mod stale;
pub mod status;
pub mod vary;

use crate::bloom::Blooms;
use crate::body::{self, Body};
use crate::config::{Config, Route};
use crate::error::ProxyError;
use crate::keys::{self, CacheKey};
use crate::metrics::Metrics;
use crate::proxy::client::UpstreamClient;
use crate::store::{GuardedStore, PublishChecks, PublishOutcome};
use answer::{ClientAsk, Shaped};
use bytes::Bytes;
use depends::{Stamp, TagTickets};
use entry::Entry;
use fill::{Fetched, FillPermits, FillRequest, Inflight};
use flight::{Answer, FlightKey, Flights};
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response};
use hyper::body::Incoming;
use lease::{LeaseGuard, LeaseOutcome};
use lookup::Found;
use publish::{Cacheability, FillOutcome, Lifetime, Uncacheable};
use rand::Rng;
use stale::{AfterFailure, StaleReason};
use status::CacheStatus;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// What a fill task needs; shared with spawned fills.
struct Shared {
    store: Arc<GuardedStore>,
    client: UpstreamClient,
    metrics: Metrics,
    permits: FillPermits,
    blooms: Arc<Blooms>,
}

pub struct Pipeline {
    shared: Arc<Shared>,
    flights: Arc<Flights>,
}

/// One fill's inputs, owned so the fill can run in its own task.
struct Fill {
    shared: Arc<Shared>,
    cfg: Arc<Config>,
    route: Arc<Route>,
    key: CacheKey,
    request: FillRequest,
    /// `vary_from_origin`: the names the key and the fill request were
    /// built with (learned so far); empty on other routes.
    learned: Vec<HeaderName>,
}

/// What [`Pipeline::try_hit`] did on its way to a miss, handed to
/// [`Pipeline::serve`] so that it is not done twice. Boxed where it is
/// passed: the futures it goes through are moved whole.
pub struct Early {
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
    Served(CacheStatus, Response<Body>),
    /// `vary_from_origin`: the answer varies on names the key did not
    /// include and is not this client's variant: key again with these.
    Relearn(Vec<HeaderName>),
}

impl Pipeline {
    pub fn new(
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
            }),
            flights: Arc::new(Flights::default()),
        }
    }

    /// Applies limits from a reloaded config (fill permits; route budgets
    /// are read from the route at each fill) and logs its warnings.
    pub fn reconfigure(&self, cfg: &Config) {
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
    pub fn try_hit(
        &self,
        cfg: &Config,
        route: &Route,
        params: &[String],
        req: &Request<Incoming>,
    ) -> Result<(CacheStatus, Response<Body>), Option<Box<Early>>> {
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
                Ok((status, self.finish(route, status, resp)))
            }
            Err(near) => Err(Some(Box::new(Early { key, near }))),
        }
    }

    /// Serves a cache read. `params` are the raw path param values in
    /// template order, already validated against their patterns; `early`:
    /// what [`Pipeline::try_hit`] did. Also returns what it did (the
    /// response's `X-Cache`), for the access log.
    pub async fn serve(
        &self,
        cfg: Arc<Config>,
        route: Arc<Route>,
        params: Vec<String>,
        req: Request<Incoming>,
        peer: SocketAddr,
        early: Option<Box<Early>>,
    ) -> (CacheStatus, Response<Body>) {
        let (status, resp) = self
            .serve_inner(cfg, &route, params, req, peer, early)
            .await;
        (status, self.finish(&route, status, resp))
    }

    /// Every answer's `X-Cache` and counters.
    fn finish(
        &self,
        route: &Route,
        status: CacheStatus,
        mut resp: Response<Body>,
    ) -> Response<Body> {
        resp.headers_mut()
            .insert(status::X_CACHE.clone(), status.header_value());
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

    async fn serve_inner(
        &self,
        cfg: Arc<Config>,
        route: &Arc<Route>,
        params: Vec<String>,
        req: Request<Incoming>,
        peer: SocketAddr,
        mut early: Option<Box<Early>>,
    ) -> (CacheStatus, Response<Body>) {
        let sh = &self.shared;
        // Stage 0: credentials that are not part of the key make the
        // response personal, and a query parameter outside the route's
        // allow-list could change the answer behind the key's back (or bust
        // the cache): forward untouched. (`early`: `try_hit` checked.)
        if early.is_none() && bypass(route, req.headers(), req.uri().query()) {
            let resp = crate::proxy::forward::forward(
                &sh.client,
                req,
                peer,
                cfg.upstream.timeout,
                &sh.metrics,
            )
            .await;
            return (CacheStatus::Bypass, resp);
        }
        // Stage 10's input: kept before the request is dropped for the fill.
        let ask = ClientAsk::from_request(req.method(), req.headers());
        // `vary_from_origin`: the names this object's answers vary on; on
        // other routes none, and no answer is keyed again.
        let (mut learned, mut may_relearn) = match route.origin_vary {
            Some(_) => (vary::learned(&sh.store, &cfg, route, &params).await, true),
            None => (Vec::new(), false),
        };
        let (parts, body) = req.into_parts();
        // Kept only where the request may still be forwarded as it came.
        let mut body = route.origin_vary.map(|_| body);
        loop {
            // A value longer than the route allows would make a variant of
            // its own per hostile client: such a request is not cached.
            let too_long = route
                .origin_vary
                .is_some_and(|b| vary::too_long(&parts.headers, &learned, b.max_value));
            if too_long {
                if let Some(body) = body.take() {
                    let req = Request::from_parts(parts, body);
                    let timeout = cfg.upstream.timeout;
                    let resp =
                        crate::proxy::forward::forward(&sh.client, req, peer, timeout, &sh.metrics)
                            .await;
                    return (CacheStatus::Bypass, resp);
                }
            }
            let keyed = self.serve_keyed(
                Arc::clone(&cfg),
                route,
                &params,
                learned,
                &parts,
                &ask,
                may_relearn,
                early.take(),
            );
            match keyed.await {
                Keyed::Served(status, resp) => return (status, resp),
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
    #[allow(clippy::too_many_arguments)]
    async fn serve_keyed(
        &self,
        cfg: Arc<Config>,
        route: &Arc<Route>,
        params: &[String],
        learned: Vec<HeaderName>,
        req: &http::request::Parts,
        ask: &ClientAsk,
        may_relearn: bool,
        early: Option<Box<Early>>,
    ) -> Keyed {
        let sh = &self.shared;
        // Stage 1, unless `try_hit` did it.
        let mut early = early.unwrap_or_else(|| {
            let ns = &cfg.store.namespace;
            let query = req.uri.query();
            Box::new(Early {
                key: keys::cache_key(ns, route, params, query, &learned, &req.headers),
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
                return Keyed::Served(status, respond(route, &entry, status, ask));
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
        let rest = Box::pin(self.serve_missed(
            cfg,
            route,
            params,
            learned,
            req,
            ask,
            may_relearn,
            early.key,
            missed,
        ));
        rest.await
    }

    /// Stages 4-10 for a key that found no fresh entry.
    #[allow(clippy::too_many_arguments)]
    async fn serve_missed(
        &self,
        cfg: Arc<Config>,
        route: &Arc<Route>,
        params: &[String],
        learned: Vec<HeaderName>,
        req: &http::request::Parts,
        ask: &ClientAsk,
        may_relearn: bool,
        key: CacheKey,
        missed: Missed,
    ) -> Keyed {
        let sh = &self.shared;
        let Missed {
            mut degraded,
            expired,
            read_generation,
        } = missed;
        // Stage 4: only on a real miss (an expired entry of the current
        // generation proves the object exists); with the store unavailable
        // the filter is too, and the degraded path takes over.
        if !degraded && expired.is_none() {
            if let Some(rejected) = bloom::stage(&sh.blooms, &cfg, route, params, ask.head).await {
                return Keyed::Served(rejected.0, rejected.1);
            }
        }
        // Stage 5 (in-process): join or start the fill for this key.
        let fill = Fill {
            shared: Arc::clone(sh),
            request: fill::fill_request(
                route,
                &route.fill_path(params),
                &key.query,
                &learned,
                &req.headers,
            ),
            cfg,
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
            self.start_refresh(&fill, entry.generation.clone());
            let (status, resp) = self.serve_stale(route, entry, StaleReason::Revalidating, ask);
            return Keyed::Served(status, resp);
        }
        let generation = match (&expired, read_generation) {
            _ if degraded => None,
            (Some(entry), _) => Some(entry.generation.clone()),
            (None, Some(generation)) => Some(generation),
            (None, None) => fill_generation(&fill).await,
        };
        degraded |= generation.is_none();
        let entry_key = fill.key.keys.entry().to_owned();
        let flight_key = match generation {
            Some(generation) => FlightKey::Fill {
                entry: entry_key,
                generation,
            },
            None => FlightKey::Degraded { entry: entry_key },
        };
        let task_fill = Arc::clone(&fill);
        // The fill's upstream time is this request's (the one that starts it).
        let timing = crate::proxy::timing::current();
        let (flight, started) = self.flights.join(flight_key, move || {
            let fill = async move {
                if degraded {
                    fetch_only(&task_fill, CacheStatus::Degraded).await
                } else {
                    fill_with_lease(&task_fill).await
                }
            };
            crate::proxy::timing::handed(timing, fill).boxed()
        });
        if !started {
            sh.metrics.coalesced.with_label_values(&[&route.name]).inc();
        }
        let answer = flight.await;
        // stale-if-error: a failed refill answers with the expired entry
        // if, read again now, it is still of the current generation and
        // within its window.
        if let (Some(reason), Some(_)) = (stale::failure_reason(&answer), &expired) {
            let again = lookup::lookup(&sh.store, &fill.key, &route.name, &sh.metrics).await;
            match again.map(|found| stale::usable_after_failure(found, publish::now_ms())) {
                Ok(Some(AfterFailure::Fresh(entry))) => {
                    let status = hit_status(&entry);
                    return Keyed::Served(status, respond(route, &entry, status, ask));
                }
                Ok(Some(AfterFailure::Stale(entry))) => {
                    let (status, resp) = self.serve_stale(route, &entry, reason, ask);
                    return Keyed::Served(status, resp);
                }
                Ok(None) | Err(_) => {}
            }
        }
        if may_relearn {
            if let Some(names) =
                vary::not_this_variant(route, &answer, &fill.key.query, &req.headers)
            {
                return Keyed::Relearn(names);
            }
        }
        if let Some((status, resp)) = to_client(route, &answer, started, ask) {
            return Keyed::Served(status, resp);
        }
        // The answer belongs to the request that started the flight (its
        // headers went upstream, a Set-Cookie is for it): fetch our own.
        let own = fetch_only(&fill, CacheStatus::Miss).await;
        let (status, resp) = to_client(route, &own, true, ask).unwrap_or_else(|| {
            (
                CacheStatus::Miss,
                ProxyError::Bug("empty answer".into()).to_response(),
            )
        });
        Keyed::Served(status, resp)
    }
}

impl Pipeline {
    /// Starts the grace refresh for `fill`'s object unless one runs in this
    /// process already; [`stale::refresh`] tries the lease once, so across
    /// instances at most one runs per object. Nobody awaits it.
    fn start_refresh(&self, fill: &Arc<Fill>, generation: bytes::Bytes) {
        let task_fill = Arc::clone(fill);
        let key = stale::refresh_flight_key(fill.key.keys.entry(), generation);
        let _running = self.flights.join(key, move || {
            async move { stale::refresh(&task_fill).await }.boxed()
        });
    }

    fn serve_stale(
        &self,
        route: &Route,
        entry: &Entry,
        reason: StaleReason,
        ask: &ClientAsk,
    ) -> (CacheStatus, Response<Body>) {
        self.shared
            .metrics
            .stale_served
            .with_label_values(&[&route.name, reason.as_str()])
            .inc();
        let status = CacheStatus::Stale;
        (status, respond(route, entry, status, ask))
    }
}

/// Stage 0: a request carrying credentials is cached only if the route
/// makes them part of the key, and one whose query names a parameter
/// outside the route's `query: [..]` list is not cached at all.
pub fn bypass(route: &Route, headers: &HeaderMap, query: Option<&str>) -> bool {
    [header::AUTHORIZATION, header::COOKIE]
        .iter()
        .any(|h| headers.contains_key(h) && !route.varies_on(h))
        || keys::has_unlisted_param(&route.query, query)
}

fn nonce() -> String {
    format!("{:016x}", rand::rng().random::<u64>())
}

fn hit_status(entry: &Entry) -> CacheStatus {
    if entry.negative {
        CacheStatus::Negative
    } else {
        CacheStatus::Hit
    }
}

/// The generation a miss that found no generation key joins fills of: a
/// ticket, which creates it. Joining by "no generation" instead could hand
/// a fill that started before an invalidation to a request that arrived
/// after it and after the key was then lost. `None`: store unavailable.
async fn fill_generation(fill: &Fill) -> Option<bytes::Bytes> {
    let ticket = fill
        .shared
        .store
        .ticket(fill.key.keys.generation(), &nonce(), fill.cfg.gen_ttl)
        .await;
    if let Err(e) = &ticket {
        tracing::debug!(route = %fill.route.name, error = %e, "ticket failed; degraded");
    }
    ticket.ok()
}

/// Stages 5 (across instances), 6, 7, 8 and 9 for one key.
async fn fill_with_lease(fill: &Fill) -> Answer {
    let sh = &fill.shared;
    let route = &fill.route;
    let acquired = lease::acquire(&sh.store, &fill.key, route, fill.cfg.gen_ttl, &sh.metrics);
    let lease = match acquired.await {
        Ok(LeaseOutcome::Won(lease)) => lease,
        Ok(LeaseOutcome::Hit(entry)) => {
            return Answer::Shared(hit_status(&entry), Arc::new(entry));
        }
        Ok(LeaseOutcome::WaitTimeout) => {
            return Answer::Failed(
                CacheStatus::Miss,
                ProxyError::Overloaded(crate::error::LEASE_WAIT_SPENT),
            );
        }
        Err(_) => return fetch_only(fill, CacheStatus::Degraded).await,
    };
    let answer = fill_holding_lease(fill, &lease).await;
    lease.release().await;
    answer
}

/// Stages 6-8 while holding the lease.
async fn fill_holding_lease(fill: &Fill, lease: &LeaseGuard) -> Answer {
    let started = std::time::Instant::now();
    let sh = &fill.shared;
    let route = &fill.route;
    // Stage 6: the previous lease holder may have published meanwhile.
    // An expired entry is what this fill replaces (or revalidates).
    let expired = match lookup::lookup(&sh.store, &fill.key, &route.name, &sh.metrics).await {
        Ok(Found::Fresh(entry)) => return Answer::Shared(hit_status(&entry), Arc::new(entry)),
        Ok(Found::Expired(entry)) => Some(entry),
        Ok(Found::Miss(_)) => None,
        Err(_) => return fetch_only(fill, CacheStatus::Degraded).await,
    };
    // The ticket came with the lease, before the upstream call: an
    // invalidation after that point moves the generation and the publish
    // below is refused.
    let ticket = lease.ticket().clone();
    // Only an entry stamped with this very ticket is revalidated.
    let revalidating = expired.and_then(|entry| {
        let validators = revalidate::Validators::of(&entry, &ticket, route)?;
        Some((validators.apply(&fill.request), entry))
    });
    let request = revalidating.as_ref().map_or(&fill.request, |(r, _)| r);
    // Likewise the tickets of the tags the object's last answer carried.
    let tag_tickets = match &route.tags_from {
        None => None,
        Some(_) => {
            let (ns, nonce) = (&fill.cfg.store.namespace, nonce());
            let taken =
                TagTickets::take(&sh.store, ns, &fill.key.identity, &nonce, fill.cfg.gen_ttl);
            match taken.await {
                Ok(t) => Some(t),
                Err(_) => return fetch_only(fill, CacheStatus::Degraded).await,
            }
        }
    };
    // Stage 7, under the lease: renewed while upstream takes its time.
    let fetched = lease
        .renew_while(
            route.lease,
            fill.cfg.upstream.timeout,
            fetch_with_permit(fill, request),
        )
        .await;
    let fetched = match (fetched, &revalidating) {
        (Ok(f), None) => f,
        (Ok(f), Some((_, stored))) => {
            let (f, outcome) = revalidate::resolve(stored, f);
            count_revalidation(fill, outcome);
            f
        }
        (Err(e), revalidating) => {
            if revalidating.is_some() {
                count_revalidation(fill, revalidate::Revalidation::Error);
            }
            return Answer::Failed(CacheStatus::Miss, e);
        }
    };
    let (mut entry, kind, life, deps) = match judge(fill, fetched, ticket.clone()) {
        Judged::TooLarge(resp) => {
            count_publish(fill, FillOutcome::TooLarge);
            return Answer::Exclusive(CacheStatus::Miss, Mutex::new(Some(resp)));
        }
        Judged::OneClient(resp, reason) => {
            count_uncacheable(fill, reason);
            return Answer::Exclusive(CacheStatus::Miss, Mutex::new(Some(resp)));
        }
        Judged::Shareable(entry, kind, life, deps) => (entry, kind, life, deps),
    };
    // Written on every fill, not only on a change: the list then lives as
    // long as the object is filled, instead of expiring under a hot object.
    if let Some(names) = &deps.learned {
        remember_vary(fill, names, *names != fill.learned).await;
    }
    let Cacheability::Uncacheable(reason) = kind else {
        let ttl = life.store_ttl();
        let checks = match publish_checks(fill, tag_tickets.as_ref(), &mut entry, deps).await {
            Some(checks) => checks,
            None => {
                count_publish(fill, FillOutcome::TagsUnticketed);
                return Answer::Starter(CacheStatus::Miss, Arc::new(entry));
            }
        };
        let object = entry_keys(fill, &entry);
        let owner = lease.owner();
        let encoded = entry.encode();
        let call = sh
            .store
            .publish_checked(&object, owner, &ticket, encoded, ttl, &checks);
        let published = call.await;
        let outcome = match published {
            Ok(PublishOutcome::Published) => FillOutcome::Published,
            Ok(PublishOutcome::LeaseLost) => {
                // The fill outlived its lease and could not renew it: the
                // answer is not cached. Worth an operator's attention.
                tracing::warn!(
                    route = %route.name,
                    key = %fill.key.keys.entry(),
                    fill_ms = started.elapsed().as_millis() as u64,
                    lease_ms = route.lease.as_millis() as u64,
                    "publish rejected: lease lost during the fill"
                );
                FillOutcome::LeaseLost
            }
            Ok(PublishOutcome::GenerationChanged) => {
                tracing::info!(route = %route.name, key = %fill.key.keys.entry(), "publish rejected: generation changed during the fill");
                FillOutcome::Rejected
            }
            Ok(PublishOutcome::TagChanged) => {
                tracing::info!(route = %route.name, key = %fill.key.keys.entry(), "publish rejected: a tag was invalidated during the fill");
                count_publish(fill, FillOutcome::Rejected);
                return Answer::Starter(CacheStatus::Miss, Arc::new(entry));
            }
            Ok(PublishOutcome::BelowFloor) => {
                tracing::info!(route = %route.name, key = %fill.key.keys.entry(), version = ?checks.version, "publish refused: answer older than the object's floor");
                FillOutcome::BelowFloor
            }
            // The answer is still good: return it, never fetch again.
            Err(e) => {
                tracing::debug!(key = %fill.key.keys.entry(), error = %e, "publish failed");
                FillOutcome::WriteFailure
            }
        };
        count_publish(fill, outcome);
        return Answer::Shared(CacheStatus::Miss, Arc::new(entry));
    };
    count_uncacheable(fill, reason);
    Answer::Shared(CacheStatus::Miss, Arc::new(entry))
}

/// What stage 8 checks besides generation and lease (`depends`): the
/// object's floor (`version_from`), and the answer's tags (`tags_from`),
/// stamped into `entry` with the tickets the fill took. `None`: the answer
/// carries a tag the fill has no ticket for; it is not stored, and its tags
/// are remembered so the next fill takes their tickets.
async fn publish_checks(
    fill: &Fill,
    tag_tickets: Option<&TagTickets>,
    entry: &mut Entry,
    deps: Deps,
) -> Option<PublishChecks> {
    let ns = &fill.cfg.store.namespace;
    let mut checks = PublishChecks::default();
    if fill.route.version_from.is_some() {
        checks.floor_key = Some(keys::floor_key(ns, &fill.key.identity));
        checks.version = deps.version;
    }
    let Some(tag_tickets) = tag_tickets else {
        return Some(checks);
    };
    match tag_tickets.stamp(&deps.tags) {
        Stamp::Tags(stamps) => {
            entry.tags = stamps
                .iter()
                .map(|(k, g)| (Bytes::copy_from_slice(k.as_bytes()), g.clone()))
                .collect();
            checks.tags = stamps;
            Some(checks)
        }
        Stamp::Unticketed(tags) => {
            let list = tags.join(" ");
            let store = &fill.shared.store;
            let remembered = store.remember_tags(&tag_tickets.list_key, &list, fill.cfg.gen_ttl);
            if let Err(e) = remembered.await {
                tracing::debug!(route = %fill.route.name, error = %e, "could not remember the answer's tags");
            }
            None
        }
    }
}

/// Where `entry` is published: the fill's keys, or (`vary_from_origin`,
/// the answer varies on other names than the key had) the entry key of its
/// own variant, still under the fill's lease and generation.
fn entry_keys<'f>(fill: &'f Fill, entry: &Entry) -> std::borrow::Cow<'f, keys::ObjectKeys> {
    let own = &fill.key.keys;
    if entry.variant == fill.key.variant {
        return std::borrow::Cow::Borrowed(own);
    }
    let ns = &fill.cfg.store.namespace;
    let theirs = keys::object_keys(
        ns,
        &fill.key.identity,
        &String::from_utf8_lossy(&entry.variant),
    );
    std::borrow::Cow::Owned(keys::ObjectKeys::from_parts(
        theirs.entry(),
        own.generation(),
        own.lease(),
    ))
}

/// Stores the names an answer varies on for its object, so the next fill
/// carries them and keys on them (`changed`: they differ from the names
/// this fill was keyed with; counted). A lost write costs a refetch later.
async fn remember_vary(fill: &Fill, names: &[HeaderName], changed: bool) {
    let key = keys::vary_names_key(&fill.cfg.store.namespace, &fill.key.identity);
    let text = vary::text(names);
    let stored = fill
        .shared
        .store
        .remember_tags(&key, &text, fill.cfg.gen_ttl);
    match stored.await {
        Ok(()) if changed => fill
            .shared
            .metrics
            .vary_learned
            .with_label_values(&[&fill.route.name])
            .inc(),
        Ok(()) => {}
        Err(e) => {
            tracing::debug!(route = %fill.route.name, error = %e, "could not store the learned vary names")
        }
    }
}

/// Stage 7b (and the fallback for one-client answers): fetch under the
/// same permits, write nothing.
async fn fetch_only(fill: &Fill, status: CacheStatus) -> Answer {
    match fetch_with_permit(fill, &fill.request).await {
        Err(e) => Answer::Failed(status, e),
        Ok(fetched) => match judge(fill, fetched, bytes::Bytes::new()) {
            Judged::TooLarge(resp) | Judged::OneClient(resp, _) => {
                Answer::Exclusive(status, Mutex::new(Some(resp)))
            }
            Judged::Shareable(entry, ..) => Answer::Shared(status, Arc::new(entry)),
        },
    }
}

/// An upstream answer, judged for sharing (stage 8's first half).
// Matched once per fill, where it is made: a box would cost an allocation
// per fill and save nothing.
#[allow(clippy::large_enum_variant)]
enum Judged {
    /// Coalesced requests may all receive it; `Cacheability` says whether
    /// it may also be stored, `Lifetime` for how long, `Deps` what it
    /// carries for the floor and tag checks.
    Shareable(Entry, Cacheability, Lifetime, Deps),
    /// Larger than `max_body`: streams to the request that started the fill.
    TooLarge(Response<Body>),
    /// For the request that started the fill only (the origin refused to
    /// let it be shared), with the reason.
    OneClient(Response<Body>, Uncacheable),
}

/// The answer's version (`version_from`), tags (`tags_from`, sorted) and
/// `Vary` names beyond the route's (`vary_from_origin`).
#[derive(Default)]
struct Deps {
    version: Option<i64>,
    tags: Vec<String>,
    learned: Option<Vec<HeaderName>>,
}

/// Turns what upstream answered into a shareable entry stamped with
/// `generation`, or a one-client response (too large, or private).
fn judge(fill: &Fill, fetched: Fetched, generation: bytes::Bytes) -> Judged {
    let (code, headers, body) = match fetched {
        Fetched::Streamed(resp) => return Judged::TooLarge(resp),
        Fetched::Buffered {
            status,
            headers,
            body,
        } => (status, headers, body),
    };
    let cc = publish::directives(&fill.route, &headers);
    let mut kind = publish::cacheability(&fill.route, code, &headers, &cc);
    let mut deps = Deps::default();
    if let Some(header) = &fill.route.version_from {
        deps.version = depends::version(&headers, header);
    }
    if let Some(header) = &fill.route.tags_from {
        match crate::tags::from_header(headers.get_all(header).iter()) {
            Ok(tags) => deps.tags = tags,
            Err(e) => {
                tracing::debug!(route = %fill.route.name, error = %e, "answer's tags refused");
                if kind.is_shareable() {
                    kind = Cacheability::Uncacheable(Uncacheable::Tags);
                }
            }
        }
    }
    if let (false, Cacheability::Uncacheable(reason)) = (kind.is_shareable(), kind) {
        return Judged::OneClient(one_client(code, headers, body), reason);
    }
    let life = publish::lifetime(&fill.route, kind, &headers, &cc);
    let origin_age = cache_control::origin_age(&headers);
    if let Some(bounds) = fill.route.origin_vary {
        deps.learned =
            cache_control::learned_vary_of(&headers, &fill.route.vary, bounds.max_headers).ok();
    }
    let mut headers = publish::replayable_headers(headers);
    if kind == Cacheability::Positive {
        etag::ensure(fill.route.etag, &mut headers, &body);
    }
    let mut entry = publish::build_entry(
        &fill.key, generation, kind, life, origin_age, code, headers, body,
    );
    // Keyed by the names the answer declares and the values its fill sent
    // (see `vary`): the origin's answer for exactly that variant.
    if let Some(names) = &deps.learned {
        let query = &fill.key.query;
        let variant = keys::variant(query, &fill.route, names, &fill.request.headers);
        entry.variant = Bytes::from(variant);
    }
    Judged::Shareable(entry, kind, life, deps)
}

async fn fetch_with_permit(fill: &Fill, request: &FillRequest) -> Result<Fetched, ProxyError> {
    let sh = &fill.shared;
    let _permit = sh.permits.acquire(&fill.route, &sh.metrics).await?;
    let _inflight = Inflight::enter(
        sh.metrics
            .fill_inflight
            .with_label_values(&[&fill.route.name]),
    );
    fill::fetch(&sh.client, &fill.cfg, &fill.route, request, &sh.metrics).await
}

fn count_publish(fill: &Fill, outcome: FillOutcome) {
    fill.shared
        .metrics
        .publish
        .with_label_values(&[&fill.route.name, outcome.as_str()])
        .inc();
}

fn count_revalidation(fill: &Fill, outcome: revalidate::Revalidation) {
    fill.shared
        .metrics
        .revalidations
        .with_label_values(&[&fill.route.name, outcome.as_str()])
        .inc();
}

/// Counts an answer that was not stored, with its reason.
fn count_uncacheable(fill: &Fill, reason: Uncacheable) {
    tracing::debug!(route = %fill.route.name, reason = reason.as_str(), "answer not stored");
    count_publish(fill, FillOutcome::Uncacheable);
    fill.shared
        .metrics
        .uncacheable
        .with_label_values(&[&fill.route.name, reason.as_str()])
        .inc();
}

/// A buffered answer as a response for one client.
fn one_client(code: http::StatusCode, headers: HeaderMap, body: bytes::Bytes) -> Response<Body> {
    let mut resp = Response::new(body::full(body));
    *resp.status_mut() = code;
    *resp.headers_mut() = headers;
    resp.headers_mut().remove(header::CONTENT_LENGTH);
    resp
}

/// A client response from an entry; hits carry `Age`. Stage 10 shapes it
/// for the client's preconditions and range, and adds the body.
fn respond(route: &Route, entry: &Entry, status: CacheStatus, ask: &ClientAsk) -> Response<Body> {
    respond_with(route, entry, answer::entry_head(entry), status, ask)
}

/// [`respond`] from the entry's head built beforehand ([`answer::entry_head`]).
fn respond_with(
    route: &Route,
    entry: &Entry,
    head: HeaderMap,
    status: CacheStatus,
    ask: &ClientAsk,
) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() =
        http::StatusCode::from_u16(entry.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    *resp.headers_mut() = head;
    let h = resp.headers_mut();
    // A stale answer's Age counts from the original fetch as well; a
    // fresh fill's answer carries the origin's own Age, if it sent one.
    let age = (publish::now_ms().saturating_sub(entry.stored_at_ms) / 1000)
        .min(cache_control::MAX_AGE_SECONDS);
    if age > 0
        || matches!(
            status,
            CacheStatus::Hit | CacheStatus::Negative | CacheStatus::Stale
        )
    {
        h.insert(header::AGE, answer::int_value(age));
    }
    client_cc::apply(route, entry, h);
    answer::shape(resp, entry, ask)
}

/// A flight's answer as this client's response; `None` for a one-client
/// answer when this request did not start the flight. A one-client answer
/// (too large, or private to this client) goes out as the origin sent it:
/// no preconditions or range are applied to it.
fn to_client(
    route: &Route,
    answer: &Answer,
    started: bool,
    ask: &ClientAsk,
) -> Option<(CacheStatus, Response<Body>)> {
    match answer {
        Answer::Shared(status, entry) => Some((*status, respond(route, entry, *status, ask))),
        Answer::Failed(status, e) => Some((*status, e.to_response())),
        Answer::Exclusive(..) | Answer::Starter(..) if !started => None,
        Answer::Starter(status, entry) => Some((*status, respond(route, entry, *status, ask))),
        Answer::Exclusive(status, slot) => {
            let taken = slot.lock().ok().and_then(|mut s| s.take())?;
            Some((*status, strip_body_for_head(taken, ask.head)))
        }
    }
}

fn strip_body_for_head(resp: Response<Body>, head: bool) -> Response<Body> {
    if !head {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, body::empty())
}
