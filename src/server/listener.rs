//! The accept loop with graceful drain, shared by the client-facing and
//! the admin listener; the client listener's connection cap; and the admin
//! listener's connection builder.

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus::{IntCounter, IntGauge};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The admin listener's header timeout: a client that sends no complete
/// request head within this time is dropped. (The client listener's is
/// `limits.header_timeout`.)
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin listener's connection builder: HTTP/1.1 with keep-alive and a
/// header timeout (which needs a timer, or hyper panics), and h2c.
pub(crate) fn builder() -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    b.http2().timer(TokioTimer::new());
    b
}

/// A connection's side of its listener's drain: [`Draining::started`]
/// resolves once the listener stops, and the listener waits (bounded) until
/// every `Draining` is dropped, i.e. every connection task has ended. Also
/// the connection's side of shedding at the connection cap ([`Shed`]).
pub(crate) struct Draining {
    drain: watch::Receiver<bool>,
    shed: Shed,
}

impl Draining {
    pub(crate) async fn started(&mut self) {
        // An error means the listener is gone: draining as well.
        let _ = self.drain.wait_for(|draining| *draining).await;
    }

    /// For a connection that is idle: resolves when draining starts or
    /// when the listener, at its connection cap, asks idle connections to
    /// make room (see [`Shed`]).
    pub(crate) async fn started_or_shed(&mut self) {
        tokio::select! {
            _ = self.drain.wait_for(|draining| *draining) => {}
            _ = self.shed.requested() => {}
        }
    }

    /// A handle on the shed requests, for a watcher that runs beside
    /// [`Draining::serve`].
    pub(crate) fn shed_handle(&self) -> Shed {
        self.shed.clone()
    }

    /// Runs a hyper connection to its end; once draining starts, asks it to
    /// finish the request in progress and close (`graceful`), and goes on
    /// polling it.
    pub(crate) async fn serve<C, T, E>(
        &mut self,
        mut conn: Pin<&mut C>,
        graceful: impl FnOnce(Pin<&mut C>),
    ) -> Result<T, E>
    where
        C: Future<Output = Result<T, E>>,
    {
        tokio::select! {
            result = conn.as_mut() => result,
            _ = self.started() => {
                graceful(conn.as_mut());
                conn.await
            }
        }
    }
}

/// Requests to idle connections to close, sent by the accept loop when it
/// is at the connection cap (and again every [`RECHECK_CAP`] while it
/// stays there): a connection that is waiting for a client's first bytes,
/// parked between keep-alive requests, or an HTTP/2 connection with no
/// request in flight closes, so that new clients are not held in the
/// backlog by connections that do nothing (nginx reuses idle keep-alive
/// connections the same way). Connections with a request in flight are
/// left alone, and so is a connection younger than [`SHED_MIN_AGE`] (its
/// client may not have sent its first bytes yet): the requests repeat while
/// the cap holds, so it is asked again once it is older.
#[derive(Clone)]
pub(crate) struct Shed {
    requests: Option<watch::Receiver<u64>>,
    accepted: Instant,
}

/// A connection accepted less than this long ago ignores shed requests.
pub(crate) const SHED_MIN_AGE: Duration = Duration::from_secs(1);

impl Shed {
    /// Resolves at the next shed request that finds this connection old
    /// enough; never without a cap.
    pub(crate) async fn requested(&mut self) {
        let Some(rx) = &mut self.requests else {
            return std::future::pending().await;
        };
        loop {
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            if self.accepted.elapsed() >= SHED_MIN_AGE {
                return;
            }
        }
    }
}

/// The client listener's cap on open connections (`limits.max_connections`).
/// At the cap the accept loop stops calling `accept` until a connection
/// closes: new clients wait in the kernel's backlog (their connect
/// completes, their request waits) instead of being accepted and closed in
/// a loop, and the process never runs into EMFILE. Idle connections are
/// asked to close meanwhile ([`Shed`]). One limit may serve several accept
/// loops (`server.runtime: per_core`): a loop that accepted a connection
/// after another took the last place waits at the cap with it, so the cap
/// holds exactly and each loop holds at most one socket beyond it.
pub(crate) struct ConnectionLimit {
    /// Read before every accept, so a reload applies at once.
    max: Box<dyn Fn() -> usize + Send + Sync>,
    /// Open connections, taken with a compare-and-swap: with several
    /// accept loops (`server.runtime: per_core`) two may find the last
    /// place free at once, and only one may take it.
    count: AtomicUsize,
    /// The exported gauge of `count`.
    open: IntGauge,
    /// Times accepting paused at the cap.
    paused: IntCounter,
    /// Woken (one permit kept if nobody waits) when a connection closes.
    closed: Notify,
    /// Shed requests: a generation count the idle connections watch.
    shed: watch::Sender<u64>,
}

impl ConnectionLimit {
    pub(crate) fn new(
        max: impl Fn() -> usize + Send + Sync + 'static,
        open: IntGauge,
        paused: IntCounter,
    ) -> Arc<ConnectionLimit> {
        Arc::new(ConnectionLimit {
            max: Box::new(max),
            count: AtomicUsize::new(0),
            open,
            paused,
            closed: Notify::new(),
            shed: watch::Sender::new(0),
        })
    }

    /// Waits until a connection may be accepted; false if `shutdown` came
    /// first.
    async fn room(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let mut paused = false;
        while self.count.load(Ordering::Acquire) >= (self.max)() {
            if !paused {
                paused = true;
                self.paused.inc();
                debug!(
                    open = self.open.get(),
                    "connection cap reached; accepting paused, idle connections shed"
                );
            }
            self.shed
                .send_modify(|generation| *generation = generation.wrapping_add(1));
            tokio::select! {
                _ = self.closed.notified() => {}
                // A reload may raise the cap while nothing closes.
                _ = tokio::time::sleep(RECHECK_CAP) => {}
                _ = shutdown.wait_for(|stop| *stop) => return false,
            }
        }
        true
    }
}

impl ConnectionLimit {
    /// Takes a place for a connection just accepted; false if another
    /// accept loop took the last one since [`Self::room`] said there was one.
    fn try_claim(&self) -> bool {
        let max = (self.max)();
        let claimed = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if claimed {
            self.open.inc();
        }
        claimed
    }
}

/// How often a paused accept loop re-reads the cap.
const RECHECK_CAP: Duration = Duration::from_millis(500);

/// One open connection under a [`ConnectionLimit`]; dropping it (when the
/// connection task ends) frees the place.
pub(crate) struct ConnectionSlot(Option<Arc<ConnectionLimit>>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(limit) = &self.0 {
            limit.count.fetch_sub(1, Ordering::AcqRel);
            limit.open.dec();
            limit.closed.notify_one();
        }
    }
}

/// Accepts connections until `shutdown` turns true, handing each to
/// `handle` together with its [`Draining`]; then stops accepting, tells the
/// connections, and waits up to `drain` for them to finish.
pub(crate) async fn accept_until<H>(
    name: &'static str,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
    handle: H,
) where
    H: Fn(TcpStream, SocketAddr, Draining) + Send,
{
    accept_limited(name, listener, shutdown, drain, None, move |s, p, d, _| {
        handle(s, p, d)
    })
    .await
}

/// [`accept_until`] under an optional [`ConnectionLimit`]: each connection
/// also gets its [`ConnectionSlot`], to hold until it ends.
pub(crate) async fn accept_limited<H>(
    name: &'static str,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    limit: Option<Arc<ConnectionLimit>>,
    handle: H,
) where
    H: Fn(TcpStream, SocketAddr, Draining, ConnectionSlot) + Send,
{
    let (draining_tx, draining) = watch::channel(false);
    'accept: loop {
        if let Some(limit) = &limit {
            if !limit.room(&mut shutdown).await {
                break;
            }
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Some(limit) = &limit {
                    // Another accept loop may have taken the last place
                    // since `room`: this one waits at the cap with the
                    // socket in hand (one per loop at most).
                    while !limit.try_claim() {
                        if !limit.room(&mut shutdown).await {
                            break 'accept;
                        }
                    }
                }
                // Small responses should not wait for Nagle.
                let _ = stream.set_nodelay(true);
                let slot = ConnectionSlot(limit.clone());
                let shed = Shed {
                    requests: limit.as_ref().map(|l| l.shed.subscribe()),
                    accepted: Instant::now(),
                };
                let draining = Draining {
                    drain: draining.clone(),
                    shed,
                };
                handle(stream, peer, draining, slot);
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    drop(draining);
    info!(
        listener = name,
        connections = draining_tx.receiver_count(),
        "draining"
    );
    let _ = draining_tx.send(true);
    if tokio::time::timeout(drain, draining_tx.closed())
        .await
        .is_err()
    {
        warn!(
            listener = name,
            "connections still open after the drain period; closing them"
        );
    }
}
