//! A fill's body fanned out to every waiter as the origin sends it
//! (docs/architecture.md#fills-stream-to-every-waiter): one upstream read
//! ([`TeeWriter`], owned by the fill) appends each chunk to one shared list,
//! and each waiter's body ([`TeeReader`]) indexes into that list at its own
//! pace. The chunks are the fill's own buffer for publish (refcounted
//! `Bytes`), so the waiters cost no copy: memory is one copy of the body per
//! fill, whatever the number or the speed of its readers.
//!
//! Past `fill.max_body` (the object is not stored) the list keeps only the
//! last `max_body` bytes or so: a reader that fell behind them is cut (its
//! body ends with an error, `sidecache_fill_readers_cut_total`) instead of
//! slowing the others or growing the buffer.
//!
//! A body that ends early or with an error ends every reader with an error,
//! never as a complete body: HTTP/1.1 then closes without the terminating
//! chunk (or short of `Content-Length`), h2 resets the stream. Every reader
//! is further held back from the end until the fill's verdict
//! ([`TeeWriter::release`], once it has published): one byte short of a
//! declared length, or before the end of a chunked body. The request that
//! started the fill then completes; a joiner (a request that did not start
//! it) only if the fill may be shared with it (no invalidation of its route
//! or tags during the fill), else it is cut.

use crate::body::BoxError;
use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use prometheus::IntCounter;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use tokio::sync::Notify;

/// The most a reader takes in one frame: a reader far behind sends its
/// backlog in pieces, not one frame of the whole body.
const MAX_FRAME: usize = 64 * 1024;

/// Why a reader's body ended with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TeeError {
    #[error("the origin's body ended early or failed")]
    Aborted,
    #[error("the reader fell behind the fill's retained window")]
    Cut,
    #[error("the fill may not be shared with this request")]
    Withheld,
}

/// How the body ended, as far as the readers are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Complete,
    Failed,
}

/// The fill's verdict for its joiners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Pending,
    Shared,
    Withheld,
}

struct State {
    chunks: VecDeque<Bytes>,
    /// The body offset of `chunks[0]`.
    base: u64,
    /// Bytes written so far (the end of the last chunk).
    written: u64,
    /// Bytes in `chunks`.
    retained: u64,
    end: End,
    release: Release,
    /// One slot per live reader (`None`: not waiting); freed on drop.
    wakers: Vec<Option<Waker>>,
    free: Vec<usize>,
    readers: usize,
}

/// The shared chunk list of one fill.
pub(crate) struct Tee {
    state: Mutex<State>,
    /// Retained bytes past which the oldest chunks are dropped.
    window: u64,
    /// The body's length, if the origin declared it.
    length: Option<u64>,
    cut: IntCounter,
    /// Woken when the last reader goes away (the fill may stop reading an
    /// object nobody can join any more).
    idle: Notify,
}

impl Tee {
    /// A tee for a body of `length` (if declared) that keeps about `window`
    /// bytes once the body is past it; `cut` counts the readers that fell
    /// behind them.
    pub(crate) fn new(window: u64, length: Option<u64>, cut: IntCounter) -> (Arc<Tee>, TeeWriter) {
        let tee = Arc::new(Tee {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                base: 0,
                written: 0,
                retained: 0,
                end: End::Open,
                release: Release::Pending,
                wakers: Vec::new(),
                free: Vec::new(),
                readers: 0,
            }),
            window,
            length,
            cut,
            idle: Notify::new(),
        });
        (Arc::clone(&tee), TeeWriter(tee))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A body from the first byte; `joiner`: cut at the end unless the
    /// fill's verdict shares it. `None` once the first byte is no
    /// longer retained (the object is past `max_body`).
    pub(crate) fn reader(self: &Arc<Self>, joiner: bool) -> Option<TeeReader> {
        let mut st = self.lock();
        if st.base > 0 || st.end == End::Failed {
            return None;
        }
        let slot = match st.free.pop() {
            Some(slot) => slot,
            None => {
                st.wakers.push(None);
                st.wakers.len() - 1
            }
        };
        st.readers += 1;
        Some(TeeReader {
            tee: Arc::clone(self),
            pos: 0,
            slot,
            joiner,
            done: false,
        })
    }

    /// Live readers.
    pub(crate) fn readers(&self) -> usize {
        self.lock().readers
    }

    /// Waits until no reader is left (returns at once if none is).
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.readers() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The first byte is no longer retained: no reader can start.
    pub(crate) fn past_window(&self) -> bool {
        self.lock().base > 0
    }

    fn wake_all(st: &mut State) {
        for waker in st.wakers.iter_mut().filter_map(Option::take) {
            waker.wake();
        }
    }
}

/// The fill's end of a [`Tee`]. Dropped before the body completed or
/// before its verdict (an error, a panic, a cancelled fill), it ends every
/// reader with an error.
pub(crate) struct TeeWriter(Arc<Tee>);

impl TeeWriter {
    /// Appends a chunk; past the window the oldest chunks are dropped.
    pub(crate) fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let tee = &self.0;
        let mut st = tee.lock();
        st.written += chunk.len() as u64;
        st.retained += chunk.len() as u64;
        st.chunks.push_back(chunk);
        while st.retained > tee.window && st.chunks.len() > 1 {
            if let Some(old) = st.chunks.pop_front() {
                st.base += old.len() as u64;
                st.retained -= old.len() as u64;
            }
        }
        Tee::wake_all(&mut st);
    }

    /// The body written so far in one piece (one copy, made outside the
    /// lock); empty if its first byte is no longer retained.
    pub(crate) fn concat(&self) -> Bytes {
        let (chunks, len) = {
            let st = self.0.lock();
            if st.base > 0 {
                return Bytes::new();
            }
            if st.chunks.len() == 1 {
                return st.chunks[0].clone();
            }
            let chunks: Vec<Bytes> = st.chunks.iter().cloned().collect();
            (chunks, st.retained as usize)
        };
        let mut buf = BytesMut::with_capacity(len);
        for chunk in &chunks {
            buf.extend_from_slice(chunk);
        }
        buf.freeze()
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> u64 {
        self.0.lock().written
    }

    /// The body ended as the origin sent it. `whole`: the body in one
    /// piece (what the fill publishes), kept instead of the chunks so the
    /// readers still behind read from the one copy.
    pub(crate) fn complete(&self, whole: Option<Bytes>) {
        let mut st = self.0.lock();
        if let Some(whole) = whole.filter(|w| st.base == 0 && w.len() as u64 == st.written) {
            st.chunks.clear();
            st.retained = whole.len() as u64;
            st.chunks.push_back(whole);
        }
        st.end = End::Complete;
        Tee::wake_all(&mut st);
    }

    /// The body failed or ended early: every reader ends with an error.
    pub(crate) fn fail(&self) {
        let mut st = self.0.lock();
        if st.end == End::Open {
            st.end = End::Failed;
        }
        Tee::wake_all(&mut st);
    }

    /// The fill's verdict, once its body is judged: the starter completes
    /// (once the body has); its joiners too if `shared`, else they are cut
    /// short of the end.
    pub(crate) fn release(&self, shared: bool) {
        let mut st = self.0.lock();
        if st.release == Release::Pending {
            st.release = if shared {
                Release::Shared
            } else {
                Release::Withheld
            };
        }
        Tee::wake_all(&mut st);
    }

    pub(crate) fn tee(&self) -> &Arc<Tee> {
        &self.0
    }
}

impl Drop for TeeWriter {
    fn drop(&mut self) {
        self.fail();
        self.release(false);
    }
}

/// One waiter's body: a hyper body that yields the fill's chunks as they
/// arrive, from its own position in the shared list.
pub(crate) struct TeeReader {
    tee: Arc<Tee>,
    pos: u64,
    slot: usize,
    joiner: bool,
    done: bool,
}

/// What a reader may do next.
enum Step {
    Data(Bytes),
    End,
    Error(TeeError),
    Wait,
}

impl TeeReader {
    fn step(&mut self, st: &State) -> Step {
        if st.end == End::Failed {
            return Step::Error(TeeError::Aborted);
        }
        if self.pos < st.base {
            return Step::Error(TeeError::Cut);
        }
        // Every reader is held back from the end of the body until the
        // fill's verdict (so an answer complete at the client is one the
        // fill has judged, and published if it could): from its last byte
        // if the origin declared its length (the client takes the answer as
        // complete with it), else from the end itself. A joiner completes
        // only with an answer it may share.
        let held = match (self.joiner, st.release) {
            (true, Release::Withheld) => return Step::Error(TeeError::Withheld),
            (_, Release::Pending) => true,
            _ => false,
        };
        let limit = match (held, self.tee.length) {
            (true, Some(n)) => st.written.min(n.saturating_sub(1)),
            _ => st.written,
        };
        if self.pos < limit {
            let mut offset = st.base;
            for chunk in &st.chunks {
                let len = chunk.len() as u64;
                if self.pos < offset + len {
                    let from = (self.pos - offset) as usize;
                    let to = ((limit - offset).min(len) as usize).min(from + MAX_FRAME);
                    return Step::Data(chunk.slice(from..to));
                }
                offset += len;
            }
        }
        if st.end == End::Complete && !held && self.pos >= st.written {
            return Step::End;
        }
        Step::Wait
    }
}

impl HttpBody for TeeReader {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let tee = Arc::clone(&this.tee);
        let mut st = tee.lock();
        match this.step(&st) {
            Step::Data(data) => {
                this.pos += data.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Step::End => {
                this.done = true;
                Poll::Ready(None)
            }
            Step::Error(e) => {
                this.done = true;
                if matches!(e, TeeError::Cut) {
                    tee.cut.inc();
                }
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Step::Wait => {
                if let Some(slot) = st.wakers.get_mut(this.slot) {
                    *slot = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for TeeReader {
    fn drop(&mut self) {
        let mut st = self.tee.lock();
        if let Some(slot) = st.wakers.get_mut(self.slot) {
            *slot = None;
        }
        st.free.push(self.slot);
        st.readers -= 1;
        let idle = st.readers == 0;
        drop(st);
        if idle {
            self.tee.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn counter() -> IntCounter {
        IntCounter::new("cut", "cut").expect("counter")
    }

    /// Everything a reader yields now, without waiting; `Err` at an error.
    fn drain(reader: &mut TeeReader) -> Result<(Vec<u8>, bool), TeeError> {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut *reader).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    out.extend_from_slice(&frame.into_data().unwrap_or_default())
                }
                Poll::Ready(Some(Err(e))) => {
                    return Err(*e.downcast::<TeeError>().expect("a tee error"))
                }
                Poll::Ready(None) => return Ok((out, true)),
                Poll::Pending => return Ok((out, false)),
            }
        }
    }

    #[test]
    fn readers_get_each_chunk_as_it_arrives_and_a_joiner_waits_for_the_verdict() {
        let (tee, writer) = Tee::new(1 << 20, Some(6), counter());
        let mut starter = tee.reader(false).expect("reader");
        let mut joiner = tee.reader(true).expect("reader");
        writer.push(Bytes::from_static(b"abc"));
        assert_eq!(drain(&mut starter).ok(), Some((b"abc".to_vec(), false)));
        assert_eq!(drain(&mut joiner).ok(), Some((b"abc".to_vec(), false)));
        writer.push(Bytes::from_static(b"def"));
        writer.complete(Some(Bytes::from_static(b"abcdef")));
        // The declared length's last byte waits for the verdict.
        assert_eq!(drain(&mut starter).ok(), Some((b"de".to_vec(), false)));
        assert_eq!(drain(&mut joiner).ok(), Some((b"de".to_vec(), false)));
        writer.release(true);
        assert_eq!(drain(&mut starter).ok(), Some((b"f".to_vec(), true)));
        assert_eq!(drain(&mut joiner).ok(), Some((b"f".to_vec(), true)));
        // A late joiner reads the whole body from the one copy.
        let mut late = tee.reader(true).expect("reader");
        assert_eq!(drain(&mut late).ok(), Some((b"abcdef".to_vec(), true)));
    }

    #[test]
    fn without_a_declared_length_a_joiner_waits_for_the_verdict_at_the_end() {
        let (tee, writer) = Tee::new(1 << 20, None, counter());
        let mut joiner = tee.reader(true).expect("reader");
        writer.push(Bytes::from_static(b"abc"));
        writer.complete(None);
        assert_eq!(drain(&mut joiner).ok(), Some((b"abc".to_vec(), false)));
        writer.release(true);
        assert_eq!(drain(&mut joiner).ok(), Some((Vec::new(), true)));
    }

    #[test]
    fn a_failed_body_or_a_withheld_verdict_ends_readers_with_an_error() {
        let (tee, writer) = Tee::new(1 << 20, None, counter());
        let mut starter = tee.reader(false).expect("reader");
        let mut joiner = tee.reader(true).expect("reader");
        writer.push(Bytes::from_static(b"abc"));
        assert!(drain(&mut starter).is_ok());
        writer.fail();
        assert!(matches!(drain(&mut starter), Err(TeeError::Aborted)));
        assert!(matches!(drain(&mut joiner), Err(TeeError::Aborted)));

        let (tee, writer) = Tee::new(1 << 20, None, counter());
        let mut starter = tee.reader(false).expect("reader");
        let mut joiner = tee.reader(true).expect("reader");
        writer.push(Bytes::from_static(b"abc"));
        writer.complete(None);
        writer.release(false);
        assert!(matches!(drain(&mut joiner), Err(TeeError::Withheld)));
        assert_eq!(drain(&mut starter).ok(), Some((b"abc".to_vec(), true)));
        // A writer dropped before completing fails its readers.
        let (tee, writer) = Tee::new(1 << 20, None, counter());
        let mut starter = tee.reader(false).expect("reader");
        drop(writer);
        assert!(matches!(drain(&mut starter), Err(TeeError::Aborted)));
    }

    #[test]
    fn past_the_window_a_reader_behind_is_cut_and_none_can_start() {
        let cut = counter();
        let (tee, writer) = Tee::new(4, None, cut.clone());
        let mut fast = tee.reader(false).expect("reader");
        let mut slow = tee.reader(false).expect("reader");
        writer.push(Bytes::from_static(b"ab"));
        assert_eq!(drain(&mut fast).ok(), Some((b"ab".to_vec(), false)));
        writer.push(Bytes::from_static(b"cd"));
        writer.push(Bytes::from_static(b"ef"));
        assert!(tee.past_window());
        assert!(tee.reader(false).is_none(), "the first byte is gone");
        assert_eq!(drain(&mut fast).ok(), Some((b"cdef".to_vec(), false)));
        assert!(matches!(drain(&mut slow), Err(TeeError::Cut)));
        assert_eq!(cut.get(), 1);
        drop(slow);
        assert_eq!(tee.readers(), 1);
        writer.complete(None);
        writer.release(true);
        assert_eq!(drain(&mut fast).ok(), Some((Vec::new(), true)));
    }

    #[tokio::test]
    async fn a_reader_wakes_when_a_chunk_arrives() {
        let (tee, writer) = Tee::new(1 << 20, None, counter());
        let reader = tee.reader(false).expect("reader");
        let task = tokio::spawn(async move { reader.collect().await.map(|c| c.to_bytes()) });
        tokio::task::yield_now().await;
        writer.push(Bytes::from_static(b"x"));
        tokio::task::yield_now().await;
        writer.push(Bytes::from_static(b"y"));
        writer.complete(None);
        writer.release(true);
        let got = task.await.expect("task").expect("body");
        assert_eq!(got, Bytes::from_static(b"xy"));
        tee.idle().await;
    }
}
