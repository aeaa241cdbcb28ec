//! `server.runtime: per_core` (docs/configuration.md#runtime-layout): one
//! current-thread runtime per worker thread, each with its own `SO_REUSEPORT`
//! listener and upstream pool, under one shared connection cap.

use crate::support::client;
use crate::support::{Origin, Sidecache, SidecacheBuilder};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn per_core(workers: usize, more: &str) -> String {
    format!("server:\n  runtime: per_core\n  workers: {workers}\n{more}")
}

/// Threads of process `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task: {e}"));
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// TCP sockets in state LISTEN on `port` (IPv4, this network namespace).
fn listeners_on(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 3 && cols[1].ends_with(&local) && cols[3] == "0A"
        })
        .count()
}

/// A bare keep-alive HTTP/1.1 origin that answers every request `200 ok`
/// and counts the connections it accepted.
async fn counting_origin() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind origin");
    let addr = listener.local_addr().expect("origin addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut chunk = [0u8; 1024];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map_or(buf.len(), |p| p + 4);
                    buf.drain(..end);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// One request on a fresh connection that the client closes after it.
async fn one_request(addr: std::net::SocketAddr, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("request");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answered within 5 s")
        .expect("read");
    out
}

/// Every worker has a thread, a listener on the one port and a pool of
/// its own: requests one after the other on fresh connections land on
/// several workers (the kernel spreads connections over the listeners),
/// and each worker opens its own upstream connection, at most one per
/// worker since the requests never overlap. (With one shared pool, as in
/// `multi_thread`, all of them reuse one upstream connection.)
#[tokio::test]
async fn per_core_workers_have_their_own_listener_and_pool() {
    let (origin, accepted) = counting_origin().await;
    let sc = SidecacheBuilder::new(format!("http://{origin}"))
        .extra(&per_core(3, ""))
        .start()
        .await;
    assert_eq!(
        threads_named(sc.pid(), "sc-worker-"),
        3,
        "one thread per worker"
    );
    assert_eq!(
        listeners_on(sc.addr().port()),
        3,
        "one listening socket per worker on the listen port"
    );

    for i in 0..30 {
        let out = one_request(sc.addr(), &format!("/plain/{i}")).await;
        assert!(
            out.starts_with(b"HTTP/1.1 200") && out.ends_with(b"ok"),
            "request {i}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    let upstream = accepted.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&upstream),
        "30 sequential requests over 3 workers opened {upstream} upstream connections \
         (want one per worker that got a client: 2 or 3)"
    );
    let forwarded = sc
        .metric(r#"sidecache_requests_total{result="forward",route="-"}"#)
        .await;
    assert_eq!(forwarded, Some(30.0));
}

/// `limits.max_connections` holds for all workers together, not per
/// worker: with 4 workers and a cap of 3, three busy connections keep a
/// fourth client waiting until one closes.
#[tokio::test]
async fn per_core_connection_cap_is_shared_by_the_workers() {
    let origin = Origin::start().await;
    let sc: Sidecache = SidecacheBuilder::new(origin.url())
        .extra(&per_core(4, "limits:\n  max_connections: 3\n"))
        .start()
        .await;

    let gate = origin.hold("/echo/held");
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(sc.addr()).await.expect("connect");
        s.write_all(b"GET /echo/held HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        held.push(s);
    }
    gate.arrived(3).await;
    assert_eq!(sc.metric("sidecache_client_connections").await, Some(3.0));

    let fourth = tokio::spawn({
        let url = sc.url("/echo/fourth");
        async move { client::try_get(&url, Duration::from_secs(10)).await }
    });
    // The elapsed time is the point: for this long the fourth client must
    // not be answered, whichever worker's listener it reached.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !fourth.is_finished(),
        "a client over max_connections was answered"
    );
    assert_eq!(sc.metric("sidecache_client_connections").await, Some(3.0));

    let freed = Instant::now();
    drop(held.pop());
    let resp = fourth
        .await
        .expect("task")
        .expect("served once a place is free");
    assert_eq!(resp.status, 200);
    assert!(
        freed.elapsed() < Duration::from_secs(2),
        "served {:?} after a close",
        freed.elapsed()
    );
    gate.release();
}
