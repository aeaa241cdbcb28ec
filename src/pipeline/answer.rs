//! Stage 10: the client's response, built from an entry ([`respond`]: HIT,
//! STALE, and the MISS or DEGRADED answer a fill produced) or from a
//! flight's answer ([`to_client`], which also hands a one-client answer
//! only to the request that started the fill); each carries `Age` and the
//! route's `client_cache_control`.
//!
//! The last step of every answer built from an entry: the client's own request —
//! HEAD, preconditions, range — shapes the response, in the order of RFC
//! 9110 §13.2.2: preconditions first (412, 304), then `Range` (206, 416),
//! else the full answer. It only shapes what this client receives; the
//! entry, and what anyone else is served, never depend on it.
//!
//! Preconditions apply to stored 2xx answers other than 206 (§13.2.1: they
//! are ignored when the answer would be an error), so a cached 404 answers
//! 404 whatever the client sends. Ranges apply to stored 200s on GET.

use super::cache_status::Facts;
use super::conditional::{self, Conditions, Precondition, Validators};
use super::entry::Entry;
use super::flight::{Answer, Streaming};
use super::range::{self, RangeAnswer, RangeAsk};
use super::{cache_control, client_cc, publish};
use crate::body::{self, Body};
use crate::config::Route;
use crate::outcome::CacheOutcome;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};

/// What the client asked beyond the object itself, kept from its request
/// (a fill's answer arrives after the request is gone).
#[derive(Debug, Default, Clone)]
pub(crate) struct ClientAsk {
    pub head: bool,
    conditions: Conditions,
    range: RangeAsk,
}

impl ClientAsk {
    pub(crate) fn from_request(method: &Method, headers: &HeaderMap) -> ClientAsk {
        let head = method == Method::HEAD;
        // The hot path: most reads carry none of these, and one pass over
        // the few request headers is cheaper than six hashed lookups.
        if !headers.keys().any(is_shaping) {
            return ClientAsk {
                head,
                ..ClientAsk::default()
            };
        }
        ClientAsk {
            head,
            conditions: Conditions::from_headers(headers),
            // Range is defined for GET only (§14.2).
            range: if head {
                RangeAsk::default()
            } else {
                RangeAsk::from_headers(headers)
            },
        }
    }
}

impl ClientAsk {
    /// The answer depends on more than the entry's head: a streamed fill
    /// waits for the whole body for it (HEAD too, whose head alone would
    /// read as complete before the fill is judged).
    pub(crate) fn needs_whole(&self) -> bool {
        self.head || !self.conditions.is_empty() || !self.range.is_empty()
    }
}

/// Request headers that can change the answer built from an entry.
fn is_shaping(name: &header::HeaderName) -> bool {
    [
        header::IF_MATCH,
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
        header::RANGE,
    ]
    .contains(name)
}

/// How an answer was shaped: the `answer` label of
/// `sidecache_client_answers_total`. Carried as a response extension from
/// here to where the request is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shaped {
    /// 304 to a matching `If-None-Match` / `If-Modified-Since`.
    NotModified,
    /// 412 to a failing `If-Match` / `If-Unmodified-Since`.
    PreconditionFailed,
    /// 206, one byte range.
    Partial,
    /// 416.
    RangeUnsatisfiable,
}

impl Shaped {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Shaped::NotModified => "not_modified",
            Shaped::PreconditionFailed => "precondition_failed",
            Shaped::Partial => "partial",
            Shaped::RangeUnsatisfiable => "range_unsatisfiable",
        }
    }
}

/// The part of every answer's head built from `entry` that depends on the
/// entry alone: its stored headers, `Content-Length`, and `Accept-Ranges`
/// where ranges are served from it; with room for what each answer adds
/// (`Age`, `X-Cache`, `Cache-Status`, one more) so that no answer grows
/// the map (a rehash of every header).
pub(crate) fn entry_head(entry: &Entry) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(entry.headers.len() + 6);
    for (name, value) in &entry.headers {
        h.append(name.clone(), value.clone());
    }
    h.insert(header::CONTENT_LENGTH, int_value(entry.body.len() as u64));
    if whole_200(entry) {
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    }
    h
}

/// An entry as the near cache's memo keeps it ([`crate::store::Memo`]):
/// decoded, and its head built, once per copy; every near hit on the copy
/// clones the head instead of building one.
pub(crate) struct Prepared {
    pub entry: Entry,
    /// [`entry_head`].
    pub head: HeaderMap,
}

impl Prepared {
    pub(crate) fn new(entry: Entry) -> Prepared {
        Prepared {
            head: entry_head(&entry),
            entry,
        }
    }
}

/// "0000" to "9999": the small integers of an answer built from an entry
/// (`Content-Length`, `Age`) become header values of static text, where
/// `HeaderValue::from(u64)` makes two allocations per value.
static DIGITS: [[u8; 4]; 10_000] = digits();

const fn digits() -> [[u8; 4]; 10_000] {
    let mut table = [[0u8; 4]; 10_000];
    let mut n = 0;
    while n < 10_000 {
        table[n] = [digit(n / 1000), digit(n / 100), digit(n / 10), digit(n)];
        n += 1;
    }
    table
}

const fn digit(n: usize) -> u8 {
    b'0' + (n % 10) as u8
}

/// `n` as a header value, without an allocation below 10 000.
fn int_value(n: u64) -> HeaderValue {
    let skip = match n {
        0..=9 => 3,
        10..=99 => 2,
        100..=999 => 1,
        1_000..=9_999 => 0,
        _ => return HeaderValue::from(n),
    };
    let digits = Bytes::from_static(&DIGITS[n as usize][skip..]);
    HeaderValue::from_maybe_shared(digits).unwrap_or_else(|_| HeaderValue::from(n))
}

/// A stored 2xx other than 206: what preconditions apply to.
fn representation(entry: &Entry) -> bool {
    !entry.negative && (200..300).contains(&entry.status) && entry.status != 206
}

/// A stored 200: what ranges are served from (with `Accept-Ranges`).
fn whole_200(entry: &Entry) -> bool {
    representation(entry) && entry.status == 200
}

/// The status of an answer from a fresh entry.
pub(super) fn hit_status(entry: &Entry) -> CacheOutcome {
    if entry.negative {
        CacheOutcome::Negative
    } else {
        CacheOutcome::Hit
    }
}

/// A buffered answer as a response for one client.
pub(super) fn one_client(code: StatusCode, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(body::full(body));
    *resp.status_mut() = code;
    *resp.headers_mut() = headers;
    resp.headers_mut().remove(header::CONTENT_LENGTH);
    resp
}

/// A client response from an entry; hits carry `Age`. Stage 10 shapes it
/// for the client's preconditions and range, and adds the body.
pub(super) fn respond(
    route: &Route,
    entry: &Entry,
    status: CacheOutcome,
    ask: &ClientAsk,
) -> Response<Body> {
    respond_with(route, entry, entry_head(entry), status, ask)
}

/// [`respond`] from the entry's head built beforehand ([`entry_head`]).
pub(super) fn respond_with(
    route: &Route,
    entry: &Entry,
    head: HeaderMap,
    status: CacheOutcome,
    ask: &ClientAsk,
) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() =
        StatusCode::from_u16(entry.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    *resp.headers_mut() = head;
    let h = resp.headers_mut();
    // A stale answer's Age counts from the original fetch as well; a
    // fresh fill's answer carries the origin's own Age, if it sent one.
    let age = (publish::now_ms().saturating_sub(entry.stored_at_ms) / 1000)
        .min(cache_control::MAX_AGE_SECONDS);
    if age > 0
        || matches!(
            status,
            CacheOutcome::Hit | CacheOutcome::Negative | CacheOutcome::Stale
        )
    {
        h.insert(header::AGE, int_value(age));
    }
    client_cc::apply(route, entry, h);
    shape(resp, entry, ask)
}

/// A flight's answer as this client's response, with its `Cache-Status`
/// facts (`collapsed` when this request did not start the flight); `None`
/// for a one-client answer when this request did not start the flight. A
/// one-client answer (too large, or private to this client) goes out as
/// the origin sent it: no preconditions or range are applied to it.
pub(super) fn to_client(
    route: &Route,
    answer: &Answer,
    started: bool,
    ask: &ClientAsk,
) -> Option<(CacheOutcome, Facts, Response<Body>)> {
    let collapsed = !started;
    match answer {
        Answer::Shared(status, entry, trip) => {
            let facts = match trip.fwd_status {
                // Read from the store (another filler's entry): a hit.
                None => Facts::from_entry(entry),
                Some(_) => Facts {
                    fwd_status: trip.fwd_status,
                    stored: trip.stored,
                    ttl: trip.stored.then(|| Facts::from_entry(entry).ttl).flatten(),
                    ..Facts::default()
                },
            };
            let facts = Facts { collapsed, ..facts };
            Some((*status, facts, respond(route, entry, *status, ask)))
        }
        Answer::Failed(status, e) => {
            let facts = Facts {
                collapsed,
                ..Facts::default()
            };
            Some((*status, facts, e.to_response()))
        }
        Answer::Streaming(status, streaming) => {
            // `None` past `max_body`, once its first byte is gone.
            let reader = streaming.tee.reader(collapsed)?;
            let facts = Facts {
                fwd_status: Some(streaming.head.status),
                collapsed,
                ..Facts::default()
            };
            let resp = streamed(route, streaming, *status, body::boxed(reader));
            Some((*status, facts, resp))
        }
        Answer::Exclusive(..) | Answer::Starter(..) if !started => None,
        Answer::Starter(status, entry) => {
            let facts = Facts {
                fwd_status: Some(entry.status),
                ..Facts::default()
            };
            Some((*status, facts, respond(route, entry, *status, ask)))
        }
        Answer::Exclusive(status, slot) => {
            let taken = slot.lock().ok().and_then(|mut s| s.take())?;
            let facts = Facts {
                fwd_status: Some(taken.status().as_u16()),
                ..Facts::default()
            };
            Some((*status, facts, strip_body_for_head(taken, ask.head)))
        }
    }
}

/// A streamed fill's answer: its head as [`respond`] builds it from an
/// entry (no preconditions or range: a client that asked for them waits for
/// the whole body), the origin's `Content-Length` if it sent one, and the
/// body as it arrives.
fn streamed(route: &Route, s: &Streaming, status: CacheOutcome, body: Body) -> Response<Body> {
    let as_head = ClientAsk {
        head: true,
        ..ClientAsk::default()
    };
    let mut resp = respond(route, &s.head, status, &as_head);
    let h = resp.headers_mut();
    match s.length {
        Some(n) => h.insert(header::CONTENT_LENGTH, HeaderValue::from(n)),
        None => h.remove(header::CONTENT_LENGTH),
    };
    *resp.body_mut() = body;
    resp
}

fn strip_body_for_head(resp: Response<Body>, head: bool) -> Response<Body> {
    if !head {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, body::empty())
}

/// Completes `resp` — the entry's status and [`entry_head`], no body yet — for
/// this client: 412, 304, 206, 416, or the full answer (no body for HEAD).
pub(crate) fn shape(mut resp: Response<Body>, entry: &Entry, ask: &ClientAsk) -> Response<Body> {
    let conditional = representation(entry) && !ask.conditions.is_empty();
    let ranged = whole_200(entry) && !ask.range.is_empty();
    if conditional || ranged {
        let validators = Validators::of(&entry.headers);
        if conditional {
            match conditional::evaluate(&ask.conditions, &validators) {
                Precondition::Proceed => {}
                Precondition::NotModified => return not_modified(resp),
                Precondition::Failed => return precondition_failed(),
            }
        }
        if ranged {
            let len = entry.body.len() as u64;
            match range::evaluate(&ask.range, &validators, len) {
                RangeAnswer::Full => {}
                RangeAnswer::Partial(r) => return partial(resp, entry, r),
                RangeAnswer::Unsatisfiable => return unsatisfiable(len),
            }
        }
    }
    if !ask.head {
        *resp.body_mut() = body::full(entry.body.clone());
    }
    resp
}

fn not_modified(mut resp: Response<Body>) -> Response<Body> {
    *resp.status_mut() = StatusCode::NOT_MODIFIED;
    conditional::not_modified_headers(resp.headers_mut());
    resp.extensions_mut().insert(Shaped::NotModified);
    resp
}

fn precondition_failed() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::PRECONDITION_FAILED;
    resp.extensions_mut().insert(Shaped::PreconditionFailed);
    resp
}

fn partial(
    mut resp: Response<Body>,
    entry: &Entry,
    r: std::ops::RangeInclusive<u64>,
) -> Response<Body> {
    let len = entry.body.len() as u64;
    // `validate` keeps the range within the body; the slice cannot panic.
    let (first, last) = (*r.start() as usize, *r.end() as usize);
    *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_RANGE, range::content_range(&r, len));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(last - first + 1));
    *resp.body_mut() = body::full(entry.body.slice(first..=last));
    resp.extensions_mut().insert(Shaped::Partial);
    resp
}

fn unsatisfiable(len: u64) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    resp.headers_mut()
        .insert(header::CONTENT_RANGE, range::unsatisfied_range(len));
    resp.extensions_mut().insert(Shaped::RangeUnsatisfiable);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    #[test]
    fn int_values_are_the_decimal_text() {
        for n in [
            0,
            7,
            9,
            10,
            42,
            99,
            100,
            999,
            1_000,
            1_024,
            9_999,
            10_000,
            u64::MAX,
        ] {
            assert_eq!(int_value(n).as_bytes(), n.to_string().as_bytes(), "{n}");
        }
    }

    fn entry(status: u16, negative: bool) -> Entry {
        Entry {
            status,
            negative,
            stored_at_ms: 0,
            fresh_until_ms: u64::MAX,
            grace_ms: 0,
            stale_if_error_ms: 0,
            generation: Bytes::from_static(b"g"),
            identity: "app:1".into(),
            variant: "v".into(),
            headers: vec![
                (header::ETAG, HeaderValue::from_static("\"v2\"")),
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                ),
                (
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("max-age=60"),
                ),
            ],
            body: Bytes::from_static(b"0123456789"),
            tags: vec![],
        }
    }

    /// What `respond` hands to `shape`: status, headers, length, no body.
    fn head_of(e: &Entry) -> Response<Body> {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::from_u16(e.status).expect("status");
        *resp.headers_mut() = entry_head(e);
        resp
    }

    async fn run(
        e: &Entry,
        method: Method,
        pairs: &[(&'static str, &'static str)],
    ) -> (u16, HeaderMap, Bytes, Option<Shaped>) {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        let ask = ClientAsk::from_request(&method, &h);
        let resp = shape(head_of(e), e, &ask);
        let shaped = resp.extensions().get::<Shaped>().copied();
        let (parts, b) = resp.into_parts();
        let bytes = b.collect().await.expect("body").to_bytes();
        (parts.status.as_u16(), parts.headers, bytes, shaped)
    }

    #[tokio::test]
    async fn plain_get_and_head() {
        let e = entry(200, false);
        let (s, h, b, shaped) = run(&e, Method::GET, &[]).await;
        assert_eq!((s, &b[..], shaped), (200, &b"0123456789"[..], None));
        assert_eq!(
            h.get("accept-ranges").map(|v| v.as_bytes()),
            Some(&b"bytes"[..])
        );
        let (s, h, b, _) = run(&e, Method::HEAD, &[]).await;
        assert_eq!((s, b.len()), (200, 0));
        assert_eq!(
            h.get("content-length").map(|v| v.as_bytes()),
            Some(&b"10"[..])
        );
    }

    #[tokio::test]
    async fn not_modified_has_no_body_and_the_listed_headers() {
        let e = entry(200, false);
        for method in [Method::GET, Method::HEAD] {
            let (s, h, b, shaped) = run(&e, method, &[("if-none-match", "\"v1\", \"v2\"")]).await;
            assert_eq!((s, b.len(), shaped), (304, 0, Some(Shaped::NotModified)));
            assert_eq!(h.get("etag").map(|v| v.as_bytes()), Some(&b"\"v2\""[..]));
            assert!(h.get("cache-control").is_some());
            assert!(h.get("content-type").is_none() && h.get("content-length").is_none());
        }
        let (s, _, b, _) = run(&e, Method::GET, &[("if-none-match", "\"v1\"")]).await;
        assert_eq!((s, &b[..]), (200, &b"0123456789"[..]));
        let (s, _, b, shaped) = run(&e, Method::GET, &[("if-match", "\"v1\"")]).await;
        assert_eq!(
            (s, b.len(), shaped),
            (412, 0, Some(Shaped::PreconditionFailed))
        );
    }

    #[tokio::test]
    async fn ranges_cut_the_stored_body() {
        let e = entry(200, false);
        let (s, h, b, shaped) = run(&e, Method::GET, &[("range", "bytes=-3")]).await;
        assert_eq!(
            (s, &b[..], shaped),
            (206, &b"789"[..], Some(Shaped::Partial))
        );
        assert_eq!(
            h.get("content-range").map(|v| v.as_bytes()),
            Some(&b"bytes 7-9/10"[..])
        );
        assert_eq!(
            h.get("content-length").map(|v| v.as_bytes()),
            Some(&b"3"[..])
        );
        assert!(
            h.get("etag").is_some(),
            "a 206 keeps the representation's fields"
        );
        let (s, h, b, shaped) = run(&e, Method::GET, &[("range", "bytes=5-2")]).await;
        assert_eq!(
            (s, b.len(), shaped),
            (416, 0, Some(Shaped::RangeUnsatisfiable))
        );
        assert_eq!(
            h.get("content-range").map(|v| v.as_bytes()),
            Some(&b"bytes */10"[..])
        );
        let (s, _, b, _) = run(&e, Method::HEAD, &[("range", "bytes=0-1")]).await;
        assert_eq!((s, b.len()), (200, 0), "HEAD ignores Range");
        // Preconditions come first: a matching If-None-Match is a 304 even
        // with a Range.
        let (s, ..) = run(
            &e,
            Method::GET,
            &[("range", "bytes=0-1"), ("if-none-match", "*")],
        )
        .await;
        assert_eq!(s, 304);
        let (s, _, b, _) = run(
            &e,
            Method::GET,
            &[("range", "bytes=0-1"), ("if-range", "\"v1\"")],
        )
        .await;
        assert_eq!(
            (s, b.len()),
            (200, 10),
            "If-Range with an old tag: the full 200"
        );
    }

    #[tokio::test]
    async fn errors_and_partials_from_the_origin_are_never_shaped() {
        for e in [entry(404, true), entry(500, false), entry(206, false)] {
            let (s, h, b, shaped) = run(
                &e,
                Method::GET,
                &[
                    ("if-none-match", "*"),
                    ("range", "bytes=0-1"),
                    ("if-match", "\"zz\""),
                ],
            )
            .await;
            assert_eq!((s, b.len(), shaped), (e.status, 10, None));
            assert!(h.get("accept-ranges").is_none());
        }
        // A 2xx other than 200 answers preconditions but not ranges.
        let e = entry(203, false);
        let (s, ..) = run(&e, Method::GET, &[("if-none-match", "\"v2\"")]).await;
        assert_eq!(s, 304);
        let (s, _, b, _) = run(&e, Method::GET, &[("range", "bytes=0-1")]).await;
        assert_eq!((s, b.len()), (203, 10));
    }
}
