//! Forwarding fidelity (docs/architecture.md#forwarding): everything that is
//! not a cache read goes to the upstream untouched except for hop-by-hop
//! headers and `X-Forwarded-*`, streams both ways, tunnels WebSocket, and fails
//! as 400 (ambiguous framing, bad route param), 502 (unreachable), 504 (slow).

use crate::support::client::{self, request, request_h2};
use crate::support::{eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::HeaderMap;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

fn values(echo: &serde_json::Value, header: &str) -> Vec<String> {
    echo["headers"][header]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn methods_bodies_and_query_pass_through() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;

    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        let body = format!("payload for {method}");
        let resp = request(
            method,
            &sc.url("/echo/items?b=2&a=1&a=0"),
            &[],
            body.clone(),
        )
        .await;
        assert_eq!(resp.status, 200, "{method}");
        let echo = resp.json();
        assert_eq!(echo["method"], method);
        assert_eq!(echo["path"], "/echo/items");
        assert_eq!(echo["query"], "b=2&a=1&a=0", "query untouched, order kept");
        assert_eq!(echo["body"], body);
    }
    // HEAD: headers only.
    let resp = client::head(&sc.url("/plain")).await;
    assert_eq!(resp.status, 200);
    assert!(resp.body.is_empty());
    // A write on a cached route's path is forwarded as well.
    let resp = request("PUT", &sc.url("/api/tenants/acme/apps/7"), &[], "new").await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        origin
            .last_request("/api/tenants/acme/apps/7")
            .unwrap()
            .body,
        "new"
    );
    let forwarded = sc
        .metric(r#"sidecache_requests_total{result="forward",route="-"}"#)
        .await;
    assert_eq!(forwarded, Some(8.0));
}

#[tokio::test]
async fn status_codes_and_response_headers_pass_through() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    for status in [201u16, 204, 301, 404, 418, 500, 503] {
        let path = format!("/status/{status}");
        let mut reply = Reply::status(status)
            .header("x-custom", "one")
            .header("x-custom", "two")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2");
        if status == 301 {
            reply = reply.header("location", "/elsewhere");
        }
        if status != 204 {
            reply = reply.body(format!("status {status}"));
        }
        origin.reply(&path, reply);
        let resp = client::get(&sc.url(&path)).await;
        assert_eq!(resp.status, status);
        let custom: Vec<_> = resp.headers.get_all("x-custom").iter().collect();
        assert_eq!(custom, ["one", "two"]);
        assert_eq!(resp.headers.get_all("set-cookie").iter().count(), 2);
        if status == 301 {
            assert_eq!(resp.header("location").unwrap(), "/elsewhere");
        }
        if status != 204 {
            assert_eq!(resp.text(), format!("status {status}"));
        }
        assert!(
            resp.header("x-cache").is_none(),
            "forwarded answers are not cache answers"
        );
    }
}

#[tokio::test]
async fn hop_by_hop_removed_forwarded_added_host_kept() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    origin.reply(
        "/resp-hop",
        Reply::ok("x")
            .header("connection", "x-resp-secret")
            .header("x-resp-secret", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("x-resp-kept", "yes"),
    );

    let resp = request(
        "GET",
        &sc.url("/echo/hop"),
        &[
            ("host", "app.example.com"),
            ("connection", "keep-alive, X-Secret"),
            ("x-secret", "drop me"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic Zm9vOmJhcg=="),
            ("te", "gzip"),
            ("upgrade", "h2c"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=203.0.113.9"),
            ("x-kept", "yes"),
            ("authorization", "Bearer end-to-end"),
        ],
        "",
    )
    .await;
    assert_eq!(resp.status, 200);
    let echo = resp.json();
    for gone in [
        "connection",
        "x-secret",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "upgrade",
    ] {
        assert!(
            values(&echo, gone).is_empty(),
            "{gone} must not reach the upstream: {echo}"
        );
    }
    assert_eq!(values(&echo, "host"), ["app.example.com"]);
    assert_eq!(values(&echo, "x-forwarded-for"), ["203.0.113.9, 127.0.0.1"]);
    assert_eq!(values(&echo, "x-forwarded-proto"), ["http"]);
    assert_eq!(
        values(&echo, "forwarded"),
        ["for=203.0.113.9"],
        "Forwarded is left as is"
    );
    assert_eq!(values(&echo, "x-kept"), ["yes"]);
    assert_eq!(values(&echo, "authorization"), ["Bearer end-to-end"]);

    let resp = client::get(&sc.url("/resp-hop")).await;
    assert_eq!(resp.header("x-resp-kept").as_deref(), Some("yes"));
    for gone in ["x-resp-secret", "keep-alive", "proxy-authenticate"] {
        assert!(
            resp.header(gone).is_none(),
            "{gone} must not reach the client"
        );
    }
}

#[tokio::test]
async fn trailers_pass_both_ways() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    origin.reply(
        "/trailers",
        Reply::ok("data").trailer("x-checksum", "abc123"),
    );

    let req = client::build(
        "GET",
        &sc.url("/trailers"),
        &[("te", "trailers")],
        client::full(""),
    );
    let resp = client::send(req).await;
    assert_eq!(resp.text(), "data");
    let trailers = resp.trailers.expect("response trailers reach the client");
    assert_eq!(trailers["x-checksum"], "abc123");

    let mut t = HeaderMap::new();
    t.insert("x-upload-sum", "42".parse().unwrap());
    let req = client::build(
        "POST",
        &sc.url("/echo/upload"),
        &[("trailer", "x-upload-sum")],
        client::with_trailers("chunked body", t),
    );
    let echo = client::send(req).await.json();
    assert_eq!(echo["body"], "chunked body");
    assert_eq!(
        echo["trailers"]["x-upload-sum"],
        serde_json::json!(["42"]),
        "{echo}"
    );
}

#[tokio::test]
async fn ambiguous_framing_is_refused_and_never_forwarded() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let cases: [(&str, &str); 5] = [
        // hyper accepts CL + TE (drops CL); sidecache's framing guard refuses.
        ("CL then TE", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"),
        ("TE then CL", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nConnection: close\r\n\r\n0\r\n\r\n"),
        // hyper refuses these by itself.
        ("differing CLs", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello!"),
        ("CL list", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\nConnection: close\r\n\r\nhello!"),
        ("TE not chunked", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\nhello"),
    ];
    for (name, raw) in cases {
        let answer = client::raw(sc.addr(), raw.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{name}: {answer:?}");
    }
    assert_eq!(
        origin.total(),
        0,
        "no ambiguous request reached the upstream"
    );

    // On a keep-alive connection only the ambiguous request is refused.
    let pipelined = "GET /echo/first HTTP/1.1\r\nHost: x\r\n\r\n\
                     POST /echo/second HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let answer = client::raw(sc.addr(), pipelined.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.contains("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(origin.hits("/echo/first"), 1);
    assert_eq!(origin.hits("/echo/second"), 0);

    // A body that merely contains such a head is data, not a request.
    let inner = "GET /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let outer = format!(
        "POST /echo/body HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{inner}",
        inner.len()
    );
    let answer = client::raw(sc.addr(), outer.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test]
async fn bad_route_param_is_400_and_touches_nothing() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    for path in [
        "/api/tenants/acme/apps/0",
        "/api/tenants/acme/apps/12x",
        "/api/tenants/a%20b/apps/1",
    ] {
        let resp = client::get(&sc.url(path)).await;
        assert_eq!(resp.status, 400, "{path}: {}", resp.text());
    }
    assert_eq!(origin.total(), 0);
}

#[tokio::test]
async fn unreachable_upstream_is_502() {
    let nothing = crate::support::sidecache::free_addr();
    let sc = Sidecache::start(&format!("http://{nothing}")).await;
    let resp = client::get(&sc.url("/anything")).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.text(), "upstream unavailable\n");
    assert_eq!(
        sc.metric(r#"sidecache_upstream_errors_total{kind="connect"}"#)
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn slow_upstream_is_504() {
    let origin = Origin::start().await;
    origin.reply("/slow", Reply::ok("late").delay(Duration::from_secs(3)));
    let sc = SidecacheBuilder::new(origin.url())
        .upstream_timeout("300ms")
        .start()
        .await;
    let started = std::time::Instant::now();
    let resp = client::get(&sc.url("/slow")).await;
    assert_eq!(resp.status, 504);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at the timeout"
    );
    assert_eq!(
        sc.metric(r#"sidecache_upstream_errors_total{kind="timeout"}"#)
            .await,
        Some(1.0)
    );
    // The timeout covers the head only: a slow body keeps streaming.
    origin.reply("/big", Reply::stream(8 << 20));
    let resp = client::get(&sc.url("/big")).await;
    assert_eq!(resp.body.len(), 8 << 20);
}

#[tokio::test]
async fn websocket_is_tunnelled() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let url = format!("ws://{}/ws", sc.addr());
    let (mut ws, resp) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .expect("handshake in time")
    .expect("handshake through sidecache");
    assert_eq!(resp.status(), 101);
    for i in 0..3 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(back, Message::text(format!("hello {i}")));
    }
    ws.send(Message::binary(Bytes::from_static(&[0, 1, 2, 255])))
        .await
        .unwrap();
    let back = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back, Message::binary(Bytes::from_static(&[0, 1, 2, 255])));
    ws.close(None).await.unwrap();
    assert_eq!(origin.hits("/ws"), 1);
}

#[tokio::test]
async fn http2_client_is_forwarded_as_http11_with_host() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let resp = request_h2(
        "POST",
        &sc.url("/echo/h2?x=1"),
        &[("x-h2", "yes")],
        "over h2",
    )
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.version, http::Version::HTTP_2);
    let echo = resp.json();
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["body"], "over h2");
    assert_eq!(echo["query"], "x=1");
    assert_eq!(
        values(&echo, "host"),
        [sc.addr().to_string()],
        ":authority becomes Host"
    );
    assert_eq!(values(&echo, "x-h2"), ["yes"]);

    // A bad route param is refused over h2 too.
    let resp = request_h2("GET", &sc.url("/api/tenants/acme/apps/0"), &[], "").await;
    assert_eq!(resp.status, 400);
    assert_eq!(origin.hits("/api/tenants/acme/apps/0"), 0);
}

/// 256 MiB each way through one request (`/pipe` streams the upload back
/// while it arrives): sidecache must not buffer either direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_with_flat_memory() {
    const SIZE: u64 = 256 << 20;
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let before = sc.peak_rss_kib();

    let req = client::build("POST", &sc.url("/pipe"), &[], client::streamed(SIZE));
    let (status, _, received) = client::send_counting(req, Duration::from_secs(300)).await;
    assert_eq!(status, 200);
    assert_eq!(received, SIZE, "every byte came back");

    let req = client::build(
        "GET",
        &sc.url(&format!("/stream/{SIZE}")),
        &[],
        client::full(""),
    );
    let (status, _, received) = client::send_counting(req, Duration::from_secs(300)).await;
    assert_eq!(status, 200);
    assert_eq!(received, SIZE);

    let peak = sc.peak_rss_kib();
    eprintln!("sidecache peak RSS: {before} KiB at start, {peak} KiB after 3 x 256 MiB");
    assert!(
        peak < 64 * 1024,
        "peak RSS {peak} KiB >= 64 MiB: bodies are being buffered"
    );
}

#[tokio::test]
async fn connect_is_refused() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    let answer = client::raw(
        sc.addr(),
        b"CONNECT internal.example:22 HTTP/1.1\r\nHost: internal.example:22\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer:?}");
    assert_eq!(origin.total(), 0);
}

/// The upstream client keeps connections alive and reuses them, and a
/// connection the upstream closed while it was idle is not used again: the
/// next request goes out on a new one and succeeds.
///
/// No pause between requests: sidecache hands a connection back to its pool
/// as it reads the end of the upstream body, before its client has the whole
/// answer. After the third answer the test waits until sidecache has seen
/// the upstream's close (the origin reads sidecache's own close of that
/// connection), so the fourth request meets a pool whose connection is gone.
#[tokio::test]
async fn upstream_connections_are_reused_and_closed_ones_skipped() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let first_closed = Arc::new(AtomicBool::new(false));
    let closed = first_closed.clone();
    // A bare HTTP/1.1 origin: the first connection answers three requests
    // and then closes (its keep-alive "ran out"); later ones stay open.
    let origin = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            let limit = if first { 3 } else { usize::MAX };
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for _ in 0..limit {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut chunk = [0u8; 1024];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                }
                // Keep-alive ran out: close our side, then read until
                // sidecache closes its side too, i.e. it saw the close.
                let _ = stream.shutdown().await;
                let mut rest = [0u8; 1024];
                while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
                if first {
                    closed.store(true, Ordering::SeqCst);
                }
            });
        }
    });

    let sc = Sidecache::start(&format!("http://{addr}")).await;
    for i in 0..6 {
        let resp = client::get(&sc.url("/plain")).await;
        assert_eq!(resp.status, 200, "request {i}");
        assert_eq!(resp.text(), "ok");
        if i == 2 {
            eventually(
                "sidecache closes the upstream connection the origin closed",
                Duration::from_secs(5),
                || async { first_closed.load(Ordering::SeqCst) },
            )
            .await;
        }
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "one connection for three requests, one after it closed"
    );
    origin.abort();
}

/// A keep-alive connection that sits idle is parked (hyper's connection and
/// buffers dropped, the socket kept; `sidecache_connections_parked` counts
/// it): the next requests on the same socket, with or without a body, are
/// answered as if nothing happened, and a connection in use is not parked.
#[tokio::test]
async fn idle_keep_alive_connection_is_parked_and_resumed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one response (Content-Length framing) and returns status and body.
    async fn read_answer(stream: &mut tokio::net::TcpStream) -> (String, String) {
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed before an answer");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .expect("content-length");
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed inside a body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let status = head.lines().next().unwrap().to_owned();
        let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
        (status, body)
    }

    async fn parked(sc: &Sidecache) -> Option<f64> {
        sc.metric("sidecache_connections_parked").await
    }
    /// Idle past the parking delay (200 ms): the connection gets parked.
    async fn until_parked(sc: &Sidecache) {
        eventually(
            "the idle connection is parked",
            Duration::from_secs(5),
            || async { parked(sc).await == Some(1.0) },
        )
        .await;
    }

    let origin = Origin::start().await;
    origin.reply("/plain", Reply::ok("plain answer"));
    let sc = Sidecache::start(&origin.url()).await;
    let mut stream = tokio::net::TcpStream::connect(sc.addr()).await.unwrap();

    stream
        .write_all(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, body) = read_answer(&mut stream).await;
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body, "plain answer");

    // Parked, then resumed twice: a request with a body, then one without.
    until_parked(&sc).await;
    stream
        .write_all(b"POST /echo/after-park HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    let (status, body) = read_answer(&mut stream).await;
    assert!(status.contains(" 200 "), "{status}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], "/echo/after-park");
    assert_eq!(echo["body"], "hello");

    until_parked(&sc).await;
    // Held at the origin, the request is in flight: not parked any more.
    let gate = origin.hold("/plain");
    stream
        .write_all(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    gate.arrived(1).await;
    assert_eq!(
        parked(&sc).await,
        Some(0.0),
        "a busy connection is not parked"
    );
    gate.release();
    let (status, body) = read_answer(&mut stream).await;
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body, "plain answer");

    // The client closes a parked connection: it is no longer counted.
    until_parked(&sc).await;
    drop(stream);
    eventually(
        "the closed connection leaves the parked count",
        Duration::from_secs(5),
        || async { parked(&sc).await == Some(0.0) },
    )
    .await;
}
