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

use super::entry::Entry;
use crate::body::Body;
use crate::error::ProxyError;
use crate::outcome::CacheOutcome;
use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::Response;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

#[derive(Default)]
pub(crate) struct Flights {
    inflight: Mutex<HashMap<FlightKey, SharedAnswer>>,
}

impl Flights {
    /// Joins the flight for `key`, starting it with `start` if none is
    /// running. The flag is true for the request that started it.
    pub(crate) fn join(
        self: &Arc<Self>,
        key: FlightKey,
        start: impl FnOnce() -> BoxFuture<'static, Answer>,
    ) -> (SharedAnswer, bool) {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(&key) {
            return (existing.clone(), false);
        }
        let fill = start();
        let flights = Arc::clone(self);
        let owned_key = key.clone();
        let task = tokio::spawn(async move {
            // Removed on completion or panic alike, so later requests start a
            // new flight (and usually find the entry this one published).
            let _done = Leave(flights, owned_key);
            Arc::new(fill.await)
        });
        let shared = async move {
            task.await.unwrap_or_else(|e| {
                Arc::new(Answer::Failed(
                    CacheOutcome::Miss,
                    ProxyError::Bug(format!("fill task failed: {e}")),
                ))
            })
        }
        .boxed()
        .shared();
        map.insert(key, shared.clone());
        (shared, true)
    }
}

struct Leave(Arc<Flights>, FlightKey);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}
