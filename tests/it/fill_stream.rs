//! Fills stream to every waiter (docs/architecture.md#fills-stream-to-every-waiter),
//! through the real binary on the embedded store, against an origin the
//! test writes byte by byte on the raw connection (so it holds the rest of a
//! body while the clients are checked) and clients that read the raw
//! HTTP/1.1 answer as it arrives:
//!
//! - the request that started a fill and one that joined it both receive
//!   the first part of the body before the origin sends the rest, from one
//!   origin request, and the answer is then a HIT;
//! - an origin body that ends early fails both answers (short of
//!   `Content-Length`, or no terminating chunk; over h2 the stream is
//!   reset) and nothing is stored: the next request is a MISS;
//! - a body past `fill.max_body` streams to both waiters and the object is
//!   then PASS;
//! - a joiner of a streamed fill whose publish a route purge refused is cut,
//!   never completed, while the request that started it completes.

use crate::support::{eventually, Sidecache, SidecacheBuilder};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const P: &str = "/api/tenants/acme/apps/1";

/// Long enough for any step on a loaded machine; a wait this long fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// An origin that hands each request's connection to the test, after
/// reading its head: the test writes the answer, or part of it, itself.
struct RawOrigin {
    addr: SocketAddr,
    conns: mpsc::UnboundedReceiver<(String, TcpStream)>,
}

impl RawOrigin {
    async fn start() -> RawOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, conns) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let head = read_head(&mut stream).await;
                    let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                    let _ = tx.send((path, stream));
                });
            }
        });
        RawOrigin { addr, conns }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next request that reaches the origin.
    async fn request(&mut self) -> (String, TcpStream) {
        match tokio::time::timeout(PATIENCE, self.conns.recv()).await {
            Ok(Some(conn)) => conn,
            _ => panic!("no request reached the origin"),
        }
    }

    /// No further request reached the origin.
    fn none_since(&mut self) -> bool {
        self.conns.try_recv().is_err()
    }
}

/// Reads a request or response head (up to the blank line).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// An answer head; `length`: its `Content-Length`, else chunked.
fn answer_head(length: Option<usize>) -> String {
    let framing = match length {
        Some(n) => format!("content-length: {n}\r\n"),
        None => "transfer-encoding: chunked\r\n".into(),
    };
    format!("HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\n{framing}connection: close\r\n\r\n")
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

async fn write(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.expect("origin write");
    stream.flush().await.expect("origin flush");
}

/// A client's raw HTTP/1.1 exchange with sidecache, read as it arrives.
struct RawClient {
    stream: TcpStream,
    got: Vec<u8>,
}

impl RawClient {
    async fn get(sc: &Sidecache, path: &str) -> RawClient {
        let mut stream = TcpStream::connect(sc.addr()).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("request");
        RawClient {
            stream,
            got: Vec::new(),
        }
    }

    /// Reads until what arrived contains `needle`; panics after PATIENCE.
    async fn until(&mut self, needle: &[u8], what: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut buf = [0u8; 16 * 1024];
        while !self.got.windows(needle.len()).any(|w| w == needle) {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => self.got.extend_from_slice(&buf[..n]),
                Ok(_) => panic!("{what}: the connection closed first: {}", self.text()),
                Err(_) => panic!("{what}: not received in time: {}", self.text()),
            }
        }
    }

    /// Reads until sidecache closes the connection.
    async fn read_to_close(&mut self) {
        let read = tokio::time::timeout(PATIENCE, self.stream.read_to_end(&mut self.got)).await;
        match read {
            Ok(Ok(_)) => {}
            // A reset after an aborted body is a close too.
            Ok(Err(_)) => {}
            Err(_) => panic!("the answer never ended: {}", self.text()),
        }
    }

    fn text(&self) -> String {
        let shown = &self.got[..self.got.len().min(400)];
        String::from_utf8_lossy(shown).into_owned()
    }

    fn head(&self) -> String {
        let end = find(&self.got, b"\r\n\r\n").expect("an answer head");
        String::from_utf8_lossy(&self.got[..end]).to_ascii_lowercase()
    }

    fn header(&self, name: &str) -> Option<String> {
        let prefix = format!("{name}: ");
        self.head()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    /// The raw body after the head (chunk framing included).
    fn raw_body(&self) -> &[u8] {
        let end = find(&self.got, b"\r\n\r\n").expect("an answer head");
        &self.got[end + 4..]
    }

    /// The body, unchunked; `None` if a chunked body has no last chunk.
    fn body(&self) -> Option<Vec<u8>> {
        if self.header("transfer-encoding").as_deref() != Some("chunked") {
            return Some(self.raw_body().to_vec());
        }
        let mut rest = self.raw_body();
        let mut out = Vec::new();
        loop {
            let line = find(rest, b"\r\n")?;
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..line]).ok()?, 16).ok()?;
            rest = &rest[line + 2..];
            if size == 0 {
                return rest.starts_with(b"\r\n").then_some(out);
            }
            if rest.len() < size + 2 {
                return None;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn start(origin: &RawOrigin, fill: &str) -> Sidecache {
    SidecacheBuilder::new(origin.url()).fill(fill).start().await
}

/// Waits until `n` requests joined a running fill.
async fn joined(sc: &Sidecache, n: f64) {
    eventually("the second request joins the fill", PATIENCE, || async {
        sc.metric_sum("sidecache_coalesced_total", &[("route", "app")])
            .await
            >= n
    })
    .await;
}

/// The whole answer of a request served without the origin.
async fn served(sc: &Sidecache) -> RawClient {
    let mut c = RawClient::get(sc, P).await;
    c.read_to_close().await;
    c
}

/// Nothing was stored: the next request is a fill of its own, which the
/// origin answers with `body`, whole.
async fn next_is_a_fill(sc: &Sidecache, origin: &mut RawOrigin, body: &[u8]) {
    let mut next = RawClient::get(sc, P).await;
    let (_, mut upstream) = origin.request().await;
    write(&mut upstream, answer_head(Some(body.len())).as_bytes()).await;
    write(&mut upstream, body).await;
    drop(upstream);
    next.read_to_close().await;
    assert_eq!(next.header("x-cache").as_deref(), Some("miss"));
    assert_eq!(next.body().as_deref(), Some(body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requester_and_a_joiner_get_the_first_bytes_before_the_origin_sends_the_rest() {
    let mut origin = RawOrigin::start().await;
    let sc = start(&origin, "").await;
    let (first, rest) = (
        b"first part of the body;".as_slice(),
        b" and the rest".as_slice(),
    );
    let whole = [first, rest].concat();

    let mut starter = RawClient::get(&sc, P).await;
    let (path, mut upstream) = origin.request().await;
    assert_eq!(path, P);
    write(&mut upstream, answer_head(Some(whole.len())).as_bytes()).await;
    write(&mut upstream, first).await;
    starter.until(first, "the starter's first bytes").await;

    let mut joiner = RawClient::get(&sc, P).await;
    joined(&sc, 1.0).await;
    joiner.until(first, "the joiner's first bytes").await;

    write(&mut upstream, rest).await;
    drop(upstream);
    for (who, c) in [("starter", &mut starter), ("joiner", &mut joiner)] {
        c.read_to_close().await;
        assert_eq!(c.header("x-cache").as_deref(), Some("miss"), "{who}");
        let length = whole.len().to_string();
        assert_eq!(c.header("content-length"), Some(length), "{who}");
        assert_eq!(c.body().as_deref(), Some(&whole[..]), "{who}");
    }
    let hit = served(&sc).await;
    assert_eq!(hit.header("x-cache").as_deref(), Some("hit"));
    assert_eq!(hit.body().as_deref(), Some(&whole[..]));
    assert!(origin.none_since(), "one origin request for all three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_body_that_ends_early_fails_every_waiter_and_nothing_is_stored() {
    let mut origin = RawOrigin::start().await;
    let sc = start(&origin, "").await;
    let part = b"0123456789".as_slice();
    for declared in [Some(100), None] {
        let mut starter = RawClient::get(&sc, P).await;
        let (_, mut upstream) = origin.request().await;
        write(&mut upstream, answer_head(declared).as_bytes()).await;
        let sent = match declared {
            Some(_) => part.to_vec(),
            None => chunk(part),
        };
        write(&mut upstream, &sent).await;
        starter.until(part, "the starter's first bytes").await;
        let mut joiner = RawClient::get(&sc, P).await;
        joined(&sc, if declared.is_some() { 1.0 } else { 2.0 }).await;
        joiner.until(part, "the joiner's first bytes").await;
        // The origin goes away mid-body.
        drop(upstream);
        for (who, c) in [("starter", &mut starter), ("joiner", &mut joiner)] {
            c.read_to_close().await;
            assert_eq!(c.header("x-cache").as_deref(), Some("miss"), "{who}");
            match declared {
                Some(n) => {
                    assert_eq!(c.header("content-length"), Some(n.to_string()), "{who}");
                    assert!(c.raw_body().len() < n, "{who}: a short body: {}", c.text());
                }
                None => assert_eq!(c.body(), None, "{who}: no last chunk: {}", c.text()),
            }
        }
        next_is_a_fill(&sc, &mut origin, part).await;
        let published = sc
            .metric_sum("sidecache_publish_total", &[("outcome", "published")])
            .await;
        assert!(published >= 1.0);
        // Forget the whole answer for the next round.
        let purge = crate::cache::invalidate(&sc, "app", r#"{"tenant":"acme","id":"1"}"#).await;
        assert_eq!(purge.status, 200, "{}", purge.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_max_body_streams_to_every_waiter_and_the_object_is_then_passed() {
    let mut origin = RawOrigin::start().await;
    let sc = start(&origin, "fill:\n  max_body: 4KiB\n").await;
    let (first, rest) = (vec![b'a'; 3000], vec![b'b'; 7000]);
    let whole = [first.as_slice(), rest.as_slice()].concat();

    let mut starter = RawClient::get(&sc, P).await;
    let (_, mut upstream) = origin.request().await;
    write(&mut upstream, answer_head(None).as_bytes()).await;
    write(&mut upstream, &chunk(&first)).await;
    starter.until(&first, "the starter's first bytes").await;
    let mut joiner = RawClient::get(&sc, P).await;
    joined(&sc, 1.0).await;
    joiner.until(&first, "the joiner's first bytes").await;

    write(&mut upstream, &chunk(&rest)).await;
    write(&mut upstream, b"0\r\n\r\n").await;
    drop(upstream);
    for (who, c) in [("starter", &mut starter), ("joiner", &mut joiner)] {
        c.read_to_close().await;
        assert_eq!(c.header("x-cache").as_deref(), Some("miss"), "{who}");
        assert_eq!(c.body().as_deref(), Some(&whole[..]), "{who}");
    }
    let too_large = sc
        .metric_sum("sidecache_publish_total", &[("outcome", "too_large")])
        .await;
    assert_eq!(too_large, 1.0);

    // Hit-for-pass: forwarded as it came, from an origin request of its own.
    let mut passed = RawClient::get(&sc, P).await;
    let (_, mut upstream) = origin.request().await;
    write(&mut upstream, answer_head(Some(whole.len())).as_bytes()).await;
    write(&mut upstream, &whole).await;
    drop(upstream);
    passed.read_to_close().await;
    assert_eq!(passed.header("x-cache").as_deref(), Some("pass"));
    assert_eq!(passed.body().as_deref(), Some(&whole[..]));
}

/// A route purge during a streamed fill: its publish is refused, the
/// request that started it still completes, and the joiner, which may not
/// be handed an answer fetched before the purge, is cut short of the end
/// instead of completing (docs/architecture.md#no-older-answer-after-an-invalidation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_of_a_streamed_fill_refused_by_a_purge_is_cut_and_nothing_is_stored() {
    let mut origin = RawOrigin::start().await;
    let sc = start(&origin, "").await;
    let (first, rest) = (b"before the purge;".as_slice(), b" the rest".as_slice());
    let whole = [first, rest].concat();

    let mut starter = RawClient::get(&sc, P).await;
    let (_, mut upstream) = origin.request().await;
    write(&mut upstream, answer_head(Some(whole.len())).as_bytes()).await;
    write(&mut upstream, first).await;
    starter.until(first, "the starter's first bytes").await;
    let mut joiner = RawClient::get(&sc, P).await;
    joined(&sc, 1.0).await;
    joiner.until(first, "the joiner's first bytes").await;

    let purge = crate::support::client::request(
        "POST",
        &sc.admin_url("/admin/invalidate"),
        &[("content-type", "application/json")],
        r#"{"route":"app"}"#.to_owned(),
    )
    .await;
    assert_eq!(purge.status, 200, "{}", purge.text());
    write(&mut upstream, rest).await;
    drop(upstream);

    starter.read_to_close().await;
    assert_eq!(starter.body().as_deref(), Some(&whole[..]), "the starter");
    joiner.read_to_close().await;
    assert!(
        joiner.raw_body().len() < whole.len(),
        "the joiner is cut: {}",
        joiner.text()
    );
    let rejected = sc
        .metric_sum(
            "sidecache_publish_total",
            &[("outcome", "publish_rejected")],
        )
        .await;
    assert_eq!(rejected, 1.0);
    next_is_a_fill(&sc, &mut origin, rest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_h2_an_origin_body_that_ends_early_resets_the_stream_and_nothing_is_stored() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let mut origin = RawOrigin::start().await;
    let sc = start(&origin, "").await;
    let part = b"0123456789".as_slice();
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<bytes::Bytes>>();
    let req = http::Request::get(sc.url(P))
        .body(Empty::new())
        .expect("a request");
    let answer = tokio::spawn(client.request(req));
    let (_, mut upstream) = origin.request().await;
    write(&mut upstream, answer_head(Some(100)).as_bytes()).await;
    write(&mut upstream, part).await;
    let resp = tokio::time::timeout(PATIENCE, answer)
        .await
        .expect("the h2 answer's head in time")
        .expect("the request task")
        .expect("the h2 answer's head");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()["x-cache"], "MISS");
    let mut body = resp.into_body();
    let first = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("the first bytes in time")
        .expect("a first frame")
        .expect("the first bytes");
    assert_eq!(first.into_data().ok().as_deref(), Some(part));
    // The origin goes away mid-body: the client must see the stream reset,
    // not a clean end of a 10-byte answer.
    drop(upstream);
    let end = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("the end of the stream in time");
    match end {
        Some(Err(e)) => {
            let text = format!("{e:?}");
            assert!(text.contains("Reset") || text.contains("RST"), "{text}");
        }
        other => panic!("a clean end instead of RST_STREAM: {other:?}"),
    }
    next_is_a_fill(&sc, &mut origin, part).await;
}
