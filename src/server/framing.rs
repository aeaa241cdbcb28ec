//! A read-side guard on each client HTTP/1 connection that spots request
//! heads carrying both `Content-Length` and `Transfer-Encoding`.
//!
//! Why it exists: hyper's parser accepts such a request by silently dropping
//! the `Content-Length` (RFC 9112 §6.3 allows that), so the handler can no
//! longer see the ambiguity, which must be refused with 400 and never forwarded
//! (docs/architecture.md#forwarding). The guard follows the byte stream exactly
//! as an HTTP/1 server must (head, then a `Content-Length` or chunked body) and
//! records the index of the first ambiguous request; the handler counts its
//! requests and refuses that one. Differing `Content-Length`s and non-chunked
//! `Transfer-Encoding` are rejected by hyper itself and need nothing here.
//!
//! The guard stops following (and stays silent) on HTTP/2, on a request that
//! asks for `Upgrade`/`CONNECT` (what follows may be a tunnel), or on bytes it
//! cannot frame; hyper then rejects or re-frames those itself. Since
//! forwarding always re-frames bodies, an unfollowed stream cannot smuggle a
//! request past the upstream; the guard exists to answer 400 as specified.
//!
//! Since it knows where requests begin, the guard also tells when an HTTP/1
//! connection is idle, for parking (see [`FramingGuard::park_when_idle`] and
//! `server`): every request head it saw has been answered (the response
//! body was dropped by hyper, [`FramingState::response_finished`]), hyper
//! flushed everything it wrote, and no partial head is pending.
//!
//! Being the connection's IO, the guard also enforces two of `limits`:
//! - the send timeout: a write or flush that stays blocked (the client reads
//!   nothing, its receive window and our send buffer are full) for
//!   `send_timeout` fails with `TimedOut`, and hyper drops the connection
//!   and with it the response body and its upstream connection. Costs
//!   nothing while writes go through: the timer exists only during a stall.
//! - the head size: a head it follows is only copied up to the connection's
//!   `max_header_bytes` (hyper answers 431 beyond that), so an unfinished
//!   head costs at most that here.
//! - the target length: a request line whose target grows past
//!   `max_target_bytes` before the head is complete is answered `414` here
//!   and the connection closed (hyper would answer 431 once the head passed
//!   `max_header_bytes`, and a complete head's target is the handler's to
//!   check).
//!
//! And it replays bytes the server read before hyper started (a partial
//! HTTP/2 preface, see `server::sniff`), ahead of the socket's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Heads longer than this are left to hyper (which rejects them: see
/// [`FramingGuard::limit_head`]).
const MAX_HEAD: usize = 1 << 20;
const NONE: u64 = u64::MAX;
/// Written to a client whose request target is too long (see the module doc).
const URI_TOO_LONG: &[u8] = b"HTTP/1.1 414 URI Too Long\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 24\r\nconnection: close\r\n\r\nrequest target too long\n";

/// Shared between the connection's reader and its request handler.
#[derive(Debug)]
pub(crate) struct FramingState {
    /// Index of the first ambiguous request head, or `NONE`.
    ambiguous_from: AtomicU64,
    /// Requests the handler has seen on this connection.
    handled: AtomicU64,
    /// Responses whose body hyper has finished with (dropped), or requests
    /// whose handler was dropped before it answered.
    finished: AtomicU64,
    /// HTTP/2 only (the server's response bodies report them there): calls
    /// of a response body's `poll_frame` on this connection, and bodies that
    /// handed hyper a frame and have not been asked for the next one yet.
    /// Both standing still means the client's flow-control windows stay
    /// shut (see `server::h2_watch`).
    body_polls: AtomicU64,
    bodies_waiting: AtomicU64,
    /// The guard answered 414 (a request target over `max_target_bytes`).
    target_refused: AtomicBool,
}

impl FramingState {
    fn new() -> Arc<FramingState> {
        Arc::new(FramingState {
            ambiguous_from: AtomicU64::new(NONE),
            handled: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            body_polls: AtomicU64::new(0),
            bodies_waiting: AtomicU64::new(0),
            target_refused: AtomicBool::new(false),
        })
    }

    /// Requests the handler saw and responses finished, in that order: equal
    /// means nothing is in flight.
    pub(crate) fn requests(&self) -> (u64, u64) {
        (
            self.handled.load(Ordering::Relaxed),
            self.finished.load(Ordering::Relaxed),
        )
    }

    /// A response body was polled (HTTP/2 tracking); `was_waiting`: it had
    /// handed out a frame since its last poll.
    pub(crate) fn body_polled(&self, was_waiting: bool) {
        self.body_polls.fetch_add(1, Ordering::Relaxed);
        if was_waiting {
            self.bodies_waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A response body handed hyper a frame and more is to come.
    pub(crate) fn body_waiting(&self) {
        self.bodies_waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A body that was waiting is gone.
    pub(crate) fn body_dropped_waiting(&self) {
        self.bodies_waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Body polls so far, and whether some body waits to be polled.
    pub(crate) fn body_progress(&self) -> (u64, bool) {
        (
            self.body_polls.load(Ordering::Relaxed),
            self.bodies_waiting.load(Ordering::Relaxed) > 0,
        )
    }

    /// Called once per request, in order; true if this request's head was
    /// ambiguous (or came after one: hyper closes such a connection anyway).
    pub(crate) fn next_request_is_ambiguous(&self) -> bool {
        let index = self.handled.fetch_add(1, Ordering::Relaxed);
        index >= self.ambiguous_from.load(Ordering::Acquire)
    }

    /// Whether the guard answered a request target as too long (414).
    pub(crate) fn target_refused(&self) -> bool {
        self.target_refused.load(Ordering::Relaxed)
    }

    /// Called when hyper drops a response body on this connection: it has
    /// encoded all of it (or given up on the connection).
    pub(crate) fn response_finished(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }
}

/// The error inside the `TimedOut` of a read whose request head was not
/// complete within the head timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client sent no whole request head within the header timeout")]
pub(crate) struct HeadTimedOut;

/// The error inside the `TimedOut` of a write blocked for `send_timeout`,
/// so the server can tell it from other I/O errors.
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing for the send timeout")]
pub(crate) struct SendTimedOut;

/// The error a read ends with once the guard has answered 414.
#[derive(Debug, thiserror::Error)]
#[error("the request target is longer than the limit")]
pub(crate) struct TargetTooLong;

enum Phase {
    /// Collecting a request head (bytes so far).
    Head(Vec<u8>),
    /// Skipping this many body bytes.
    Fixed(u64),
    /// Chunked body: reading a chunk-size line (bytes so far).
    ChunkSize(Vec<u8>),
    /// Inside chunk data; then its CRLF (`u64` = data left, plus 2).
    ChunkData(u64),
    /// Trailer section after the last chunk (current line so far).
    Trailers(Vec<u8>),
    /// Not following any more.
    Off,
}

pub(crate) struct FramingGuard<IO> {
    io: IO,
    phase: Phase,
    heads: u64,
    state: Arc<FramingState>,
    /// Read as EOF after being idle this long (None: never).
    park_after: Option<Duration>,
    /// Bytes were handed to `poll_write` and no `poll_flush` has completed
    /// since: hyper may still hold part of a response.
    dirty: bool,
    /// The idle timer, created on the first idle read; `armed` while it runs
    /// for the current idle period.
    idle: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// When the current idle period began (valid while `armed`).
    idle_since: Instant,
    /// The EOF hyper saw came from parking: the socket is open, and
    /// `poll_shutdown` must leave it open.
    parked: bool,
    /// Heads are followed up to this many bytes.
    max_head: usize,
    /// A request target longer than this is answered 414.
    max_target: usize,
    /// Bytes of [`URI_TOO_LONG`] written so far, once refusing.
    refusing: Option<usize>,
    /// Bytes read before hyper started, handed out before the socket's.
    replay: Vec<u8>,
    /// A blocked write fails after this long (None: never).
    send_timeout: Option<Duration>,
    /// The send-stall timer, created on the first blocked write; `stalled`
    /// while it runs for the current stall.
    stall: Option<Pin<Box<Sleep>>>,
    stalled: bool,
    /// A request head must be whole this long after the connection starts
    /// waiting for it (None: no bound here).
    head_timeout: Option<Duration>,
    /// When it started waiting for the current head (all earlier requests
    /// answered, no head complete yet).
    head_since: Option<Instant>,
    /// The head timer: one per connection, polled once after each reset
    /// and reset only when it fires early (its deadline is that of an
    /// earlier head), so a request costs no timer work.
    head_timer: Option<Pin<Box<Sleep>>>,
    /// Stopped following on bytes it could not frame (not an upgrade):
    /// nothing here bounds the next head, so the connection ends (EOF)
    /// once every request it carried is answered.
    lost: bool,
}

impl<IO> FramingGuard<IO> {
    pub(crate) fn new(io: IO) -> (FramingGuard<IO>, Arc<FramingState>) {
        let state = FramingState::new();
        let guard = FramingGuard {
            io,
            phase: Phase::Head(Vec::new()),
            heads: 0,
            state: state.clone(),
            park_after: None,
            dirty: false,
            idle: None,
            armed: false,
            idle_since: Instant::now(),
            parked: false,
            max_head: MAX_HEAD,
            max_target: usize::MAX,
            refusing: None,
            replay: Vec::new(),
            send_timeout: None,
            stall: None,
            stalled: false,
            head_timeout: None,
            head_since: None,
            head_timer: None,
            lost: false,
        };
        (guard, state)
    }

    /// Follows heads only up to `max` bytes: a longer one is hyper's to
    /// refuse (with the same limit, as 431), and nothing here holds more.
    pub(crate) fn limit_head(&mut self, max: usize) {
        self.max_head = max;
    }

    /// A request line whose target passes `max` bytes before its head is
    /// complete is answered 414 here (see the module doc).
    pub(crate) fn limit_target(&mut self, max: usize) {
        self.max_target = max;
    }

    /// `bytes` are read before the socket's (they were taken from it).
    pub(crate) fn replay(&mut self, bytes: Vec<u8>) {
        self.replay = bytes;
    }

    /// From now on a request head must be whole `after` after the
    /// connection starts waiting for it, or the read fails with
    /// `TimedOut` ([`HeadTimedOut`]). hyper's own header timer would do
    /// the same, but it makes a new timer for every head (bench/README.md).
    pub(crate) fn head_timeout(&mut self, after: Duration) {
        self.head_timeout = Some(after);
        self.head_since = None;
    }

    /// Notes when the connection starts waiting for a head, and forgets it
    /// once the head is complete.
    fn note_head(&mut self) {
        // A lost connection counts as waiting, answering or not: its timer
        // ends it once it is answered (`poll_head`), if no read does first.
        let waiting = self.lost
            || (matches!(self.phase, Phase::Head(_))
                && self.state.finished.load(Ordering::Relaxed) == self.heads);
        match (waiting, self.head_since.is_some()) {
            (true, false) => self.head_since = Some(Instant::now()),
            (false, true) => self.head_since = None,
            _ => {}
        }
    }

    /// The socket has nothing to read: `TimedOut` if the head being waited
    /// for is overdue (a lost connection instead ends, or is looked at
    /// again a head timeout later while it still answers). Otherwise makes
    /// sure the head timer will wake the task by the deadline.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (Some(after), Some(since)) = (self.head_timeout, self.head_since) else {
            return Poll::Pending;
        };
        let mut deadline = since + after;
        let timer = match &mut self.head_timer {
            Some(timer) if !timer.is_elapsed() => return Poll::Pending,
            Some(timer) => timer,
            None => self
                .head_timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        let now = Instant::now();
        if now >= deadline {
            if !self.lost {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, HeadTimedOut)));
            }
            if self.state.finished.load(Ordering::Relaxed) == self.heads {
                return Poll::Ready(Ok(()));
            }
            self.head_since = Some(now);
            deadline = now + after;
        }
        timer.as_mut().reset(deadline);
        // Registers the waker (the task's own: valid until it fires).
        let _ = timer.as_mut().poll(cx);
        Poll::Pending
    }

    /// A write or flush blocked for `after` fails with `TimedOut`.
    pub(crate) fn send_timeout(&mut self, after: Duration) {
        self.send_timeout = Some(after);
    }

    /// A write or flush is blocked: `TimedOut` once it has been for
    /// `send_timeout`, otherwise wait (with the stall timer registered).
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let Some(after) = self.send_timeout else {
            return Poll::Pending;
        };
        if !self.stalled {
            let deadline = Instant::now() + after;
            match &mut self.stall {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.stalled = true;
        }
        let fired = match &mut self.stall {
            Some(timer) => timer.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if !fired {
            return Poll::Pending;
        }
        self.stalled = false;
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, SendTimedOut)))
    }

    /// Ends a stall once a write or flush goes through.
    fn progressed<T>(
        &mut self,
        res: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match res {
            Poll::Pending => self.poll_stall(cx),
            ready => {
                self.stalled = false;
                ready
            }
        }
    }

    /// From now on, once the connection has been idle for `after` (see the
    /// module doc), a read returns EOF instead of waiting: hyper then ends
    /// the connection as if the client had closed it, and
    /// [`Self::take_parked`] tells the server that it did not.
    pub(crate) fn park_when_idle(&mut self, after: Duration) {
        self.park_after = Some(after);
    }

    /// Whether the last EOF was parking (and resets that).
    pub(crate) fn take_parked(&mut self) -> bool {
        std::mem::take(&mut self.parked)
    }

    pub(crate) fn get_ref(&self) -> &IO {
        &self.io
    }

    fn is_idle(&self) -> bool {
        matches!(&self.phase, Phase::Head(partial) if partial.is_empty())
            && !self.dirty
            && self.state.finished.load(Ordering::Relaxed) == self.heads
    }

    /// The socket has nothing to read: EOF if the connection has been idle
    /// for `park_after`, otherwise wait (with the idle timer registered).
    fn poll_park(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(after) = self.park_after else {
            return Poll::Pending;
        };
        // Only the last answer may still be outstanding (its body not yet
        // dropped): the timer runs then too, because nothing wakes this
        // task when that answer finishes; when it fires, idleness is
        // checked again.
        let quiet =
            matches!(&self.phase, Phase::Head(partial) if partial.is_empty()) && !self.dirty;
        if !quiet {
            // hyper also reads while a request is in flight, to notice a
            // client that went away: never EOF there.
            self.armed = false;
            return Poll::Pending;
        }
        if !self.armed {
            // First idle read of this idle period. Like the head timer, the
            // idle timer is reset only when it fires early (its deadline is
            // an earlier period's, so never later than this one's): a
            // request costs a clock read, not a reset and a poll.
            self.idle_since = Instant::now();
            self.armed = true;
            let deadline = self.idle_since + after;
            match &mut self.idle {
                Some(timer) if !timer.is_elapsed() => return Poll::Pending,
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.idle = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(timer) = &mut self.idle else {
            return Poll::Pending;
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let now = Instant::now();
        let mut due = self.idle_since + after;
        if now >= due {
            if self.is_idle() {
                self.armed = false;
                self.idle = None;
                self.parked = true;
                return Poll::Ready(Ok(()));
            }
            // An answer was still going out: idle from now on, at most.
            self.idle_since = now;
            due = now + after;
        }
        // Fired early (its deadline was an earlier period's), or idle only
        // from now: wait on to the period's end.
        if let Some(timer) = &mut self.idle {
            timer.as_mut().reset(due);
            // Registers the waker (the task's own: valid until it fires).
            let _ = timer.as_mut().poll(cx);
        }
        Poll::Pending
    }

    /// Stops following bytes it cannot frame (see [`Self::lost`]).
    fn lose(&mut self) {
        self.phase = Phase::Off;
        self.lost = true;
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match &mut self.phase {
                Phase::Off => return,
                Phase::Head(buf) => {
                    // Leading empty lines before a request line are allowed.
                    if buf.is_empty() && (bytes[0] == b'\r' || bytes[0] == b'\n') {
                        1
                    } else if let Some(end) = buf
                        .is_empty()
                        .then(|| head_end(&bytes[..bytes.len().min(self.max_head + 1)], 0))
                        .flatten()
                    {
                        // The whole head is in this read (the usual case):
                        // look at it where it is instead of copying it.
                        self.phase = self.after_head(&bytes[..end]);
                        end
                    } else {
                        let start = buf.len().saturating_sub(3);
                        let max = self.max_head;
                        let take = bytes.len().min(max + 1 - buf.len().min(max));
                        buf.extend_from_slice(&bytes[..take]);
                        match head_end(buf, start) {
                            Some(end) => {
                                let extra = buf.len() - end;
                                let head = std::mem::take(buf);
                                self.phase = self.after_head(&head[..end]);
                                take - extra
                            }
                            None if target_so_far(buf) > self.max_target => {
                                self.phase = Phase::Off;
                                self.refusing = Some(0);
                                self.state.target_refused.store(true, Ordering::Relaxed);
                                return;
                            }
                            None if buf.len() > max => {
                                self.lose();
                                return;
                            }
                            None => take,
                        }
                    }
                }
                Phase::Fixed(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    if *left == 0 {
                        self.phase = Phase::Head(Vec::new());
                    }
                    n as usize
                }
                Phase::ChunkSize(line) => match bytes.iter().position(|&b| b == b'\n') {
                    Some(nl) => {
                        line.extend_from_slice(&bytes[..nl]);
                        self.phase = chunk_size(line);
                        self.lost |= matches!(self.phase, Phase::Off);
                        nl + 1
                    }
                    None if line.len() > 4096 => {
                        self.lose();
                        return;
                    }
                    None => {
                        line.extend_from_slice(bytes);
                        bytes.len()
                    }
                },
                Phase::ChunkData(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    if *left == 0 {
                        self.phase = Phase::ChunkSize(Vec::new());
                    }
                    n as usize
                }
                Phase::Trailers(line) => match bytes.iter().position(|&b| b == b'\n') {
                    Some(nl) => {
                        line.extend_from_slice(&bytes[..nl]);
                        let blank = line.is_empty() || line.as_slice() == b"\r";
                        line.clear();
                        if blank {
                            self.phase = Phase::Head(Vec::new());
                        }
                        nl + 1
                    }
                    None => {
                        line.extend_from_slice(bytes);
                        if line.len() > self.max_head {
                            self.lose();
                            return;
                        }
                        bytes.len()
                    }
                },
            };
            bytes = &bytes[used..];
        }
    }

    /// Decides how the body after `head` is framed, and records ambiguity.
    fn after_head(&mut self, head: &[u8]) -> Phase {
        let index = self.heads;
        self.heads += 1;
        if std::str::from_utf8(head).is_err() {
            self.lost = true;
            return Phase::Off;
        }
        // Bytes, not `str::lines`/`split_once`: this runs over every request
        // head. Lines found with `memchr` (the request line alone is often
        // 40+ bytes); a line is looked at only if it starts with one of the
        // three names and a `:` follows it, so the usual lines (`Host`,
        // `Accept`, ...) cost a byte comparison each, not a scan for `:`.
        let mut start = 0;
        let mut lines = memchr::memchr_iter(b'\n', head)
            .map(|nl| {
                let line = &head[start..nl];
                start = nl + 1;
                line
            })
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
        let request_line = lines.next().unwrap_or_default();
        if request_line.ends_with(b"HTTP/2.0") || request_line.starts_with(b"CONNECT ") {
            return Phase::Off;
        }
        let (mut length, mut chunked, mut has_te) = (None::<u64>, false, false);
        // The head ends with an empty line, so every line ends with `\n`.
        for line in lines {
            // Checked for UTF-8 above, and `:` is ASCII: a valid split.
            let value = |name: &[u8]| {
                std::str::from_utf8(&line[name.len() + 1..])
                    .unwrap_or_default()
                    .trim()
            };
            let named = |name: &[u8]| {
                line.get(name.len()) == Some(&b':') && line[..name.len()].eq_ignore_ascii_case(name)
            };
            match line.first().map(u8::to_ascii_lowercase) {
                Some(b'c') if named(b"content-length") => {
                    match value(b"content-length").parse::<u64>() {
                        Ok(n) => length = Some(n),
                        Err(_) => {
                            self.lost = true;
                            return Phase::Off;
                        }
                    }
                }
                Some(b't') if named(b"transfer-encoding") => {
                    has_te = true;
                    chunked = value(b"transfer-encoding")
                        .rsplit(',')
                        .next()
                        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
                }
                Some(b'u') if named(b"upgrade") => return Phase::Off,
                _ => {}
            }
        }
        if has_te && length.is_some() {
            self.state
                .ambiguous_from
                .fetch_min(index, Ordering::Release);
        }
        match (has_te, chunked, length) {
            (true, true, _) => Phase::ChunkSize(Vec::new()),
            (true, false, _) => {
                self.lost = true;
                Phase::Off
            }
            (false, _, Some(n)) if n > 0 => Phase::Fixed(n),
            _ => Phase::Head(Vec::new()),
        }
    }
}

/// End (exclusive) of the first empty line at or after `from`: a head ends
/// with `\n\r\n` or, as hyper also accepts, a bare `\n\n`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    // Jump from one `\n` to the next instead of matching a pattern at every
    // byte: this runs over every request head.
    let mut i = from;
    while let Some(offset) = memchr::memchr(b'\n', buf.get(i..)?) {
        let nl = i + offset;
        match &buf[nl..] {
            [b'\n', b'\n', ..] => return Some(nl + 2),
            [b'\n', b'\r', b'\n', ..] => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

/// The length of the request target in a partial head (`buf` starts at
/// the request line): from after the method to the next space, or to the
/// end of what arrived.
fn target_so_far(buf: &[u8]) -> usize {
    let line = memchr::memchr(b'\n', buf).map_or(buf, |nl| &buf[..nl]);
    let Some(sp) = memchr::memchr(b' ', line) else {
        return 0;
    };
    let target = &line[sp + 1..];
    memchr::memchr(b' ', target).unwrap_or(target.len())
}

/// Parses a chunk-size line (`1a;ext=1\r`) into the next phase.
fn chunk_size(line: &[u8]) -> Phase {
    let digits: &[u8] = line
        .split(|&b| b == b';' || b == b'\r' || b == b' ' || b == b'\t')
        .next()
        .unwrap_or_default();
    let parsed = std::str::from_utf8(digits)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok());
    match parsed {
        Some(0) => Phase::Trailers(Vec::new()),
        Some(n) => n.checked_add(2).map_or(Phase::Off, Phase::ChunkData),
        None => Phase::Off,
    }
}

impl<IO: AsyncWrite + Unpin> FramingGuard<IO> {
    /// Writes the 414 (bounded by the send timeout), then fails the read
    /// with [`TargetTooLong`]: hyper ends the connection without an answer
    /// of its own.
    fn poll_refuse(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(sent) = self.refusing.filter(|sent| *sent < URI_TOO_LONG.len()) {
            let res = Pin::new(&mut self.io).poll_write(cx, &URI_TOO_LONG[sent..]);
            match std::task::ready!(self.progressed(res, cx))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => self.refusing = Some(sent + n),
            }
        }
        let res = Pin::new(&mut self.io).poll_flush(cx);
        std::task::ready!(self.progressed(res, cx))?;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::InvalidData,
            TargetTooLong,
        )))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FramingGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        if this.refusing.is_some() {
            return this.poll_refuse(cx);
        }
        if this.lost && this.state.finished.load(Ordering::Relaxed) == this.heads {
            // Every request it carried is answered: end it (see `lost`).
            return Poll::Ready(Ok(()));
        }
        let res = if this.replay.is_empty() {
            Pin::new(&mut this.io).poll_read(cx, buf)
        } else {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay[..n]);
            this.replay.drain(..n);
            Poll::Ready(Ok(()))
        };
        match res {
            Poll::Ready(Ok(())) => {
                this.armed = false;
                if !matches!(this.phase, Phase::Off) {
                    this.feed(&buf.filled()[before..]);
                }
                if this.refusing.is_some() {
                    // hyper must not see this head: over its own limit it
                    // would answer 431 first.
                    buf.set_filled(before);
                    return this.poll_refuse(cx);
                }
                this.note_head();
                res
            }
            Poll::Pending => {
                this.note_head();
                if let Poll::Ready(end) = this.poll_head(cx) {
                    return Poll::Ready(end);
                }
                this.poll_park(cx)
            }
            Poll::Ready(Err(_)) => res,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FramingGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.dirty = true;
        let res = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progressed(res, cx)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes the socket only after writing all it buffered.
        let res = Pin::new(&mut self.io).poll_flush(cx);
        if let Poll::Ready(Ok(())) = res {
            self.dirty = false;
        }
        self.progressed(res, cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.parked {
            // hyper closes after the EOF we made up; the client did not.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.dirty = true;
        let res = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progressed(res, cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> (Arc<FramingState>, u64) {
        let (mut g, state) = FramingGuard::new(());
        for c in chunks {
            g.feed(c);
        }
        (state, g.heads)
    }

    /// The idle timer is reset only when it fires early: a connection
    /// idle since its second answer parks `after` from then, not at the
    /// first idle period's deadline.
    #[tokio::test(start_paused = true)]
    async fn parks_a_whole_idle_period_after_the_last_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const AFTER: Duration = Duration::from_millis(200);
        let (mut client, io) = tokio::io::duplex(4096);
        let (mut guard, state) = FramingGuard::new(io);
        guard.park_when_idle(AFTER);
        // hyper's part: read heads, answer each at once, stop at EOF.
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                let n = guard.read(&mut buf).await.expect("read");
                if n == 0 {
                    return (Instant::now(), guard.take_parked());
                }
                state.response_finished();
            }
        });
        let start = Instant::now();
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        client.write_all(head).await.expect("write");
        tokio::time::sleep(Duration::from_millis(150)).await;
        client.write_all(head).await.expect("write");
        let (ended, parked) = server.await.expect("server");
        assert!(parked, "EOF from parking, not from the client");
        let idle_for = ended - start;
        assert!(
            idle_for >= Duration::from_millis(150) + AFTER,
            "parked {idle_for:?} after the first request"
        );
        assert!(idle_for < Duration::from_millis(400), "{idle_for:?}");
    }

    #[test]
    fn follows_keep_alive_bodies() {
        let (state, heads) = run(&[
            b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhel",
            b"loGET /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
            b"POST /c HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ]);
        assert_eq!(heads, 3);
        assert_eq!(state.ambiguous_from.load(Ordering::Relaxed), 2);
        assert!(!state.next_request_is_ambiguous());
        assert!(!state.next_request_is_ambiguous());
        assert!(state.next_request_is_ambiguous());
    }

    #[test]
    fn body_that_looks_like_a_head_is_not_a_head() {
        let body = b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let head = format!("POST /a HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        let (state, heads) = run(&[head.as_bytes(), body, b"GET / HTTP/1.1\r\n\r\n"]);
        assert_eq!(heads, 2);
        assert_eq!(state.ambiguous_from.load(Ordering::Relaxed), NONE);
    }

    #[test]
    fn bare_lf_heads() {
        let (state, heads) = run(&[
            b"GET /a HTTP/1.1\nHost: x\n\n",
            b"POST /b HTTP/1.1\nContent-Length: 1\nTransfer-Encoding: chunked\n\n0\r\n\r\n",
        ]);
        assert_eq!(heads, 2);
        assert_eq!(state.ambiguous_from.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn names_in_any_case_and_only_whole_names() {
        // A name longer than `Content-Length` is another header: no body
        // follows, the next head is a head.
        let (state, heads) = run(&[
            b"POST /a HTTP/1.1\r\nContent-Lengthy: 3\r\n\r\n",
            b"GET /b HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc",
            b"POST /c HTTP/1.1\r\nCONTENT-LENGTH: 1\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n",
            b"GET /d HTTP/1.1\r\nX-Upgrade: h2c\r\n\r\nGET /e HTTP/1.1\r\n\r\n",
        ]);
        assert_eq!(heads, 5);
        assert_eq!(state.ambiguous_from.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn stops_on_h2_and_upgrade() {
        let (_, heads) = run(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nGET / HTTP/1.1\r\n\r\n"]);
        assert_eq!(heads, 1);
        let (_, heads) =
            run(&[b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\nGET / HTTP/1.1\r\n\r\n"]);
        assert_eq!(heads, 1);
    }
}
