//! Stage 5 inside one instance: single-flight. Concurrent misses for the
//! same key share one fill task and its answer. The fill runs in its own
//! task, so a client that disconnects cannot cancel it halfway (which would
//! strand the lease or abandon the other waiters).
//!
//! A fill is joined only by requests that read the same generation of the
//! object ([`FlightKey::Fill`]): one that started before an invalidation
//! fetched before it, and a request that read the new generation must not
//! be handed that answer
//! (docs/architecture.md#no-older-answer-after-an-invalidation). Its fill's
//! ticket is taken after its requests' reads, so it is their generation or a
//! newer one; an invalidation in between only costs a fill of its own, never an
//! older answer.
//!
//! A degraded fetch has no generation to key on, so it is joined only while
//! it is younger than the route's `degraded_join_window`: a request that
//! comes later starts a fetch of its own, so a DEGRADED answer never read the
//! service more than that window before its request arrived
//! (docs/architecture.md#degraded-answers-are-never-older-than-the-window).

use super::entry::Entry;
use super::tee::Tee;
use crate::body::Body;
use crate::error::ProxyError;
use crate::outcome::CacheOutcome;
use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::Response;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// The outcome of one fill, as seen by every request that joined it.
pub(crate) enum Answer {
    /// A response any coalesced request may receive, and what its trip
    /// upstream did.
    Shared(CacheOutcome, Arc<Entry>, Trip),
    /// A response for one client only (streamed, or private to the client
    /// whose request was sent upstream): only the request that started the
    /// flight takes it; the others fetch their own.
    Exclusive(CacheOutcome, Mutex<Option<Response<Body>>>),
    /// An entry only the request that started the flight may receive: a
    /// tag of the object was invalidated while the fill ran (or the fill
    /// had no ticket for the tags its answer carries), and a request that
    /// joined after that invalidation must not be handed an answer fetched
    /// before it: flights are keyed by the object's generation, which a tag
    /// invalidation leaves alone
    /// (docs/architecture.md#no-older-answer-after-an-invalidation). The others
    /// fetch their own.
    Starter(CacheOutcome, Arc<Entry>),
    Failed(CacheOutcome, ProxyError),
    /// A shareable answer whose body is still arriving: every waiter reads
    /// it from the fill's tee as the origin sends it (`tee`); what the fill
    /// then made of it, for a waiter that needs the whole body
    /// ([`Streaming::finished`]).
    Streaming(CacheOutcome, Arc<Streaming>),
}

/// A fill's answer handed to its waiters before its body is read.
pub(crate) struct Streaming {
    /// The answer's entry as it will be published, without its body (and
    /// without a derived `ETag`, which needs the body).
    pub head: Entry,
    /// The origin's `Content-Length`, if it sent one.
    pub length: Option<u64>,
    pub tee: Arc<Tee>,
    done: watch::Receiver<Option<Arc<Answer>>>,
}

impl Streaming {
    /// The fill's final answer, once its body is read and judged (for a
    /// waiter that needs the whole body: HEAD, preconditions, ranges).
    pub(crate) async fn finished(&self) -> Arc<Answer> {
        let mut done = self.done.clone();
        let answer = done.wait_for(Option::is_some).await;
        match answer.ok().and_then(|a| a.as_ref().cloned()) {
            Some(answer) => answer,
            None => Arc::new(Answer::Failed(
                CacheOutcome::Miss,
                ProxyError::Bug("fill task failed".into()),
            )),
        }
    }
}

/// How a fill announces its answer to the flight's waiters: at its end,
/// or earlier as a [`Streaming`] answer once the origin's head is in. A
/// silent herald (a fill nobody waits for) cannot stream.
#[derive(Clone)]
pub(crate) struct Herald(Option<Arc<Mutex<Heralds>>>);

struct Heralds {
    /// The flight's answer, until it is given.
    first: Option<oneshot::Sender<Arc<Answer>>>,
    /// After a streaming answer: the final one.
    done: Option<watch::Sender<Option<Arc<Answer>>>>,
}

impl Herald {
    fn new(first: oneshot::Sender<Arc<Answer>>) -> Herald {
        Herald(Some(Arc::new(Mutex::new(Heralds {
            first: Some(first),
            done: None,
        }))))
    }

    /// For a fill whose answer goes to no waiter (the grace refresh).
    pub(crate) fn silent() -> Herald {
        Herald(None)
    }

    /// Someone may await this fill's answer before its end.
    pub(crate) fn can_stream(&self) -> bool {
        self.0.as_ref().is_some_and(|h| {
            let h = h.lock().unwrap_or_else(|p| p.into_inner());
            h.first.is_some()
        })
    }

    /// Answers the flight now with `head` and the body `tee` will carry;
    /// false if it was answered already.
    pub(crate) fn stream(
        &self,
        outcome: CacheOutcome,
        head: Entry,
        length: Option<u64>,
        tee: Arc<Tee>,
    ) -> bool {
        let Some(inner) = &self.0 else {
            return false;
        };
        let mut h = inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(first) = h.first.take() else {
            return false;
        };
        let (tx, done) = watch::channel(None);
        h.done = Some(tx);
        let streaming = Streaming {
            head,
            length,
            tee,
            done,
        };
        let _ = first.send(Arc::new(Answer::Streaming(outcome, Arc::new(streaming))));
        true
    }

    /// The fill's final answer: the flight's, or what a streaming answer's
    /// waiters that need the whole body receive.
    fn finish(&self, answer: Arc<Answer>) {
        let Some(inner) = &self.0 else {
            return;
        };
        let mut h = inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = h.first.take() {
            let _ = first.send(answer);
        } else if let Some(done) = &h.done {
            done.send_replace(Some(answer));
        }
    }
}

/// What a fill's upstream call did, for `Cache-Status`
/// (docs/caching.md#cache-status); the default for an answer read from the
/// store, which made no call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Trip {
    /// The status the service answered (`304` for a revalidation that
    /// kept the entry).
    pub fwd_status: Option<u16>,
    /// The answer was written to the store.
    pub stored: bool,
}

type SharedAnswer = Shared<BoxFuture<'static, Arc<Answer>>>;

/// What a flight is for; requests join a running flight with an equal key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum FlightKey {
    /// A fill (stages 5-9) for the requests that read `generation`.
    Fill { entry: String, generation: Bytes },
    /// The grace refresh of an expired entry of `generation`. Never joined
    /// by a foreground miss, which would inherit its "busy" answer.
    Refresh { entry: String, generation: Bytes },
    /// A degraded fetch: the store, and so the generation, is unreadable.
    Degraded { entry: String },
}

/// One running flight: its answer, when it started, and an id so that
/// only the flight itself removes its key (a younger one may replace it).
struct Running {
    answer: SharedAnswer,
    started: Instant,
    id: u64,
}

#[derive(Default)]
struct Inflight {
    flights: HashMap<FlightKey, Running>,
    next_id: u64,
}

#[derive(Default)]
pub(crate) struct Flights {
    inflight: Mutex<Inflight>,
}

/// What [`Flights::join`] did for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Started the flight: none was running.
    Started,
    /// Joined a running flight.
    Joined,
    /// Started a flight of its own that replaced a running one older than
    /// the request may join.
    Replaced,
}

impl Role {
    /// The request started the flight it awaits (and may take an answer
    /// meant for the starter only).
    pub(crate) fn started(self) -> bool {
        self != Role::Joined
    }
}

impl Flights {
    /// Joins the flight for `key`, starting it with `start` if none is
    /// running, or if the running one started `max_age` or longer ago
    /// (`None`: any age; a zero age never joins). A flight started beside
    /// an older one replaces it for the requests after it; the older one
    /// still answers those that joined it.
    pub(crate) fn join(
        self: &Arc<Self>,
        key: FlightKey,
        max_age: Option<Duration>,
        start: impl FnOnce(Herald) -> BoxFuture<'static, Answer>,
    ) -> (SharedAnswer, Role) {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        let role = match map.flights.get(&key) {
            None => Role::Started,
            Some(running) if max_age.is_none_or(|max| running.started.elapsed() < max) => {
                return (running.answer.clone(), Role::Joined);
            }
            Some(_) => Role::Replaced,
        };
        let (first, answer) = oneshot::channel();
        let herald = Herald::new(first);
        let fill = start(herald.clone());
        let flights = Arc::clone(self);
        let owned_key = key.clone();
        let id = map.next_id;
        map.next_id += 1;
        tokio::spawn(async move {
            // Removed on completion or panic alike, so later requests start a
            // new flight (and usually find the entry this one published).
            let done = Leave(flights, owned_key, id);
            let answer = Arc::new(fill.await);
            drop(done);
            herald.finish(answer);
        });
        // A fill that panicked dropped its herald unanswered.
        let shared = async move {
            answer.await.unwrap_or_else(|_| {
                Arc::new(Answer::Failed(
                    CacheOutcome::Miss,
                    ProxyError::Bug("fill task failed".into()),
                ))
            })
        }
        .boxed()
        .shared();
        let running = Running {
            answer: shared.clone(),
            started: Instant::now(),
            id,
        };
        map.flights.insert(key, running);
        (shared, role)
    }
}

struct Leave(Arc<Flights>, FlightKey, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        let mut map = self.0.inflight.lock().unwrap_or_else(|p| p.into_inner());
        // A younger flight of the same key may have replaced this one.
        if map.flights.get(&self.1).is_some_and(|r| r.id == self.2) {
            map.flights.remove(&self.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> FlightKey {
        FlightKey::Degraded { entry: "e".into() }
    }

    /// A flight that answers `body` once `go` fires.
    fn held(body: &'static str, go: oneshot::Receiver<()>) -> BoxFuture<'static, Answer> {
        async move {
            let _ = go.await;
            let entry = Entry {
                status: 200,
                negative: false,
                stored_at_ms: 0,
                fresh_until_ms: 0,
                grace_ms: 0,
                stale_if_error_ms: 0,
                generation: Bytes::new(),
                identity: Bytes::new(),
                variant: Bytes::new(),
                headers: Vec::new(),
                body: Bytes::from_static(body.as_bytes()),
                tags: Vec::new(),
            };
            Answer::Shared(CacheOutcome::Degraded, Arc::new(entry), Trip::default())
        }
        .boxed()
    }

    fn body(answer: &Arc<Answer>) -> Bytes {
        match answer.as_ref() {
            Answer::Shared(_, entry, _) => entry.body.clone(),
            _ => panic!("not a shared answer"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flight_is_joined_only_while_younger_than_the_max_age() {
        let flights = Arc::new(Flights::default());
        let window = Some(Duration::from_millis(20));
        let (go_a, wait_a) = oneshot::channel();
        let (a, role) = flights.join(key(), window, |_| held("a", wait_a));
        assert_eq!(role, Role::Started);
        tokio::time::advance(Duration::from_millis(19)).await;
        let (b, role) = flights.join(key(), window, |_| unreachable!("b joins a"));
        assert_eq!(role, Role::Joined);
        tokio::time::advance(Duration::from_millis(1)).await;
        // 20 ms old: too old to join; a fetch of its own replaces it.
        let (go_c, wait_c) = oneshot::channel();
        let (c, role) = flights.join(key(), window, |_| held("c", wait_c));
        assert_eq!(role, Role::Replaced);
        assert!(role.started());
        let (d, role) = flights.join(key(), window, |_| unreachable!("d joins c"));
        assert_eq!(role, Role::Joined);
        // The older flight ends first and must not remove the younger one.
        let _ = go_a.send(());
        assert_eq!((body(&a.await), body(&b.await)), ("a".into(), "a".into()));
        let (e, role) = flights.join(key(), window, |_| unreachable!("e joins c"));
        assert_eq!(role, Role::Joined);
        let _ = go_c.send(());
        for flight in [c, d, e] {
            assert_eq!(body(&flight.await), "c");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_max_age_never_joins_and_none_always_does() {
        let flights = Arc::new(Flights::default());
        let (_go, wait) = oneshot::channel();
        let (_a, role) = flights.join(key(), Some(Duration::ZERO), |_| held("a", wait));
        assert_eq!(role, Role::Started);
        let (_go, wait) = oneshot::channel();
        let (_b, role) = flights.join(key(), Some(Duration::ZERO), |_| held("b", wait));
        assert_eq!(role, Role::Replaced);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let (_c, role) = flights.join(key(), None, |_| unreachable!("no max age"));
        assert_eq!(role, Role::Joined);
    }
}
