//! HTTP/2 (h2c) client connections: served by hyper, never parked, and
//! watched from outside for the idle and send timeouts hyper has no
//! setting for.

use super::framing::{FramingGuard, FramingState, SendTimedOut};
use super::listener::{self, Draining};
use super::{caused_by, count_client_error, ClientBody};
use crate::config::LimitsConfig;
use crate::metrics::{client_error, Metrics};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

/// How long an idle HTTP/2 connection gets to say goodbye (GOAWAY flushed,
/// the client's PING answered) before the socket is closed anyway.
const H2_GOODBYE: Duration = Duration::from_secs(1);
/// Why an HTTP/2 connection's watch ended it.
enum H2End {
    /// No stream open, none started or finished, for `idle_timeout`.
    Idle,
    /// Response data waited for the client's flow-control window, and no
    /// body on the connection was polled, for `send_timeout`.
    Stalled,
}

/// An HTTP/2 (h2c) client connection, never parked; closed when idle or
/// when its client stops taking responses (see [`h2_watch`]).
pub(super) async fn serve_h2<S>(
    io: FramingGuard<TcpStream>,
    svc: S,
    peer: SocketAddr,
    mut draining: Draining,
    watched: &FramingState,
    limits: &LimitsConfig,
    metrics: &Metrics,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ClientBody, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let mut conn = std::pin::pin!(builder.serve_connection(TokioIo::new(io), svc));
    let shed = draining.shed_handle();
    let ended = tokio::select! {
        served = draining.serve(conn.as_mut(), |conn| conn.graceful_shutdown()) => {
            if let Err(e) = served {
                debug!(%peer, error = %e, "client connection ended with an error");
                if caused_by::<SendTimedOut>(&e) {
                    count_client_error(metrics, client_error::SEND_TIMEOUT);
                }
            }
            return;
        }
        ended = h2_watch(watched, limits, shed) => ended,
    };
    match ended {
        H2End::Idle => {
            debug!(%peer, "idle HTTP/2 connection closed");
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(H2_GOODBYE, conn).await;
        }
        H2End::Stalled => {
            // Dropping the connection resets every stream; their bodies,
            // and the upstream connections under them, go with it.
            debug!(%peer, "HTTP/2 client took nothing for the send timeout");
            count_client_error(metrics, client_error::SEND_TIMEOUT);
        }
    }
}

/// Watches an HTTP/2 connection from outside hyper, which has neither an
/// idle timeout nor a send timeout for HTTP/2: every quarter of the shorter
/// timeout it looks at the connection's counters. Idle: no request in
/// flight and none started or finished (a client that sent the preface and
/// SETTINGS only, or a HEADERS block it never finishes, is idle). Stalled:
/// a response body handed out a frame and was not asked for the next, and
/// no body on the connection was polled (hyper polls a body only when the
/// client's window has room; a blocked socket is the framing guard's send
/// timeout). So either ends the connection within a quarter past its
/// timeout. One timer per HTTP/2 connection, nothing per request. At the
/// connection cap ([`listener::Shed`]) a connection with no request in
/// flight counts as idle at once.
async fn h2_watch(state: &FramingState, limits: &LimitsConfig, mut shed: listener::Shed) -> H2End {
    let tick = (limits.idle_timeout.min(limits.send_timeout) / 4).max(Duration::from_millis(20));
    let mut ticks = tokio::time::interval_at(Instant::now() + tick, tick);
    let (mut idle_for, mut stalled_for) = (Duration::ZERO, Duration::ZERO);
    let mut last = (state.requests(), state.body_progress().0);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shed.requested() => {
                let (started, finished) = state.requests();
                if started == finished {
                    return H2End::Idle;
                }
                continue;
            }
        }
        let requests = state.requests();
        let (polls, waiting) = state.body_progress();
        let quiet = (requests, polls) == last;
        idle_for = if quiet && requests.0 == requests.1 {
            idle_for + tick
        } else {
            Duration::ZERO
        };
        stalled_for = if waiting && polls == last.1 {
            stalled_for + tick
        } else {
            Duration::ZERO
        };
        if idle_for >= limits.idle_timeout {
            return H2End::Idle;
        }
        if stalled_for >= limits.send_timeout {
            return H2End::Stalled;
        }
        last = (requests, polls);
    }
}
