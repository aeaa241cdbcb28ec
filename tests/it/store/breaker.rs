//! Redis-only, through `GuardedStore` (the way the pipeline calls the
//! store): Redis down when the store is built, killed and restarted, paused
//! with `CLIENT PAUSE`; calls bounded by the command timeout, the breaker
//! opening, probing once per cooldown and closing again.

use super::{eventually, keys, redis_config, COMMAND_TIMEOUT, COOLDOWN, GEN_TTL};
use crate::support::redis::RedisServer;
use sidecache::metrics::Metrics;
use sidecache::store::{GuardedStore, RedisStore, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn guarded(server: &RedisServer, metrics: &Metrics) -> GuardedStore {
    let store = RedisStore::connect(
        &redis_config(server, COMMAND_TIMEOUT),
        Duration::from_millis(100),
        metrics,
    )
    .expect("redis store");
    GuardedStore::new(Arc::new(store), Some(COMMAND_TIMEOUT), COOLDOWN, metrics)
}

fn store_errors(metrics: &Metrics, op: &str) -> u64 {
    metrics.store_errors.with_label_values(&[op]).get()
}

/// The store is built while Redis is down (sidecache starts degraded) and
/// works once Redis is up, without being rebuilt.
#[tokio::test]
async fn store_built_while_redis_is_down_connects_later() {
    let server = RedisServer::start();
    server.kill();
    let metrics = Metrics::new();
    let store = guarded(&server, &metrics);
    let k = keys("late");
    let started = Instant::now();
    assert!(store.read(&k).await.is_err());
    assert!(started.elapsed() < 2 * COMMAND_TIMEOUT);

    server.restart();
    eventually("store reachable after Redis started", || async {
        store.read(&k).await.is_ok()
    })
    .await;
    assert!(!store.breaker_is_open());
}

/// SIGKILL: calls fail within the command timeout (not the client's
/// reconnect backoff), the breaker opens, and after a restart the same store
/// works again.
#[tokio::test]
async fn killed_server_fails_fast_and_recovers_after_restart() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let store = guarded(&server, &metrics);
    let k = keys("kill");
    store.ticket(k.generation(), "n", GEN_TTL).await.unwrap();

    server.kill();
    let started = Instant::now();
    let err = store.read(&k).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took < 2 * COMMAND_TIMEOUT,
        "first call after kill took {took:?} ({err})"
    );
    assert!(store.breaker_is_open());
    assert_eq!(metrics.breaker_open.get(), 1);
    assert_eq!(store_errors(&metrics, "read"), 1);

    // Every call while Redis stays dead is bounded too: skipped at once while
    // open, and the probe after each cooldown by the command timeout.
    let until = Instant::now() + 3 * COOLDOWN;
    while Instant::now() < until {
        let started = Instant::now();
        let result = store.read(&k).await;
        assert!(result.is_err());
        assert!(
            started.elapsed() < 2 * COMMAND_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        store_errors(&metrics, "read") >= 2,
        "probes were made and failed"
    );

    server.restart();
    eventually("store works again after restart", || async {
        store.read(&k).await.is_ok()
    })
    .await;
    assert!(!store.breaker_is_open());
    assert_eq!(metrics.breaker_open.get(), 0);
    // Data is gone with the restart: a ticket is simply created again.
    assert!(!store
        .ticket(k.generation(), "n2", GEN_TTL)
        .await
        .unwrap()
        .is_empty());
}

/// CLIENT PAUSE: calls hang server-side; the guard times them out at the
/// command timeout, the breaker opens, exactly one probe per cooldown is let
/// through, and once the pause is over a probe closes the breaker.
#[tokio::test]
async fn paused_server_times_out_opens_breaker_and_one_probe_closes_it() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let store = Arc::new(guarded(&server, &metrics));
    let k = keys("pause");
    store.ticket(k.generation(), "n", GEN_TTL).await.unwrap();

    let pause = Duration::from_millis(2000);
    server.pause(pause.as_millis() as u64);
    let paused_at = Instant::now();

    let started = Instant::now();
    let err = store.read(&k).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, StoreError::Timeout), "{err}");
    assert!(
        took >= COMMAND_TIMEOUT && took < 2 * COMMAND_TIMEOUT,
        "took {took:?}"
    );
    assert!(store.breaker_is_open());

    // Open: skipped at once.
    let started = Instant::now();
    assert!(matches!(store.read(&k).await, Err(StoreError::BreakerOpen)));
    assert!(started.elapsed() < Duration::from_millis(50));

    // After the cooldown, still paused: many concurrent callers, one probe.
    tokio::time::sleep(COOLDOWN).await;
    assert!(
        paused_at.elapsed() + COMMAND_TIMEOUT < pause,
        "test too slow for its pause"
    );
    let calls = (0..16).map(|_| {
        let store = store.clone();
        let k = k.clone();
        tokio::spawn(async move { store.read(&k).await })
    });
    let results: Vec<_> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let probes = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::Timeout)))
        .count();
    let skipped = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::BreakerOpen)))
        .count();
    assert_eq!((probes, skipped), (1, 15), "{results:?}");
    assert_eq!(store_errors(&metrics, "read"), 2);

    // After the pause and a cooldown, a probe succeeds and closes it.
    eventually("breaker closes after the pause", || async {
        store.read(&k).await.is_ok()
    })
    .await;
    assert!(paused_at.elapsed() >= pause);
    assert!(!store.breaker_is_open());
    assert_eq!(metrics.breaker_open.get(), 0);
}
