//! The access log: one line per request with what happened to it, the
//! query only on request, hot reload, request ids passed or generated,
//! trace headers reaching the upstream untouched, and a blocked output
//! that never blocks a request.

use crate::support::client::{self, request};
use crate::support::{app_routes, eventually, Origin, Reply, Sidecache, SidecacheBuilder};
use std::time::Duration;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn logged(extra: &str) -> String {
    format!("access_log:\n  enabled: true\n  format: json\n{extra}")
}

/// Waits for `n` lines. Lines of requests answered on different threads
/// may be written out of order (each thread has its own shard), so a test
/// that looks at lines by position waits for each request's line before
/// it sends the next.
async fn lines(sc: &Sidecache, n: usize) -> Vec<serde_json::Value> {
    eventually(
        &format!("{n} access log lines"),
        Duration::from_secs(10),
        || async { sc.access_log_json().len() >= n },
    )
    .await;
    sc.access_log_json()
}

#[tokio::test]
async fn one_line_per_request_with_what_happened() {
    let origin = Origin::start().await;
    let app = "/api/tenants/acme/apps/1";
    // The fill waits 60 ms at the origin: its upstream time shows it.
    origin.reply(app, Reply::ok("app one").delay(Duration::from_millis(60)));
    let sc = SidecacheBuilder::new(origin.url())
        .extra(&logged(""))
        .start()
        .await;

    let tp = [("traceparent", TRACEPARENT)];
    let miss = request("GET", &sc.url(&format!("{app}?secret=s3")), &tp, "").await;
    assert_eq!(client::x_cache(&miss), "MISS");
    lines(&sc, 1).await;
    let hit = request(
        "GET",
        &sc.url(&format!("{app}?secret=s3")),
        &[("x-request-id", "req-7")],
        "",
    )
    .await;
    assert_eq!(client::x_cache(&hit), "HIT");
    lines(&sc, 2).await;
    let fwd = client::get(&sc.url("/echo/a?token=t")).await;
    assert_eq!(fwd.status, 200);
    lines(&sc, 3).await;
    let bad = client::get(&sc.url("/api/tenants/ac!me/apps/1")).await;
    assert_eq!(bad.status, 400);

    let l = lines(&sc, 4).await;
    assert_eq!(l.len(), 4, "{l:?}");
    for line in &l {
        assert_eq!(line["method"], "GET");
        assert!(
            line.get("query").is_none(),
            "query is off by default: {line}"
        );
        assert!(
            !line["path"].as_str().unwrap_or("?").contains('?'),
            "{line}"
        );
        assert!(
            line["peer"]
                .as_str()
                .unwrap_or("")
                .starts_with("127.0.0.1:"),
            "{line}"
        );
        assert!(line["time"].as_str().unwrap_or("").ends_with('Z'), "{line}");
    }
    let (miss_l, hit_l, fwd_l, bad_l) = (&l[0], &l[1], &l[2], &l[3]);
    assert_eq!(miss_l["path"], app);
    assert_eq!(miss_l["status"], 200);
    assert_eq!(miss_l["cache"], "MISS");
    assert_eq!(miss_l["route"], "app");
    assert_eq!(miss_l["bytes"], 7);
    assert_eq!(miss_l["id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let up = miss_l["upstream_ms"]
        .as_f64()
        .expect("a fill calls the upstream");
    assert!(up >= 60.0, "upstream_ms {up}");
    assert!(
        miss_l["duration_ms"].as_f64().unwrap_or(0.0) >= up,
        "{miss_l}"
    );

    assert_eq!(hit_l["cache"], "HIT");
    assert!(
        hit_l["upstream_ms"].is_null(),
        "a hit calls no upstream: {hit_l}"
    );
    assert_eq!(hit_l["bytes"], 7);
    assert_eq!(hit_l["id"], "req-7");

    assert_eq!(fwd_l["path"], "/echo/a");
    assert_eq!(fwd_l["cache"], "-");
    assert_eq!(fwd_l["route"], "-");
    assert!(fwd_l["upstream_ms"].as_f64().is_some(), "{fwd_l}");
    assert_eq!(fwd_l["bytes"].as_u64(), Some(fwd.body.len() as u64));
    assert!(fwd_l["id"].is_null());

    assert_eq!(bad_l["status"], 400);
    assert_eq!(bad_l["route"], "app");
    assert!(bad_l["upstream_ms"].is_null());
}

#[tokio::test]
async fn reload_turns_it_on_and_changes_format_and_query() {
    let origin = Origin::start().await;
    let sc = Sidecache::start(&origin.url()).await;
    client::get(&sc.url("/echo/before")).await;

    let reloads = || async {
        sc.metric("sidecache_config_reloads_total{outcome=\"applied\"}")
            .await
            .unwrap_or(0.0)
    };
    sc.rewrite_config(&sc.builder().extra(&logged("  query: true\n")).render());
    eventually("reload applied", Duration::from_secs(10), || async {
        reloads().await >= 1.0
    })
    .await;
    client::get(&sc.url("/echo/after?x=1")).await;
    let l = lines(&sc, 1).await;
    // Had the first request been logged, its line would have been written
    // before the reload was even applied (the writer takes lines within
    // milliseconds), so it would be here.
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["path"], "/echo/after");
    assert_eq!(l[0]["query"], "x=1");

    sc.rewrite_config(
        &sc.builder()
            .extra("access_log: { enabled: true, format: text }\n")
            .render(),
    );
    eventually("second reload", Duration::from_secs(10), || async {
        reloads().await >= 2.0
    })
    .await;
    client::get(&sc.url("/echo/text?y=2")).await;
    eventually("a text line", Duration::from_secs(10), || async {
        sc.stdout_text().lines().count() >= 2
    })
    .await;
    let text = sc.stdout_text();
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("time="), "{last}");
    assert!(
        last.contains(" method=GET path=/echo/text status=200 cache=- route=- "),
        "{last}"
    );
    assert!(!last.contains("y=2"), "query back off: {last}");
}

#[tokio::test]
async fn sampling_logs_a_share() {
    let origin = Origin::start().await;
    // 1e-9: 100 requests are all left out (but for a chance of 1e-7).
    let sc = SidecacheBuilder::new(origin.url())
        .extra(&logged("  sample: 0.000000001\n"))
        .start()
        .await;
    for _ in 0..100 {
        client::get(&sc.url("/echo/s")).await;
    }
    sc.rewrite_config(&sc.builder().extra(&logged("")).render());
    eventually("reload applied", Duration::from_secs(10), || async {
        sc.metric("sidecache_config_reloads_total{outcome=\"applied\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    client::get(&sc.url("/echo/all")).await;
    let l = lines(&sc, 1).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["path"], "/echo/all");
}

#[tokio::test]
async fn trace_headers_reach_the_upstream_untouched() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .extra(&logged("  request_id: generate\n"))
        .start()
        .await;
    // Odd but valid: upper-case vendor keys, spaces, two tracestate lines.
    let trace = [
        ("traceparent", TRACEPARENT),
        ("tracestate", "vendorA=x1 , Congo=t61rcWkgMzE"),
        ("tracestate", "rojo=00f067aa0ba902b7"),
    ];
    let app = "/api/tenants/acme/apps/2";
    let cases = [
        ("forwarded", "/echo/t".to_owned(), trace.to_vec()),
        ("fill", app.to_owned(), trace.to_vec()),
        // A cookie not in `vary`: BYPASS, forwarded as it is.
        (
            "bypass",
            app.to_owned(),
            [&trace[..], &[("cookie", "c=1")]].concat(),
        ),
    ];
    for (n, (what, path, headers)) in cases.into_iter().enumerate() {
        let resp = request("GET", &sc.url(&path), &headers, "").await;
        assert_eq!(resp.status, 200, "{what}");
        lines(&sc, n + 1).await;
        let seen = origin.last_request(&path).expect("reached the origin");
        let values = |name: &str| -> Vec<&[u8]> {
            seen.headers
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes())
                .collect()
        };
        assert_eq!(values("traceparent"), [TRACEPARENT.as_bytes()], "{what}");
        assert_eq!(
            values("tracestate"),
            [
                &b"vendorA=x1 , Congo=t61rcWkgMzE"[..],
                b"rojo=00f067aa0ba902b7"
            ],
            "{what}"
        );
    }
    let l = lines(&sc, 3).await;
    for line in &l {
        assert_eq!(line["id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{line}");
    }
    assert_eq!(l[2]["cache"], "BYPASS");
}

#[tokio::test]
async fn request_ids_are_passed_through_or_generated() {
    let origin = Origin::start().await;
    let sc = SidecacheBuilder::new(origin.url())
        .extra(&logged("  request_id: generate\n"))
        .start()
        .await;
    let app = "/api/tenants/acme/apps/3";

    // None sent: one is made, sent upstream (forward and fill) and back.
    for (n, path) in ["/echo/id", app].into_iter().enumerate() {
        let resp = client::get(&sc.url(path)).await;
        lines(&sc, n + 1).await;
        let id = resp.header("x-request-id").expect("generated id");
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let seen = origin.last_request(path).expect("reached the origin");
        assert_eq!(
            seen.headers.get("x-request-id").map(|v| v.as_bytes()),
            Some(id.as_bytes())
        );
    }
    // A hit answers with this request's id, not the filler's.
    let hit = client::get(&sc.url(app)).await;
    assert_eq!(client::x_cache(&hit), "HIT");
    let hit_id = hit.header("x-request-id").expect("id on a hit");
    let l = lines(&sc, 3).await;
    assert_eq!(l[2]["id"].as_str(), Some(hit_id.as_str()));
    assert_ne!(l[1]["id"], l[2]["id"]);

    // Sent: passed through untouched, once, and echoed.
    let resp = request(
        "GET",
        &sc.url("/echo/mine"),
        &[("x-request-id", "Client-ID 42")],
        "",
    )
    .await;
    assert_eq!(resp.header("x-request-id").as_deref(), Some("Client-ID 42"));
    let seen = origin
        .last_request("/echo/mine")
        .expect("reached the origin");
    let ids: Vec<&[u8]> = seen
        .headers
        .get_all("x-request-id")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    assert_eq!(ids, [&b"Client-ID 42"[..]]);

    // `pass` (the default): nothing is added.
    let plain = Sidecache::start(&origin.url()).await;
    let resp = client::get(&plain.url("/echo/plain")).await;
    assert_eq!(resp.header("x-request-id"), None);
    let seen = origin
        .last_request("/echo/plain")
        .expect("reached the origin");
    assert!(seen.headers.get("x-request-id").is_none());
}

#[tokio::test]
async fn a_blocked_output_drops_lines_and_never_blocks_a_request() {
    let origin = Origin::start().await;
    // stdout is a pipe nobody reads: after ~64 KiB the writer blocks for
    // good, the one-line buffer fills, and every later line is dropped.
    let sc = SidecacheBuilder::new(origin.url())
        .routes(&app_routes(""))
        .extra(&logged("  buffer: 1\n"))
        .stdout_unread()
        .start()
        .await;
    let url = sc.url("/api/tenants/acme/apps/4");
    for _ in 0..2000 {
        // Each must be answered within the client's timeout.
        assert_eq!(client::get(&url).await.status, 200);
    }
    let dropped = sc
        .metric("sidecache_access_log_dropped_total{reason=\"buffer_full\"}")
        .await
        .unwrap_or(0.0);
    // The pipe holds a few hundred lines; the rest cannot have been written.
    assert!(dropped >= 1000.0, "dropped {dropped}");
}
