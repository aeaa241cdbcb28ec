//! The runtime layout (`server.runtime`): which threads run the client
//! listener and everything else.
//!
//! - `multi_thread` (default): one tokio work-stealing runtime runs
//!   everything; one listener.
//! - `per_core`: like nginx's workers. `server.workers` threads (default:
//!   one per CPU this process may run on), each with a current-thread
//!   runtime, its own `SO_REUSEPORT` listener on `listen` (the kernel spreads
//!   new connections over them) and its own upstream pool for forwarding; a
//!   connection stays on the thread that accepted it, so a request is never
//!   handed between threads. The config, the store, the read pipeline (and
//!   its fill client), metrics and the connection cap stay shared; the admin
//!   listener, invalidation and the store's connections run on the main
//!   thread's own current-thread runtime.

use super::listener::ConnectionLimit;
use super::ProxyState;
use crate::config::ServerConfig;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};

/// The listen backlog of each per-core listener (what `TcpListener::bind`
/// uses).
const BACKLOG: u32 = 1024;

/// How many per-core workers: `server.workers`, else one per CPU this
/// process may run on (its affinity mask and cgroup quota, as tokio counts).
pub(crate) fn worker_count(cfg: &ServerConfig) -> usize {
    cfg.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}

/// `workers` listeners on `listen` with `SO_REUSEPORT`, all on the port
/// the first one got (`listen` may ask for port 0). Bound here, on the
/// caller's thread, so a port in use fails the start; handed to the
/// workers as std listeners (a tokio listener belongs to the runtime that
/// made it).
pub(crate) fn bind_reuseport(
    listen: SocketAddr,
    workers: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    let mut addr = listen;
    let mut bound = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // As `TcpListener::bind` does: a restart can bind while old
        // connections linger in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(BACKLOG)?;
        addr = listener.local_addr()?;
        bound.push(listener.into_std()?);
    }
    Ok(bound)
}

/// Starts one worker thread per listener, each serving its listener with
/// a [`ProxyState`] from `state` (called on the worker, inside its
/// runtime, so its upstream pool's tasks live there) under the shared
/// `limit`, until `shutdown`; then each drains for up to `drain`. Resolves
/// once every worker runs; the returned receivers resolve (or fail, if a
/// worker died) when each has finished.
pub(crate) async fn start_workers(
    listeners: Vec<std::net::TcpListener>,
    state: Arc<dyn Fn() -> Arc<ProxyState> + Send + Sync>,
    limit: Arc<ConnectionLimit>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) -> io::Result<Vec<oneshot::Receiver<()>>> {
    let mut finished = Vec::with_capacity(listeners.len());
    let mut started = Vec::with_capacity(listeners.len());
    for (i, listener) in listeners.into_iter().enumerate() {
        let (ready_tx, ready_rx) = oneshot::channel::<io::Result<()>>();
        let (done_tx, done_rx) = oneshot::channel();
        let (state, limit, shutdown) = (state.clone(), limit.clone(), shutdown.clone());
        std::thread::Builder::new()
            .name(format!("sc-worker-{i}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    super::serve(listener, state(), limit, shutdown, drain).await;
                });
                // Dropping the runtime ends what did not drain in time.
                drop(runtime);
                let _ = done_tx.send(());
            })?;
        started.push(ready_rx);
        finished.push(done_rx);
    }
    for ready in started {
        match ready.await {
            Ok(result) => result?,
            Err(_) => return Err(io::Error::other("a worker thread ended while starting")),
        }
    }
    Ok(finished)
}
