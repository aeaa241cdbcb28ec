//! Running a fill, once the stage chart (`super`) has chosen one: stages
//! 5 to 9 for one key. Joins the in-process flight of the object's
//! generation ([`join`], `flight`) or starts it; the started fill takes the
//! lease and its ticket (`lease`), reads the entry again under it, fetches
//! under a fill permit (`fill`), possibly as a revalidation (`revalidate`),
//! streams a shareable answer to the flight's waiters as it arrives
//! ([`fetch_streaming`], `tee`), judges the answer (`publish`) and
//! publishes it with the generation, lease, floor and tag checks
//! (`depends`), then releases the lease. With
//! the store unreadable it runs the degraded fetch instead ([`fetch_only`]:
//! coalesced only while younger than `degraded_join_window`, nothing
//! written). The grace refresh runs the
//! same fill under a lease tried once ([`start_refresh`], `stale`).

use super::answer::{hit_status, one_client};
use super::depends::{self, Stamp, Tickets};
use super::entry::Entry;
use super::fill::{self, Fetched, FillPermits, FillRequest, Inflight, Teed};
use super::flight::{Answer, FlightKey, Flights, Herald, Role, Trip};
use super::lease::{self, LeaseGuard, LeaseOutcome};
use super::lookup::{self, Found};
use super::pass::{self, PassMarkers};
use super::publish::{self, Cacheability, FillOutcome, Lifetime, Uncacheable};
use super::tee::{Tee, TeeWriter};
use super::{cache_control, etag, revalidate, stale, vary};
use crate::bloom::Blooms;
use crate::body::Body;
use crate::config::{Config, Route};
use crate::error::ProxyError;
use crate::keys::{self, CacheKey};
use crate::metrics::Metrics;
use crate::outcome::CacheOutcome;
use crate::proxy::client::UpstreamClient;
use crate::store::{GuardedStore, PublishChecks, PublishOutcome};
use bytes::Bytes;
use futures_util::FutureExt;
use http::header::HeaderName;
use http::Response;
use rand::Rng;
use std::sync::{Arc, Mutex};

/// What the pipeline and its fill tasks share (a fill task holds it past
/// the request that started it).
pub(super) struct Shared {
    pub(super) store: Arc<GuardedStore>,
    pub(super) client: UpstreamClient,
    pub(super) metrics: Metrics,
    pub(super) permits: FillPermits,
    pub(super) blooms: Arc<Blooms>,
    /// Hit-for-pass: object variants forwarded without a fill (`pass`).
    pub(super) passes: PassMarkers,
}

/// One fill's inputs, owned so the fill can run in its own task.
pub(super) struct Fill {
    pub(super) shared: Arc<Shared>,
    pub(super) cfg: Arc<Config>,
    pub(super) route: Arc<Route>,
    pub(super) key: CacheKey,
    pub(super) request: FillRequest,
    /// `vary_from_origin`: the names the key and the fill request were
    /// built with (learned so far); empty on other routes.
    pub(super) learned: Vec<HeaderName>,
}

/// The generation a miss that found no generation key joins fills of: a
/// ticket, which creates it. Joining by "no generation" instead could hand
/// a fill that started before an invalidation to a request that arrived
/// after it and after the key was then lost. `None`: store unavailable.
pub(super) async fn generation(fill: &Fill) -> Option<Bytes> {
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

/// Stage 5 in this process: joins the flight for `fill`'s object and
/// `generation` (the one its requests read), starting the fill if none
/// runs; `None`: the store is unreadable, and the degraded fetch of the
/// object is joined instead, if it started less than the route's
/// `degraded_join_window` ago (docs/architecture.md#degraded-answers-are-never-older-than-the-window).
/// The flag is true for the request that started the flight.
pub(super) async fn join(
    flights: &Arc<Flights>,
    fill: &Arc<Fill>,
    generation: Option<Bytes>,
) -> (Arc<Answer>, bool) {
    let degraded = generation.is_none();
    let entry_key = fill.key.keys.entry().to_owned();
    let (flight_key, max_age) = match generation {
        Some(generation) => {
            let key = FlightKey::Fill {
                entry: entry_key,
                generation,
            };
            (key, None)
        }
        None => {
            let key = FlightKey::Degraded { entry: entry_key };
            (key, Some(fill.route.degraded_join_window))
        }
    };
    let task_fill = Arc::clone(fill);
    // The fill's upstream time is this request's (the one that starts it).
    let timing = crate::proxy::timing::current();
    let (flight, role) = flights.join(flight_key, max_age, move |herald| {
        let fill = async move {
            if degraded {
                fetch_only(&task_fill, CacheOutcome::Degraded).await
            } else {
                fill_with_lease(&task_fill, herald).await
            }
        };
        crate::proxy::timing::handed(timing, fill).boxed()
    });
    let metrics = &fill.shared.metrics;
    match role {
        Role::Joined => metrics
            .coalesced
            .with_label_values(&[&fill.route.name])
            .inc(),
        Role::Replaced => {
            let refused = &metrics.degraded_join_refused;
            refused.with_label_values(&[&fill.route.name]).inc();
        }
        Role::Started => {}
    }
    (flight.await, role.started())
}

/// Starts the grace refresh for `fill`'s object unless one runs in this
/// process already; [`stale::refresh`] tries the lease once, so across
/// instances at most one runs per object. Nobody awaits it.
pub(super) fn start_refresh(flights: &Arc<Flights>, fill: &Arc<Fill>, generation: Bytes) {
    let task_fill = Arc::clone(fill);
    let key = stale::refresh_flight_key(fill.key.keys.entry(), generation);
    let _running = flights.join(key, None, move |_| {
        async move { stale::refresh(&task_fill).await }.boxed()
    });
}

/// Stages 5 (across instances), 6, 7, 8 and 9 for one key.
async fn fill_with_lease(fill: &Fill, herald: Herald) -> Answer {
    let sh = &fill.shared;
    let route = &fill.route;
    let acquired = lease::acquire(&sh.store, &fill.key, route, fill.cfg.gen_ttl, &sh.metrics);
    let lease = match acquired.await {
        Ok(LeaseOutcome::Won(lease)) => lease,
        Ok(LeaseOutcome::Hit(entry)) => {
            return Answer::Shared(hit_status(&entry), Arc::new(entry), Trip::default());
        }
        Ok(LeaseOutcome::WaitTimeout) => {
            return Answer::Failed(
                CacheOutcome::Miss,
                ProxyError::Overloaded(crate::error::LEASE_WAIT_SPENT),
            );
        }
        Err(_) => return fetch_only(fill, CacheOutcome::Degraded).await,
    };
    let answer = fill_holding_lease(fill, &lease, &herald).await;
    lease.release().await;
    answer
}

/// Stages 6-8 while holding the lease; `herald` streams a shareable
/// answer to the flight's waiters as its body arrives.
pub(super) async fn fill_holding_lease(fill: &Fill, lease: &LeaseGuard, herald: &Herald) -> Answer {
    let started = tokio::time::Instant::now();
    let sh = &fill.shared;
    let route = &fill.route;
    // Stage 6: the previous lease holder may have published meanwhile.
    // An expired entry is what this fill replaces (or revalidates).
    let expired = match lookup::lookup(&sh.store, &fill.key, &route.name, &sh.metrics).await {
        Ok(Found::Fresh(entry)) => {
            return Answer::Shared(hit_status(&entry), Arc::new(entry), Trip::default())
        }
        Ok(Found::Expired(entry)) => Some(entry),
        Ok(Found::Miss(_)) => None,
        Err(_) => return fetch_only(fill, CacheOutcome::Degraded).await,
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
    // Likewise the route's ticket and those of the tags the object's last
    // answer carried.
    let (ns, nonce) = (&fill.cfg.store.namespace, nonce());
    let taken = Tickets::take(
        &sh.store,
        ns,
        &route.name,
        &fill.key.identity,
        route.tags_from.is_some(),
        &nonce,
        fill.cfg.gen_ttl,
    );
    let tickets = match taken.await {
        Ok(t) => t,
        Err(_) => return fetch_only(fill, CacheOutcome::Degraded).await,
    };
    // Stage 7, under the lease: renewed while upstream takes its time.
    // A revalidation is read whole: its 304 answers with the stored entry.
    // What the fill depends on is recorded beside the lease meanwhile, so a
    // waiter takes the fill over once one of those moves instead of
    // waiting for a publish that will be refused.
    let stream = revalidating.is_none() && herald.can_stream();
    let work = async {
        match stream {
            true => fetch_streaming(fill, request, herald, &ticket, &tickets).await,
            false => fetch_with_permit(fill, request).await.map(Stage7::Read),
        }
    };
    let depends = tickets.depends();
    let (fetched, ()) = tokio::join!(
        lease.renew_while(route.lease, fill.cfg.upstream.timeout, work),
        lease.record_depends(&depends),
    );
    let (fetched, writer) = match fetched {
        Ok(Stage7::Read(f)) => (Ok(f), None),
        Ok(Stage7::Streamed(f, writer)) => (Ok(f), Some(writer)),
        Ok(Stage7::TooLarge) => {
            // Its waiters read it from the tee; nobody else may.
            return Answer::Exclusive(CacheOutcome::Miss, Mutex::new(None));
        }
        Err(e) => (Err(e), None),
    };
    let mut not_modified = false;
    let fetched = match (fetched, &revalidating) {
        (Ok(f), None) => f,
        (Ok(f), Some((_, stored))) => {
            let (f, outcome) = revalidate::resolve(stored, f);
            count_revalidation(fill, outcome);
            not_modified = outcome == revalidate::Revalidation::NotModified;
            f
        }
        (Err(e), revalidating) => {
            if revalidating.is_some() {
                count_revalidation(fill, revalidate::Revalidation::Error);
            }
            return Answer::Failed(CacheOutcome::Miss, e);
        }
    };
    // A streamed answer's waiters complete once it is judged: all of them
    // with a shared answer (`to_all`); on any other return the dropped
    // writer lets the starter complete and cuts the joiners short.
    let to_all = |answer: Answer| {
        if let Some(writer) = &writer {
            writer.release(true);
        }
        answer
    };
    let (mut entry, kind, life, deps) = match judge(fill, fetched, ticket.clone()) {
        Judged::TooLarge(resp) => {
            count_publish(fill, FillOutcome::TooLarge);
            mark_pass(fill, &ticket);
            return Answer::Exclusive(CacheOutcome::Miss, Mutex::new(Some(resp)));
        }
        Judged::OneClient(resp, reason) => {
            count_uncacheable(fill, reason);
            if pass::passes(reason, resp.status()) {
                mark_pass(fill, &ticket);
            }
            return Answer::Exclusive(CacheOutcome::Miss, Mutex::new(Some(resp)));
        }
        Judged::Shareable(entry, kind, life, deps) => (entry, kind, life, deps),
    };
    let mut trip = Trip {
        fwd_status: Some(if not_modified { 304 } else { entry.status }),
        stored: false,
    };
    // Written on every fill, not only on a change: the list then lives as
    // long as the object is filled, instead of expiring under a hot object.
    if let Some(names) = &deps.learned {
        remember_vary(fill, names, *names != fill.learned).await;
    }
    let Cacheability::Uncacheable(reason) = kind else {
        let ttl = life.store_ttl();
        let checks = match publish_checks(fill, &tickets, &mut entry, deps).await {
            Checks::Ready(checks) => checks,
            Checks::Unticketed => {
                count_publish(fill, FillOutcome::TagsUnticketed);
                return Answer::Starter(CacheOutcome::Miss, Arc::new(entry));
            }
            Checks::TagMoved => {
                tracing::info!(route = %route.name, key = %fill.key.keys.entry(), "publish rejected: a tag was invalidated during the fill");
                count_publish(fill, FillOutcome::Rejected);
                return Answer::Starter(CacheOutcome::Miss, Arc::new(entry));
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
                return Answer::Starter(CacheOutcome::Miss, Arc::new(entry));
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
        trip.stored = outcome == FillOutcome::Published;
        return to_all(Answer::Shared(CacheOutcome::Miss, Arc::new(entry), trip));
    };
    count_uncacheable(fill, reason);
    let status = http::StatusCode::from_u16(entry.status).unwrap_or(http::StatusCode::OK);
    if pass::passes(reason, status) {
        mark_pass(fill, &ticket);
    }
    to_all(Answer::Shared(CacheOutcome::Miss, Arc::new(entry), trip))
}

/// Hit-for-pass: the object variant's answers are not stored for a reason
/// of its own; requests that read `generation` are forwarded without a
/// fill for the route's `hit_for_pass` (`pass`).
fn mark_pass(fill: &Fill, generation: &Bytes) {
    let ttl = fill.route.hit_for_pass;
    let entry_key = fill.key.keys.entry();
    fill.shared.passes.mark(entry_key, generation, ttl);
}

/// What [`publish_checks`] made of an answer's dependencies.
enum Checks {
    Ready(PublishChecks),
    /// The answer carries a tag the fill could not ticket: not stored.
    Unticketed,
    /// A tag the fill learned from its answer was invalidated during the
    /// fill: not stored, and for the request that started it only.
    TagMoved,
}

/// What stage 8 checks besides generation and lease (`depends`): the
/// object's floor (`version_from`), the route's generation and the
/// answer's tags (`tags_from`), stamped into `entry` with the tickets the
/// fill took. A tag the fill took no ticket for before its upstream call
/// gets one now, if it was not invalidated since the fill began
/// ([`Tickets::start`]); the answer's tags are remembered so the next fill
/// takes their tickets first.
async fn publish_checks(fill: &Fill, tickets: &Tickets, entry: &mut Entry, deps: Deps) -> Checks {
    let ns = &fill.cfg.store.namespace;
    let mut checks = PublishChecks::default();
    if fill.route.version_from.is_some() {
        checks.floor_key = Some(keys::floor_key(ns, &fill.key.identity));
        checks.version = deps.version;
    }
    let stamps = match tickets.stamp(&deps.tags) {
        Stamp::Stamps(stamps) => stamps,
        Stamp::Unticketed {
            mut stamps,
            missing,
        } => {
            remember_tags(fill, tickets, &deps.tags).await;
            let Some(start) = &tickets.start else {
                return Checks::Unticketed;
            };
            let tag_keys: Vec<String> = missing
                .iter()
                .map(|t| keys::tag_generation_key(ns, t))
                .collect();
            let store = &fill.shared.store;
            let nonce = nonce();
            let taken = store.tag_tickets_since(&tag_keys, start, &nonce, fill.cfg.gen_ttl);
            match taken.await {
                Ok(Some(generations)) => stamps.extend(tag_keys.into_iter().zip(generations)),
                Ok(None) => return Checks::TagMoved,
                Err(e) => {
                    tracing::debug!(route = %fill.route.name, error = %e, "could not ticket the answer's new tags");
                    return Checks::Unticketed;
                }
            }
            stamps
        }
    };
    entry.tags = stamps
        .iter()
        .map(|(k, g)| (Bytes::copy_from_slice(k.as_bytes()), g.clone()))
        .collect();
    checks.tags = stamps;
    Checks::Ready(checks)
}

/// Records the tags an answer carried for its object, so the next fill
/// takes their tickets before its upstream call. A lost write costs that
/// fill a store call at publish (or, on a cluster, a refetch).
async fn remember_tags(fill: &Fill, tickets: &Tickets, tags: &[String]) {
    if let Some(list_key) = &tickets.list_key {
        let list = tags.join(" ");
        let store = &fill.shared.store;
        let remembered = store.remember_tags(list_key, &list, fill.cfg.gen_ttl);
        if let Err(e) = remembered.await {
            tracing::debug!(route = %fill.route.name, error = %e, "could not remember the answer's tags");
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
pub(super) async fn fetch_only(fill: &Fill, status: CacheOutcome) -> Answer {
    match fetch_with_permit(fill, &fill.request).await {
        Err(e) => Answer::Failed(status, e),
        Ok(fetched) => match judge(fill, fetched, Bytes::new()) {
            Judged::TooLarge(resp) | Judged::OneClient(resp, _) => {
                Answer::Exclusive(status, Mutex::new(Some(resp)))
            }
            Judged::Shareable(entry, ..) => {
                let trip = Trip {
                    fwd_status: Some(entry.status),
                    stored: false,
                };
                Answer::Shared(status, Arc::new(entry), trip)
            }
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
fn judge(fill: &Fill, fetched: Fetched, generation: Bytes) -> Judged {
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

/// What stage 7 read.
enum Stage7 {
    /// Read whole (or streamed through for one client) by `fill::fetch`.
    Read(Fetched),
    /// Streamed to the flight's waiters as it arrived and read whole; the
    /// writer gives their verdict once the answer is judged.
    Streamed(Fetched, TeeWriter),
    /// Streamed to the flight's waiters, past `max_body`: hit-for-pass, and
    /// the rest streams on in a task of its own.
    TooLarge,
}

/// Stage 7 for a fill whose waiters may read the body as it arrives: under
/// a fill permit, the origin's head is judged at once, and a shareable
/// answer (below 500, not empty) is handed to the flight as
/// [`Answer::Streaming`] while its body is read into the tee; any other
/// answer is read as [`fill::fetch`] reads it.
async fn fetch_streaming(
    fill: &Fill,
    request: &FillRequest,
    herald: &Herald,
    ticket: &Bytes,
    tickets: &Tickets,
) -> Result<Stage7, ProxyError> {
    let sh = &fill.shared;
    let max_body = fill.cfg.fill.max_body;
    let permit = sh.permits.acquire(&fill.route, &sh.metrics).await?;
    let inflight = Inflight::enter(
        sh.metrics
            .fill_inflight
            .with_label_values(&[&fill.route.name]),
    );
    let mut head =
        fill::fetch_head(&sh.client, &fill.cfg, &fill.route, request, &sh.metrics).await?;
    let Some((preview, tags)) = preview(fill, &head, ticket) else {
        return fill::read_body(head, max_body).await.map(Stage7::Read);
    };
    // A body that came whole with its head is answered once published, as
    // one read whole: streaming it would gain nothing and lose `stored`.
    if fill::read_first(&mut head).await? {
        return fill::read_body(head, max_body).await.map(Stage7::Read);
    }
    let cut = sh
        .metrics
        .fill_readers_cut
        .with_label_values(&[&fill.route.name]);
    let (tee, writer) = Tee::new(max_body, head.length(), cut);
    if !herald.stream(CacheOutcome::Miss, preview, head.length(), tee) {
        return fill::read_body(head, max_body).await.map(Stage7::Read);
    }
    match fill::stream_body(head, &writer, max_body).await? {
        Teed::Whole(fetched) => Ok(Stage7::Streamed(fetched, writer)),
        Teed::TooLarge(rest) => {
            count_publish(fill, FillOutcome::TooLarge);
            mark_pass(fill, ticket);
            // Like a too-large answer streamed to one client: the rest
            // holds neither the permit nor the fill's deadline.
            drop((permit, inflight));
            let store = Arc::clone(&sh.store);
            let (tickets, ns) = (tickets.clone(), fill.cfg.store.namespace.clone());
            let gen_ttl = fill.cfg.gen_ttl;
            tokio::spawn(async move {
                if fill::stream_tail(rest, &writer).await {
                    let current = still_current(&store, &tickets, &tags, &ns, gen_ttl);
                    writer.release(current.await);
                }
            });
            Ok(Stage7::TooLarge)
        }
    }
}

/// The entry a streamed answer's waiters are answered with (no body yet)
/// and the answer's tags, if the origin's head makes a shareable answer
/// worth streaming: not a server error (stale-if-error may replace it),
/// not empty (its head alone would be a complete answer to a joiner).
fn preview(fill: &Fill, head: &fill::Head, generation: &Bytes) -> Option<(Entry, Vec<String>)> {
    let parts = &head.parts;
    if parts.status.is_server_error() || head.length() == Some(0) {
        return None;
    }
    let fetched = Fetched::Buffered {
        status: parts.status,
        headers: parts.headers.clone(),
        body: Bytes::new(),
    };
    let Judged::Shareable(mut entry, _, _, deps) = judge(fill, fetched, generation.clone()) else {
        return None;
    };
    // A derived `ETag` needs the body: the stored entry gets it.
    if !parts.headers.contains_key(http::header::ETAG) {
        entry.headers.retain(|(n, _)| n != http::header::ETAG);
    }
    Some((entry, deps.tags))
}

/// Whether a fill that took `tickets` before its upstream call may still
/// be served to requests that joined it: neither its route nor any of the
/// answer's `tags` was invalidated since (the checks a publish makes, for
/// an answer that is not published: one past `max_body`).
async fn still_current(
    store: &GuardedStore,
    tickets: &Tickets,
    tags: &[String],
    ns: &str,
    gen_ttl: std::time::Duration,
) -> bool {
    let (stamps, missing) = match tickets.stamp(tags) {
        Stamp::Stamps(stamps) => (stamps, Vec::new()),
        Stamp::Unticketed { stamps, missing } => (stamps, missing),
    };
    let gen_keys: Vec<&str> = stamps.iter().map(|(k, _)| k.as_str()).collect();
    match store.read_tags(&gen_keys).await {
        Ok(now) if now.len() == stamps.len() => {
            let same = now
                .iter()
                .zip(&stamps)
                .all(|(n, (_, t))| n.as_ref() == Some(t));
            if !same {
                return false;
            }
        }
        _ => return false,
    }
    if missing.is_empty() {
        return true;
    }
    let Some(start) = &tickets.start else {
        return false;
    };
    let tag_keys: Vec<String> = missing
        .iter()
        .map(|t| keys::tag_generation_key(ns, t))
        .collect();
    let nonce = nonce();
    let taken = store.tag_tickets_since(&tag_keys, start, &nonce, gen_ttl);
    matches!(taken.await, Ok(Some(_)))
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

fn nonce() -> String {
    format!("{:016x}", rand::rng().random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::super::Pipeline;
    use super::*;
    use crate::store::StoreError;
    use http::HeaderMap;
    use http_body_util::Full;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::net::TcpListener;
    use tokio::sync::{mpsc, Semaphore};

    /// Long enough for any step of a fill on a loaded machine; a test that
    /// waits this long has failed.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// An origin on 127.0.0.1:0 that holds every answer until the test
    /// releases it ([`Origin::release`]), so a test can act while a fill
    /// waits for upstream. Answer `n` (from 1) is `200 answer n`.
    struct Origin {
        addr: SocketAddr,
        calls: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
        arrived: mpsc::UnboundedReceiver<()>,
    }

    impl Origin {
        async fn start() -> Origin {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("local addr");
            let calls = Arc::new(AtomicUsize::new(0));
            let gate = Arc::new(Semaphore::new(0));
            let (tx, arrived) = mpsc::unbounded_channel();
            let (c, g) = (Arc::clone(&calls), Arc::clone(&gate));
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (calls, gate, tx) = (Arc::clone(&c), Arc::clone(&g), tx.clone());
                    let service = service_fn(move |_req| {
                        let (calls, gate, tx) = (Arc::clone(&calls), Arc::clone(&gate), tx.clone());
                        async move {
                            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                            let _ = tx.send(());
                            if let Ok(permit) = gate.acquire().await {
                                permit.forget();
                            }
                            let body = Full::new(Bytes::from(format!("answer {n}")));
                            Ok::<_, Infallible>(Response::new(body))
                        }
                    });
                    tokio::spawn(
                        http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
            Origin {
                addr,
                calls,
                gate,
                arrived,
            }
        }

        /// Lets one held (or the next) request be answered.
        fn release(&self) {
            self.gate.add_permits(1);
        }

        /// Waits until a request has reached the origin.
        async fn arrival(&mut self) {
            let got = tokio::time::timeout(PATIENCE, self.arrived.recv()).await;
            assert!(matches!(got, Ok(Some(()))), "no request reached the origin");
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    /// A pipeline as `app` builds it, on the embedded store (no `redis`
    /// in the config), filling from an [`Origin`].
    struct Harness {
        pipeline: Pipeline,
        cfg: Arc<Config>,
        route: Arc<Route>,
        origin: Origin,
    }

    async fn harness() -> Harness {
        let origin = Origin::start().await;
        let text = format!(
            "version: 1\nlisten: 127.0.0.1:1\nadmin: {{ listen: 127.0.0.1:2 }}\n\
             upstream: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: app, \
             path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 10s, lease: 5s, \
             degraded_join_window: 1s }}\n",
            origin.addr
        );
        let cfg = match Config::parse(&text, &|_| None) {
            Ok(cfg) => Arc::new(cfg),
            Err(e) => panic!("test config is invalid: {e}"),
        };
        assert!(cfg.store.redis.is_none(), "the embedded store");
        let metrics = Metrics::new();
        let store = crate::store::open(&cfg.store, &metrics)
            .await
            .expect("embedded store");
        let client = UpstreamClient::new(&cfg.upstream);
        let blooms = Blooms::new(Arc::clone(&store), None, &metrics.registry);
        let pipeline = Pipeline::new(store, client, blooms, metrics, &cfg);
        let route = Arc::clone(&cfg.routes.routes[0]);
        Harness {
            pipeline,
            cfg,
            route,
            origin,
        }
    }

    impl Harness {
        /// What the chart hands a fill for a miss on `/a/{id}`.
        fn fill(&self, id: &str) -> Arc<Fill> {
            let params = [id.to_owned()];
            let none = HeaderMap::new();
            let ns = &self.cfg.store.namespace;
            let key = keys::cache_key(ns, &self.route, &params, None, &[], &none);
            let path = self.route.fill_path(&params);
            let request = fill::fill_request(&self.route, &path, &key.query, &[], &none);
            Arc::new(Fill {
                shared: Arc::clone(&self.pipeline.shared),
                cfg: Arc::clone(&self.cfg),
                route: Arc::clone(&self.route),
                key,
                request,
                learned: Vec::new(),
            })
        }

        /// Stages 2-3 for `fill`'s key, as a request would read it.
        async fn read(&self, fill: &Fill) -> Result<Found, StoreError> {
            let sh = &self.pipeline.shared;
            lookup::lookup(&sh.store, &fill.key, &self.route.name, &sh.metrics).await
        }

        /// The generation a request that finds no entry joins fills of (as
        /// the chart picks it for a miss).
        async fn generation_read(&self, fill: &Fill) -> Option<Bytes> {
            match self.read(fill).await {
                Ok(Found::Miss(Some(generation))) => Some(generation),
                Ok(Found::Miss(None)) => generation(fill).await,
                other => panic!("expected a miss: {other:?}"),
            }
        }

        /// Joins (or starts) the fill in a task of its own, as a request does.
        fn spawn_join(
            &self,
            fill: &Arc<Fill>,
            generation: Option<Bytes>,
        ) -> tokio::task::JoinHandle<(Arc<Answer>, bool)> {
            let (flights, fill) = (Arc::clone(&self.pipeline.flights), Arc::clone(fill));
            tokio::spawn(async move { join(&flights, &fill, generation).await })
        }

        fn publish_count(&self, outcome: FillOutcome) -> u64 {
            let metrics = &self.pipeline.shared.metrics;
            let labels = [self.route.name.as_str(), outcome.as_str()];
            metrics.publish.with_label_values(&labels).get()
        }

        fn coalesced(&self) -> u64 {
            let metrics = &self.pipeline.shared.metrics;
            metrics
                .coalesced
                .with_label_values(&[&self.route.name])
                .get()
        }

        /// Waits until `n` requests have joined a running flight.
        async fn joined(&self, n: u64) {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while self.coalesced() < n {
                let waited = tokio::time::Instant::now() < deadline;
                assert!(waited, "the request never joined the running fill");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    /// The fill's final answer (a streamed one's, once its body is read).
    async fn finished(task: tokio::task::JoinHandle<(Arc<Answer>, bool)>) -> (Arc<Answer>, bool) {
        let (answer, started) = match tokio::time::timeout(PATIENCE, task).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => panic!("join task failed: {e}"),
            Err(_) => panic!("the fill never finished"),
        };
        match answer.as_ref() {
            Answer::Streaming(_, streaming) => {
                let done = tokio::time::timeout(PATIENCE, streaming.finished()).await;
                (done.expect("the streamed fill never finished"), started)
            }
            _ => (answer, started),
        }
    }

    /// The status and body of an answer every joined request may receive.
    fn shared(answer: &Answer) -> (CacheOutcome, Bytes) {
        match answer {
            Answer::Shared(status, entry, _) => (*status, entry.body.clone()),
            Answer::Starter(status, _) => panic!("a starter-only answer ({status:?})"),
            Answer::Exclusive(status, _) => panic!("a one-client answer ({status:?})"),
            Answer::Failed(status, e) => panic!("a failed fill ({status:?}): {e}"),
            Answer::Streaming(status, _) => panic!("a streaming answer ({status:?})"),
        }
    }

    #[tokio::test]
    async fn a_cold_miss_fills_and_publishes_and_the_next_read_is_a_hit() {
        let h = harness().await;
        h.origin.release();
        let fill = h.fill("1");
        let generation = h.generation_read(&fill).await;
        assert!(generation.is_some(), "a cold miss takes a ticket");
        let (answer, started) = finished(h.spawn_join(&fill, generation)).await;
        assert!(started);
        assert_eq!(
            shared(&answer),
            (CacheOutcome::Miss, Bytes::from("answer 1"))
        );
        assert_eq!(h.publish_count(FillOutcome::Published), 1);
        match h.read(&h.fill("1")).await {
            Ok(Found::Fresh(entry)) => assert_eq!(entry.body, "answer 1"),
            other => panic!("the next read is not a hit: {other:?}"),
        }
        assert_eq!(h.origin.calls(), 1);
    }

    #[tokio::test]
    async fn concurrent_misses_for_one_key_make_one_origin_call() {
        let mut h = harness().await;
        let first = h.fill("1");
        let read_first = h.generation_read(&first).await;
        let first = h.spawn_join(&first, read_first.clone());
        // The first fill holds the lease and waits for the origin.
        h.origin.arrival().await;
        let second = h.fill("1");
        let read_second = h.generation_read(&second).await;
        assert_eq!(read_second, read_first, "both read the same generation");
        let second = h.spawn_join(&second, read_second);
        h.joined(1).await;
        h.origin.release();
        let (first, first_started) = finished(first).await;
        let (second, second_started) = finished(second).await;
        assert!(first_started && !second_started);
        assert!(Arc::ptr_eq(&first, &second), "one answer for both");
        assert_eq!(
            shared(&second),
            (CacheOutcome::Miss, Bytes::from("answer 1"))
        );
        assert_eq!(h.origin.calls(), 1);
        assert_eq!(h.publish_count(FillOutcome::Published), 1);
    }

    #[tokio::test]
    async fn a_fill_invalidated_during_its_upstream_call_is_not_published() {
        let mut h = harness().await;
        let fill = h.fill("1");
        let read = h.generation_read(&fill).await;
        let task = h.spawn_join(&fill, read.clone());
        // The fill has its ticket and waits for the origin: invalidate now.
        h.origin.arrival().await;
        let store = &h.pipeline.shared.store;
        let gen_key = fill.key.keys.generation();
        store
            .invalidate(gen_key, "inv", h.cfg.gen_ttl)
            .await
            .expect("invalidate");
        h.origin.release();
        let (answer, _) = finished(task).await;
        // Its requests read the old generation and get its answer ...
        assert_eq!(
            shared(&answer),
            (CacheOutcome::Miss, Bytes::from("answer 1"))
        );
        // ... which is not stored over the invalidation.
        assert_eq!(h.publish_count(FillOutcome::Rejected), 1);
        assert_eq!(h.publish_count(FillOutcome::Published), 0);
        match h.read(&fill).await {
            Ok(Found::Miss(Some(now))) => assert_ne!(Some(now), read, "a new generation"),
            other => panic!("expected a miss after the invalidation: {other:?}"),
        }
    }

    #[tokio::test]
    async fn degraded_misses_share_one_fetch_and_write_nothing() {
        let mut h = harness().await;
        // No generation: the chart found the store unreadable.
        let first = h.spawn_join(&h.fill("1"), None);
        h.origin.arrival().await;
        let second = h.spawn_join(&h.fill("1"), None);
        h.joined(1).await;
        h.origin.release();
        let (first, first_started) = finished(first).await;
        let (second, second_started) = finished(second).await;
        assert!(first_started && !second_started);
        assert!(Arc::ptr_eq(&first, &second), "one answer for both");
        let answer = (CacheOutcome::Degraded, Bytes::from("answer 1"));
        assert_eq!(shared(&second), answer);
        assert_eq!(h.origin.calls(), 1);
        assert_eq!(h.publish_count(FillOutcome::Published), 0);
        assert!(matches!(h.read(&h.fill("1")).await, Ok(Found::Miss(None))));
    }
}
