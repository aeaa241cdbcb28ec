//! The accept loop with graceful drain, shared by the client-facing and
//! the admin listener, and the admin listener's connection builder.

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{info, warn};

/// A client that sends no complete request head within this time is dropped.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin listener's connection builder: HTTP/1.1 with keep-alive and a
/// header timeout (which needs a timer, or hyper panics), and h2c.
pub fn builder() -> auto::Builder<TokioExecutor> {
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
/// every `Draining` is dropped, i.e. every connection task has ended.
pub struct Draining(watch::Receiver<bool>);

impl Draining {
    pub async fn started(&mut self) {
        // An error means the listener is gone: draining as well.
        let _ = self.0.wait_for(|draining| *draining).await;
    }

    /// Runs a hyper connection to its end; once draining starts, asks it to
    /// finish the request in progress and close (`graceful`), and goes on
    /// polling it.
    pub async fn serve<C, T, E>(
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

/// Accepts connections until `shutdown` turns true, handing each to
/// `handle` together with its [`Draining`]; then stops accepting, tells the
/// connections, and waits up to `drain` for them to finish.
pub async fn accept_until<H>(
    name: &'static str,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    handle: H,
) where
    H: Fn(TcpStream, SocketAddr, Draining) + Send,
{
    let (draining_tx, draining) = watch::channel(false);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Small responses should not wait for Nagle.
                let _ = stream.set_nodelay(true);
                handle(stream, peer, Draining(draining.clone()));
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
