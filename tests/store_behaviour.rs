//! One behavioural suite for the `Store` contract (SPEC §5.1, §5.4), run
//! against both backends: the embedded `MemoryStore` (paused Tokio time, so
//! TTLs expire virtually) and `RedisStore` on a private redis-server started
//! by the harness (real time). Then Redis-only fault tests: script cache
//! flushed, server killed and restarted, server paused; all through
//! `GuardedStore`, the way the pipeline calls the store.
//!
//! No sleep-and-hope: expiry is awaited by polling with a bounded deadline.

#[path = "support/redis.rs"]
mod redis_support;

use bytes::Bytes;
use redis_support::{RedisCluster, RedisServer};
use sidecache::config::{NearCacheConfig, RedisConfig, RedisTarget};
use sidecache::keys::ObjectKeys;
use sidecache::metrics::Metrics;
use sidecache::store::redis::RedisStore;
use sidecache::store::{GuardedStore, PublishOutcome, Snapshot, Store, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const GEN_TTL: Duration = Duration::from_secs(600);
const LEASE: Duration = Duration::from_secs(30);
const ENTRY_TTL: Duration = Duration::from_secs(60);
/// Upper bound for anything awaited by polling.
const EVENTUALLY: Duration = Duration::from_secs(5);

/// The keys of object `id`, shaped like `pipeline::key` builds them (one hash
/// slot per object).
fn keys(id: &str) -> ObjectKeys {
    ObjectKeys {
        entry: format!("sc:o:{{app:{id}}}:e:v1:var"),
        generation: format!("sc:o:{{app:{id}}}:g"),
        lease: format!("sc:o:{{app:{id}}}:l:var"),
    }
}

/// Polls `check` every 10 ms until it holds; fails after `EVENTUALLY`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + EVENTUALLY;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "not within {EVENTUALLY:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A body that is not UTF-8 and contains NUL: values must be binary-safe.
fn binary_entry(tag: u8) -> Bytes {
    Bytes::from(vec![0x00, 0xff, 0xfe, tag, b'\r', b'\n', 0x00])
}

// ---------------------------------------------------------------------------
// The shared suite: every function runs against both backends.
// ---------------------------------------------------------------------------

async fn read_of_missing_keys(s: &dyn Store) {
    assert_eq!(s.read(&keys("missing")).await.unwrap(), Snapshot::default());
}

async fn ticket_is_never_absent_and_stable_until_invalidate(s: &dyn Store) {
    let k = keys("t");
    let first = s.ticket(&k.generation, "n1", GEN_TTL).await.unwrap();
    assert!(!first.is_empty());
    // A second reader with another nonce gets the same generation.
    assert_eq!(s.ticket(&k.generation, "n2", GEN_TTL).await.unwrap(), first);
    assert_eq!(s.read(&k).await.unwrap().generation, Some(first.clone()));

    let after = s.invalidate(&k.generation, "n3", GEN_TTL).await.unwrap();
    assert_ne!(after, first);
    assert_eq!(s.ticket(&k.generation, "n4", GEN_TTL).await.unwrap(), after);
}

async fn invalidate_always_gives_a_new_distinct_value(s: &dyn Store) {
    let k = keys("inv");
    let mut seen = std::collections::HashSet::new();
    seen.insert(s.ticket(&k.generation, "t", GEN_TTL).await.unwrap());
    // Distinct nonces within one microsecond: the nonce keeps them apart.
    for i in 0..50 {
        let nonce = format!("n{i}");
        let g = s.invalidate(&k.generation, &nonce, GEN_TTL).await.unwrap();
        assert!(seen.insert(g.clone()), "repeated generation {g:?}");
    }
    // Even a reused nonce never yields the value it replaces.
    let mut previous = s.invalidate(&k.generation, "same", GEN_TTL).await.unwrap();
    for _ in 0..50 {
        let g = s.invalidate(&k.generation, "same", GEN_TTL).await.unwrap();
        assert_ne!(g, previous);
        previous = g;
    }
}

async fn invalidate_of_a_missing_generation_creates_it(s: &dyn Store) {
    let k = keys("inv-missing");
    let g = s.invalidate(&k.generation, "n", GEN_TTL).await.unwrap();
    assert_eq!(s.ticket(&k.generation, "other", GEN_TTL).await.unwrap(), g);
}

async fn invalidations_are_idempotent_and_commute(s: &dyn Store) {
    // Whatever the number and order of invalidations after a ticket, the
    // ticket can no longer publish; the object just misses and refills.
    for (id, invalidations) in [("idem-1", 1), ("idem-2", 2), ("idem-5", 5)] {
        let k = keys(id);
        let ticket = s.ticket(&k.generation, "t", GEN_TTL).await.unwrap();
        assert!(s.try_lease(&k.lease, "owner", LEASE).await.unwrap());
        for i in 0..invalidations {
            s.invalidate(&k.generation, &format!("e{i}"), GEN_TTL)
                .await
                .unwrap();
        }
        let outcome = s
            .publish(&k, "owner", &ticket, binary_entry(1), ENTRY_TTL)
            .await
            .unwrap();
        assert_eq!(outcome, PublishOutcome::GenerationChanged, "{id}");
        // The next fill, with a fresh ticket, publishes normally.
        let fresh = s.ticket(&k.generation, "t2", GEN_TTL).await.unwrap();
        let outcome = s
            .publish(&k, "owner", &fresh, binary_entry(2), ENTRY_TTL)
            .await
            .unwrap();
        assert_eq!(outcome, PublishOutcome::Published, "{id}");
    }
}

async fn publish_needs_lease_owner_and_matching_ticket(s: &dyn Store) {
    let k = keys("pub");
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    let entry = binary_entry(7);

    // No lease at all.
    let outcome = s
        .publish(&k, "me", &ticket, entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // Someone else's lease.
    assert!(s.try_lease(&k.lease, "other", LEASE).await.unwrap());
    let outcome = s
        .publish(&k, "me", &ticket, entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // Our lease, a ticket we never got.
    assert!(s.unlock(&k.lease, "other").await.unwrap());
    assert!(s.try_lease(&k.lease, "me", LEASE).await.unwrap());
    let outcome = s
        .publish(&k, "me", b"1.000000-forged", entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);

    // Our lease and the current ticket: published, bytes intact.
    let outcome = s
        .publish(&k, "me", &ticket, entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    let snap = s.read(&k).await.unwrap();
    assert_eq!(snap.entry, Some(entry));
    assert_eq!(snap.generation, Some(ticket));
}

/// Seed 001: a filler takes its ticket, the object changes and is
/// invalidated while the filler waits on the upstream, then the filler tries
/// to publish the old body. It must be refused.
async fn publish_rejected_after_invalidate_stale_backfill(s: &dyn Store) {
    let k = keys("stale");
    assert!(s.try_lease(&k.lease, "filler", LEASE).await.unwrap());
    let ticket = s.ticket(&k.generation, "f", GEN_TTL).await.unwrap();
    s.invalidate(&k.generation, "writer", GEN_TTL)
        .await
        .unwrap();
    let outcome = s
        .publish(&k, "filler", &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);
}

/// Seed 000 §8.6: the generation key is lost (eviction, restart, DEL) and
/// recreated by another reader's ticket. The old ticket must not match.
async fn publish_rejected_after_generation_lost_and_recreated_aba(s: &dyn Store) {
    let k = keys("aba");
    assert!(s.try_lease(&k.lease, "filler", LEASE).await.unwrap());
    let ticket = s.ticket(&k.generation, "f", GEN_TTL).await.unwrap();

    // Lost: a missing generation counts as changed.
    assert!(s.delete_if_equals(&k.generation, &ticket).await.unwrap());
    let outcome = s
        .publish(&k, "filler", &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);

    // Recreated by another reader's ticket: a fresh value, not the old one.
    let recreated = s.ticket(&k.generation, "other", GEN_TTL).await.unwrap();
    assert_ne!(recreated, ticket);
    let outcome = s
        .publish(&k, "filler", &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);
}

async fn publish_rejected_when_lease_expired_and_taken(s: &dyn Store) {
    let k = keys("lease-exp");
    let short = Duration::from_millis(100);
    assert!(s.try_lease(&k.lease, "slow", short).await.unwrap());
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    // The lease runs out while "slow" waits on the upstream; "fast" takes it.
    eventually("lease expires and can be taken", || async {
        s.try_lease(&k.lease, "fast", LEASE).await.unwrap()
    })
    .await;
    let outcome = s
        .publish(&k, "slow", &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // The slow filler's unlock must not release the new owner's lease.
    assert!(!s.unlock(&k.lease, "slow").await.unwrap());
    let outcome = s
        .publish(&k, "fast", &ticket, binary_entry(2), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
}

async fn unlock_only_deletes_own_lease(s: &dyn Store) {
    let k = keys("unlock");
    assert!(
        !s.unlock(&k.lease, "nobody").await.unwrap(),
        "missing lease"
    );
    assert!(s.try_lease(&k.lease, "a", LEASE).await.unwrap());
    assert!(!s.unlock(&k.lease, "b").await.unwrap());
    assert!(
        !s.try_lease(&k.lease, "b", LEASE).await.unwrap(),
        "a still holds it"
    );
    assert!(s.unlock(&k.lease, "a").await.unwrap());
    assert!(!s.unlock(&k.lease, "a").await.unwrap(), "already released");
    assert!(s.try_lease(&k.lease, "b", LEASE).await.unwrap());
}

async fn renew_lease_extends_only_the_owners_live_lease(s: &dyn Store) {
    let k = keys("renew");
    let short = Duration::from_millis(300);
    assert!(
        !s.renew_lease(&k.lease, "a", LEASE).await.unwrap(),
        "renewing creates nothing"
    );
    assert!(s.try_lease(&k.lease, "a", short).await.unwrap());
    assert!(
        !s.renew_lease(&k.lease, "b", LEASE).await.unwrap(),
        "not b's"
    );
    assert!(s.renew_lease(&k.lease, "a", LEASE).await.unwrap());
    // Well past the first TTL the renewed lease is still held.
    tokio::time::sleep(short * 2).await;
    assert!(!s.try_lease(&k.lease, "b", short).await.unwrap());
    assert!(s.unlock(&k.lease, "a").await.unwrap());
    assert!(
        !s.renew_lease(&k.lease, "a", LEASE).await.unwrap(),
        "a released lease is not revived"
    );
    // An expired lease cannot be renewed, and a late renewal leaves the
    // next owner's lease alone.
    assert!(s.try_lease(&k.lease, "b", short).await.unwrap());
    eventually("b's lease to expire", || async {
        s.try_lease(&k.lease, "c", LEASE).await.unwrap()
    })
    .await;
    assert!(!s.renew_lease(&k.lease, "b", short).await.unwrap());
    assert!(
        !s.try_lease(&k.lease, "d", LEASE).await.unwrap(),
        "c still holds it"
    );
}

async fn delete_if_equals_only_deletes_the_value_seen(s: &dyn Store) {
    let k = keys("cad");
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    assert!(s.try_lease(&k.lease, "o", LEASE).await.unwrap());
    let corrupt = Bytes::from_static(b"\x00garbage\xff");
    let outcome = s
        .publish(&k, "o", &ticket, corrupt.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);

    assert!(!s
        .delete_if_equals(&k.entry, b"something else")
        .await
        .unwrap());
    assert_eq!(s.read(&k).await.unwrap().entry, Some(corrupt.clone()));
    assert!(s.delete_if_equals(&k.entry, &corrupt).await.unwrap());
    assert_eq!(s.read(&k).await.unwrap().entry, None);
    assert!(
        !s.delete_if_equals(&k.entry, &corrupt).await.unwrap(),
        "missing key"
    );
}

async fn entry_expires_after_its_ttl(s: &dyn Store) {
    let k = keys("ttl");
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    assert!(s.try_lease(&k.lease, "o", LEASE).await.unwrap());
    let ttl = Duration::from_millis(150);
    let published_at = Instant::now();
    let outcome = s
        .publish(&k, "o", &ticket, binary_entry(3), ttl)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    eventually("entry expires", || async {
        s.read(&k).await.unwrap().entry.is_none()
    })
    .await;
    // Not before its TTL (Redis expiry has ms precision; allow 1 ms).
    assert!(published_at.elapsed() + Duration::from_millis(1) >= ttl);
    // The generation, with its own long TTL, is still there.
    assert_eq!(s.read(&k).await.unwrap().generation, Some(ticket));
}

async fn generation_expires_after_gen_ttl_and_is_recreated_fresh(s: &dyn Store) {
    let k = keys("gen-ttl");
    let first = s
        .ticket(&k.generation, "a", Duration::from_millis(100))
        .await
        .unwrap();
    eventually("generation expires", || async {
        s.read(&k).await.unwrap().generation.is_none()
    })
    .await;
    let second = s.ticket(&k.generation, "b", GEN_TTL).await.unwrap();
    assert_ne!(first, second);
}

async fn lease_is_set_if_absent(s: &dyn Store) {
    let k = keys("nx");
    assert!(s.try_lease(&k.lease, "a", LEASE).await.unwrap());
    assert!(!s.try_lease(&k.lease, "b", LEASE).await.unwrap());
    // NX even for the same owner: a lease is never silently extended.
    assert!(!s.try_lease(&k.lease, "a", LEASE).await.unwrap());
}

async fn concurrent_lease_attempts_have_exactly_one_winner(s: &dyn Store) {
    let k = keys("race");
    let owners: Vec<String> = (0..32).map(|i| format!("owner-{i}")).collect();
    let attempts = owners.iter().map(|o| s.try_lease(&k.lease, o, LEASE));
    let won = futures_util::future::join_all(attempts).await;
    let winners = won.into_iter().map(Result::unwrap).filter(|w| *w).count();
    assert_eq!(winners, 1);
}

async fn invalidate_many_replaces_every_generation_in_one_call(s: &dyn Store) {
    let ids: Vec<String> = (0..50).map(|i| format!("many{i}")).collect();
    let gen_keys: Vec<String> = ids.iter().map(|id| keys(id).generation).collect();
    // Half the objects have a generation already, half have none.
    let mut before = Vec::new();
    for k in &gen_keys[..25] {
        before.push(s.ticket(k, "t", GEN_TTL).await.unwrap());
    }
    s.invalidate_many(&gen_keys, "batch", GEN_TTL)
        .await
        .unwrap();
    let mut after = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let generation = s.read(&keys(id)).await.unwrap().generation;
        let generation = generation.unwrap_or_else(|| panic!("{id} has no generation"));
        if i < 25 {
            assert_ne!(generation, before[i], "{id} not replaced");
        }
        after.push(generation);
    }
    // Idempotent in effect: applying the same batch again replaces again.
    s.invalidate_many(&gen_keys, "batch", GEN_TTL)
        .await
        .unwrap();
    for (i, id) in ids.iter().enumerate() {
        let generation = s.read(&keys(id)).await.unwrap().generation.unwrap();
        assert_ne!(generation, after[i]);
    }
    // An empty batch is a no-op.
    s.invalidate_many(&[], "batch", GEN_TTL).await.unwrap();
}

// ---------------------------------------------------------------------------
// Bloom filter operations (SPEC §6).
// ---------------------------------------------------------------------------

use sidecache::bloom::hash::{positions, signature};
use sidecache::config::bloom_sizing::Sizing;
use sidecache::keys::BloomKeys;
use sidecache::store::bloom::BloomAnswer;

const BLOOM_SIZE: Sizing = Sizing { m: 1024, k: 4 };
const BLOOM_LOCK: Duration = Duration::from_secs(60);
const BLOOM_CANDIDATE: Duration = Duration::from_secs(600);

fn bloom_keys(scope: &str) -> BloomKeys {
    sidecache::keys::bloom_keys("sc:", "app", scope)
}

fn pos(scope: &str, id: &str) -> Vec<u64> {
    positions("app", scope, id, BLOOM_SIZE)
}

async fn check(s: &dyn Store, k: &BloomKeys, scope: &str, id: &str) -> BloomAnswer {
    s.bloom_check(k, &signature(BLOOM_SIZE), BLOOM_SIZE.m, &pos(scope, id))
        .await
        .unwrap()
}

/// Builds the filter of `scope` with `ids` the way the builder does.
async fn build_filter(s: &dyn Store, scope: &str, ids: &[&str]) {
    let k = bloom_keys(scope);
    assert!(s
        .bloom_begin(&k, "builder", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    let bits: Vec<u64> = ids.iter().flat_map(|id| pos(scope, id)).collect();
    s.bloom_set_bits(&k.candidate("builder"), &bits)
        .await
        .unwrap();
    assert!(s
        .bloom_activate(&k, "builder", &signature(BLOOM_SIZE), BLOOM_SIZE.m)
        .await
        .unwrap());
    assert!(s.unlock(&k.lock, "builder").await.unwrap());
}

async fn bloom_is_unknown_until_activated_then_answers(s: &dyn Store) {
    let k = bloom_keys("b1");
    assert_eq!(check(s, &k, "b1", "1").await, BloomAnswer::Unknown);
    build_filter(s, "b1", &["1", "2", "3"]).await;
    for id in ["1", "2", "3"] {
        assert_eq!(check(s, &k, "b1", id).await, BloomAnswer::Maybe, "{id}");
    }
    let absent = (100..200)
        .filter(|i| {
            let p = pos("b1", &i.to_string());
            // Count only ids the 3-member filter can tell apart.
            !["1", "2", "3"].iter().any(|m| pos("b1", m) == p)
        })
        .count();
    let mut rejected = 0;
    for i in 100..200 {
        if check(s, &k, "b1", &i.to_string()).await == BloomAnswer::Absent {
            rejected += 1;
        }
    }
    assert!(rejected > absent * 9 / 10, "{rejected} of {absent}");
    // The active bitmap has no TTL and the candidate is gone.
    assert!(s.bloom_bitcount(&k.bits).await.unwrap() > 0);
    assert_eq!(s.bloom_bitcount(&k.candidate("builder")).await.unwrap(), 0);
}

async fn bloom_signature_mismatch_short_bitmap_and_disable_are_unknown(s: &dyn Store) {
    let k = bloom_keys("b2");
    build_filter(s, "b2", &["1"]).await;
    assert_eq!(check(s, &k, "b2", "1").await, BloomAnswer::Maybe);
    // Another size (capacity changed in the config): unknown, never absent.
    let other = Sizing { m: 2048, k: 4 };
    let answer = s
        .bloom_check(
            &k,
            &signature(other),
            other.m,
            &positions("app", "b2", "9", other),
        )
        .await
        .unwrap();
    assert_eq!(answer, BloomAnswer::Unknown);
    // Same signature but a caller that expects more bits than exist.
    let answer = s
        .bloom_check(
            &k,
            &signature(BLOOM_SIZE),
            BLOOM_SIZE.m * 2,
            &pos("b2", "9"),
        )
        .await
        .unwrap();
    assert_eq!(answer, BloomAnswer::Unknown);
    s.bloom_disable(&k, None).await.unwrap();
    assert_eq!(check(s, &k, "b2", "1").await, BloomAnswer::Unknown);
    assert_eq!(check(s, &k, "b2", "9").await, BloomAnswer::Unknown);
}

async fn bloom_build_lock_is_exclusive_and_activation_needs_the_owner(s: &dyn Store) {
    let k = bloom_keys("b3");
    let sig = signature(BLOOM_SIZE);
    assert!(s
        .bloom_begin(&k, "a", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(!s
        .bloom_begin(&k, "b", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    // b never got the lock: it cannot activate (nor has a candidate).
    assert!(!s.bloom_activate(&k, "b", &sig, BLOOM_SIZE.m).await.unwrap());
    assert_eq!(check(s, &k, "b3", "1").await, BloomAnswer::Unknown);
    // a's candidate is full-size before any bit is set.
    assert!(s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());
    assert_eq!(check(s, &k, "b3", "1").await, BloomAnswer::Absent);
    // Activation renamed the candidate away: a second activate fails.
    assert!(!s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());
    assert!(!s.unlock(&k.lock, "b").await.unwrap());
    assert!(s.unlock(&k.lock, "a").await.unwrap());
}

async fn bloom_renew_keeps_only_the_owners_build_alive(s: &dyn Store) {
    let k = bloom_keys("renew1");
    let sig = signature(BLOOM_SIZE);
    let short = Duration::from_millis(200);
    assert!(s
        .bloom_begin(&k, "a", short, BLOOM_SIZE.m, short)
        .await
        .unwrap());
    assert!(!s
        .bloom_renew(&k, "b", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(s
        .bloom_renew(&k, "a", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    // Time has to pass here: past the first 200 ms lease, the renewed lock
    // and candidate (60 s / 600 s now) are still there.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(s.bloom_activate(&k, "a", &sig, BLOOM_SIZE.m).await.unwrap());

    // Without renewal the lease runs out and renewing can no longer revive it.
    let k = bloom_keys("renew2");
    assert!(s
        .bloom_begin(&k, "c", short, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    eventually(
        "the unrenewed build lock expires and d can build",
        || async {
            s.bloom_begin(&k, "d", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
                .await
                .unwrap()
        },
    )
    .await;
    assert!(!s
        .bloom_renew(&k, "c", BLOOM_LOCK, BLOOM_CANDIDATE)
        .await
        .unwrap());
    assert!(!s.bloom_activate(&k, "c", &sig, BLOOM_SIZE.m).await.unwrap());
}

async fn bloom_add_reaches_active_filter_and_running_build(s: &dyn Store) {
    let k = bloom_keys("b4");
    let sig = signature(BLOOM_SIZE);
    // No filter: add is harmless and creates nothing.
    s.bloom_add(&k, &pos("b4", "0")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "0").await, BloomAnswer::Unknown);
    build_filter(s, "b4", &["1"]).await;
    // Created after the build: present at once.
    s.bloom_add(&k, &pos("b4", "2")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "2").await, BloomAnswer::Maybe);
    // A rebuild whose snapshot misses "3" (created during the build).
    assert!(s
        .bloom_begin(&k, "r", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
        .await
        .unwrap());
    s.bloom_set_bits(
        &k.candidate("r"),
        &[pos("b4", "1"), pos("b4", "2")].concat(),
    )
    .await
    .unwrap();
    s.bloom_add(&k, &pos("b4", "3")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "3").await, BloomAnswer::Maybe);
    assert!(s.bloom_activate(&k, "r", &sig, BLOOM_SIZE.m).await.unwrap());
    for id in ["1", "2", "3"] {
        assert_eq!(check(s, &k, "b4", id).await, BloomAnswer::Maybe, "{id}");
    }
    // Added after activation while the lock is still held: active bitmap.
    s.bloom_add(&k, &pos("b4", "4")).await.unwrap();
    assert_eq!(check(s, &k, "b4", "4").await, BloomAnswer::Maybe);
    assert!(s.unlock(&k.lock, "r").await.unwrap());
}

async fn bloom_crashed_build_leaves_the_old_filter_and_its_candidate_expires(s: &dyn Store) {
    let k = bloom_keys("b5");
    let sig = signature(BLOOM_SIZE);
    build_filter(s, "b5", &["1"]).await;
    // A build that dies after filling part of its candidate.
    assert!(s
        .bloom_begin(
            &k,
            "dead",
            Duration::from_millis(200),
            BLOOM_SIZE.m,
            Duration::from_millis(400)
        )
        .await
        .unwrap());
    s.bloom_set_bits(&k.candidate("dead"), &pos("b5", "2"))
        .await
        .unwrap();
    // The old filter keeps answering.
    assert_eq!(check(s, &k, "b5", "1").await, BloomAnswer::Maybe);
    eventually("dead build's lock and candidate expire", || async {
        s.bloom_bitcount(&k.candidate("dead")).await.unwrap() == 0
            && s.bloom_begin(&k, "next", BLOOM_LOCK, BLOOM_SIZE.m, BLOOM_CANDIDATE)
                .await
                .unwrap()
    })
    .await;
    // Its owner can no longer activate; the next build can.
    assert!(!s
        .bloom_activate(&k, "dead", &sig, BLOOM_SIZE.m)
        .await
        .unwrap());
    s.bloom_set_bits(
        &k.candidate("next"),
        &[pos("b5", "1"), pos("b5", "3")].concat(),
    )
    .await
    .unwrap();
    assert!(s
        .bloom_activate(&k, "next", &sig, BLOOM_SIZE.m)
        .await
        .unwrap());
    assert_eq!(check(s, &k, "b5", "3").await, BloomAnswer::Maybe);
}

// ---------------------------------------------------------------------------
// Running the suite against each backend.
// ---------------------------------------------------------------------------

fn redis_config(server: &RedisServer, command_timeout: Duration) -> RedisConfig {
    RedisConfig {
        target: RedisTarget::Single(server.url()),
        command_timeout,
        near_cache: None,
    }
}

fn redis_store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(
        &redis_config(server, Duration::from_secs(2)),
        Duration::from_secs(1),
        &Metrics::new(),
    )
    .expect("redis store")
}

/// A Redis store with the near cache on (`max_age` beyond any test).
fn near_connect(server: &RedisServer, command_timeout: Duration, metrics: &Metrics) -> RedisStore {
    let cfg = RedisConfig {
        near_cache: Some(NearCacheConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(30),
        }),
        ..redis_config(server, command_timeout)
    };
    RedisStore::connect(&cfg, Duration::from_millis(100), metrics).expect("redis store")
}

/// [`near_connect`], once its tracked connection is up.
async fn near_store(server: &RedisServer, metrics: &Metrics) -> RedisStore {
    let store = near_connect(server, Duration::from_secs(2), metrics);
    eventually("near cache tracking", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    store
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    let store = sidecache::store::memory::MemoryStore::new();
                    super::$name(&store).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $name() {
                    let server = super::RedisServer::start();
                    let store = super::redis_store(&server);
                    super::$name(&store).await;
                }
            )*
        }
        /// Redis with the near cache: every read first asks process memory.
        mod redis_near {
            $(
                #[tokio::test]
                async fn $name() {
                    let server = super::RedisServer::start();
                    let store = super::near_store(&server, &super::Metrics::new()).await;
                    super::$name(&store).await;
                }
            )*
        }
        /// Every suite function in turn (their keys are disjoint), for a
        /// backend too costly to start once per test.
        async fn whole_suite(s: &dyn Store) {
            $( $name(s).await; )*
        }
    };
}

suite!(
    read_of_missing_keys,
    ticket_is_never_absent_and_stable_until_invalidate,
    invalidate_always_gives_a_new_distinct_value,
    invalidate_of_a_missing_generation_creates_it,
    invalidations_are_idempotent_and_commute,
    publish_needs_lease_owner_and_matching_ticket,
    publish_rejected_after_invalidate_stale_backfill,
    publish_rejected_after_generation_lost_and_recreated_aba,
    publish_rejected_when_lease_expired_and_taken,
    unlock_only_deletes_own_lease,
    renew_lease_extends_only_the_owners_live_lease,
    delete_if_equals_only_deletes_the_value_seen,
    entry_expires_after_its_ttl,
    generation_expires_after_gen_ttl_and_is_recreated_fresh,
    lease_is_set_if_absent,
    concurrent_lease_attempts_have_exactly_one_winner,
    invalidate_many_replaces_every_generation_in_one_call,
    bloom_is_unknown_until_activated_then_answers,
    bloom_signature_mismatch_short_bitmap_and_disable_are_unknown,
    bloom_build_lock_is_exclusive_and_activation_needs_the_owner,
    bloom_renew_keeps_only_the_owners_build_alive,
    bloom_add_reaches_active_filter_and_running_build,
    bloom_crashed_build_leaves_the_old_filter_and_its_candidate_expires,
);

// ---------------------------------------------------------------------------
// Redis-only: failures of the server and of the script cache.
// ---------------------------------------------------------------------------

const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
const COOLDOWN: Duration = Duration::from_millis(500);

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

/// A Redis restart (or `SCRIPT FLUSH`, or a failover) empties the script
/// cache: EVALSHA answers NOSCRIPT and every script must reload itself.
#[tokio::test]
async fn scripts_survive_script_flush() {
    let server = RedisServer::start();
    let s = redis_store(&server);
    let k = keys("flush");
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    assert!(s.try_lease(&k.lease, "o", LEASE).await.unwrap());

    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(
        s.ticket(&k.generation, "n2", GEN_TTL).await.unwrap(),
        ticket
    );
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let outcome = s
        .publish(&k, "o", &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(s.unlock(&k.lease, "o").await.unwrap());
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(s
        .delete_if_equals(&k.entry, &binary_entry(1))
        .await
        .unwrap());
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    assert_ne!(
        s.invalidate(&k.generation, "n3", GEN_TTL).await.unwrap(),
        ticket
    );
}

/// The pipelined batch cannot fall back per command: after `SCRIPT FLUSH` it
/// loads the script and resends, and every key ends up replaced.
#[tokio::test]
async fn invalidate_many_survives_script_flush() {
    let server = RedisServer::start();
    let s = redis_store(&server);
    let gen_keys: Vec<String> = (0..10)
        .map(|i| keys(&format!("mf{i}")).generation)
        .collect();
    let mut before = Vec::new();
    for k in &gen_keys {
        before.push(s.ticket(k, "n", GEN_TTL).await.unwrap());
    }
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    s.invalidate_many(&gen_keys, "m", GEN_TTL).await.unwrap();
    for (i, k) in gen_keys.iter().enumerate() {
        assert_ne!(s.ticket(k, "n", GEN_TTL).await.unwrap(), before[i]);
    }
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
    store.ticket(&k.generation, "n", GEN_TTL).await.unwrap();

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
        .ticket(&k.generation, "n2", GEN_TTL)
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
    store.ticket(&k.generation, "n", GEN_TTL).await.unwrap();

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

// ---------------------------------------------------------------------------
// Redis Cluster: same protocol, keys of one object in one slot.
// ---------------------------------------------------------------------------

fn cluster_store(cluster: &RedisCluster, command_timeout: Duration) -> RedisStore {
    let cfg = RedisConfig {
        target: RedisTarget::Cluster(cluster.urls()),
        command_timeout,
        near_cache: None,
    };
    RedisStore::connect(&cfg, Duration::from_secs(1), &Metrics::new()).expect("cluster store")
}

/// The whole suite on a 3-master cluster (MGET and the scripts only work if
/// each object's keys share a slot), again after the script caches of all
/// nodes are flushed, and a paused cluster answers within the command
/// timeout (the cluster client has none unless configured).
#[tokio::test]
async fn cluster_runs_the_suite_survives_script_flush_and_times_out() {
    let cluster = RedisCluster::start(3);
    let store = cluster_store(&cluster, COMMAND_TIMEOUT);
    assert_eq!(store.kind(), "redis-cluster");
    whole_suite(&store).await;

    cluster.cli_all(&["SCRIPT", "FLUSH"]);
    cluster.cli_all(&["FLUSHALL"]);
    whole_suite(&store).await;

    for node in &cluster.nodes {
        node.pause(1500);
    }
    let started = Instant::now();
    let result = store.read(&keys("cluster-paused")).await;
    let took = started.elapsed();
    assert!(result.is_err(), "{result:?}");
    assert!(
        took < 2 * COMMAND_TIMEOUT,
        "raw cluster call while paused took {took:?}"
    );
    eventually("cluster answers after the pause", || async {
        store.read(&keys("cluster-paused")).await.is_ok()
    })
    .await;
}

// ---------------------------------------------------------------------------
// Near cache: coherent with writes made by other instances.
// ---------------------------------------------------------------------------

/// Publishes `entry` for `k` through `s` (ticket, lease, publish).
async fn publish_through(s: &dyn Store, k: &ObjectKeys, entry: Bytes) -> Bytes {
    let ticket = s.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    assert!(s.try_lease(&k.lease, "o", LEASE).await.unwrap());
    let outcome = s.publish(k, "o", &ticket, entry, ENTRY_TTL).await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    s.unlock(&k.lease, "o").await.unwrap();
    ticket
}

/// Instance A keeps what it read in memory; instance B's invalidation and
/// B's publish of a new entry reach A through Redis's pushes, so A never
/// keeps serving what B replaced.
#[tokio::test]
async fn near_cache_drops_what_another_instance_changes() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let b = redis_store(&server);
    let k = keys("near-other");
    let g1 = publish_through(&b, &k, binary_entry(1)).await;

    let read = a.read(&k).await.unwrap();
    assert_eq!(read.generation.as_ref(), Some(&g1));
    assert_eq!(a.read_near(&k), Some(read), "A keeps what it read");
    let hits = metrics.near_cache.with_label_values(&["hit"]).get();
    assert!(hits >= 1);

    // B invalidates: A's copy goes away, A then reads the new generation.
    let g2 = b.invalidate(&k.generation, "n2", GEN_TTL).await.unwrap();
    eventually("A drops the object after B's invalidation", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g2.clone()));

    // B publishes under the new generation: A's copy (old entry, stamped
    // with g1 but read together with g2) goes away as well.
    let _ = a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    publish_through(&b, &k, binary_entry(2)).await;
    eventually("A drops the object after B's publish", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(2)));
    assert!(metrics.near_cache_invalidations.get() >= 2);
}

/// FLUSHALL (nil invalidation push) and an expired key empty the near cache.
#[tokio::test]
async fn near_cache_follows_flushall_and_expiry() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let k = keys("near-flush");
    publish_through(&a, &k, binary_entry(1)).await;
    a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    server.cli(&["FLUSHALL"]).unwrap();
    eventually("FLUSHALL empties the near cache", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap(), Snapshot::default());

    let ticket = a.ticket(&k.generation, "n", GEN_TTL).await.unwrap();
    assert!(a.try_lease(&k.lease, "o2", LEASE).await.unwrap());
    let short = Duration::from_millis(200);
    a.publish(&k, "o2", &ticket, binary_entry(3), short)
        .await
        .unwrap();
    assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(3)));
    assert!(a.read_near(&k).is_some());
    eventually("the expired entry leaves the near cache", || async {
        a.read(&k).await.unwrap().entry.is_none()
    })
    .await;
}

/// The tracked connection is killed: everything read over it is dropped
/// (pushes may have been lost), a new tracked connection comes up, and
/// invalidations reach the cache again.
#[tokio::test]
async fn near_cache_is_emptied_when_its_connection_dies() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = near_store(&server, &metrics).await;
    let b = redis_store(&server);
    let k = keys("near-kill");
    publish_through(&b, &k, binary_entry(1)).await;
    a.read(&k).await.unwrap();
    assert!(a.read_near(&k).is_some());
    let flushes = metrics.near_cache_flushes.get();

    // `t` in CLIENT LIST's flags marks the tracking connection.
    let list: String =
        ::redis::FromRedisValue::from_redis_value(server.cli(&["CLIENT", "LIST"]).unwrap())
            .unwrap();
    let tracked: Vec<&str> = list
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(tracked.len(), 1, "one tracked connection: {list}");
    server.cli(&["CLIENT", "KILL", "ID", tracked[0]]).unwrap();

    eventually("the near cache is emptied", || async {
        metrics.near_cache_flushes.get() > flushes && a.read_near(&k).is_none()
    })
    .await;
    eventually("a new tracked connection", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    a.read(&k).await.unwrap();
    assert!(
        a.read_near(&k).is_some(),
        "kept again over the new connection"
    );
    let g2 = b.invalidate(&k.generation, "n2", GEN_TTL).await.unwrap();
    eventually("invalidations arrive over the new connection", || async {
        a.read_near(&k).is_none()
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().generation, Some(g2));
}

/// Killing Redis empties the near cache at once, so a guarded read fails
/// (the pipeline then serves degraded) instead of answering from memory
/// with nothing to keep that memory coherent.
#[tokio::test]
async fn near_cache_does_not_outlive_redis() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let inner = near_connect(&server, COMMAND_TIMEOUT, &metrics);
    let store = GuardedStore::new(Arc::new(inner), Some(COMMAND_TIMEOUT), COOLDOWN, &metrics);
    eventually("near cache tracking", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    let k = keys("near-down");
    publish_through(store.inner().as_ref(), &k, binary_entry(1)).await;
    store.read(&k).await.unwrap();
    assert!(store.inner().read_near(&k).is_some());

    server.kill();
    eventually("the near cache is emptied", || async {
        store.inner().read_near(&k).is_none()
    })
    .await;
    assert!(store.read(&k).await.is_err());
    assert_eq!(metrics.near_cache_tracking.get(), 0);
}

/// Load: readers on instance A race a writer on instance B that keeps
/// replacing the object (new generation, new entry). Whatever interleaving
/// happened, once the writer stops A's memory holds the last version or
/// nothing, never an older one: a reply overtaken by its push is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_converges_under_concurrent_writes() {
    let server = RedisServer::start();
    let metrics = Metrics::new();
    let a = Arc::new(near_store(&server, &metrics).await);
    let b = redis_store(&server);
    let k = Arc::new(keys("near-race"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (a, k, stop) = (a.clone(), k.clone(), stop.clone());
            tokio::spawn(async move {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    a.read(&k).await.unwrap();
                    reads += 1;
                    // A memory hit never waits: let the connections run.
                    tokio::task::yield_now().await;
                }
                reads
            })
        })
        .collect();
    let mut last = Bytes::new();
    for i in 0..300u32 {
        b.invalidate(&k.generation, &format!("n{i}"), GEN_TTL)
            .await
            .unwrap();
        last = Bytes::from(format!("version {i}"));
        publish_through(&b, &k, last.clone()).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    assert!(reads > 300, "readers kept up: {reads} reads");
    assert!(metrics.near_cache_invalidations.get() > 0);
    eventually("A's memory holds the last version or nothing", || async {
        match a.read_near(&k) {
            None => true,
            Some(s) => s.entry.as_ref() == Some(&last),
        }
    })
    .await;
    assert_eq!(a.read(&k).await.unwrap().entry, Some(last));
}

/// Without permission for `CLIENT TRACKING` (the same holds for a server
/// without RESP3) no tracked connection comes up: nothing is kept in
/// memory and every read goes to Redis.
#[tokio::test]
async fn near_cache_falls_back_to_redis_reads_when_tracking_is_refused() {
    let server = RedisServer::start();
    server
        .cli(&["ACL", "SETUSER", "default", "-client|tracking"])
        .unwrap();
    let metrics = Metrics::new();
    let a = near_connect(&server, Duration::from_secs(2), &metrics);
    eventually("the refused CLIENT TRACKING in the ACL log", || async {
        let log = server.cli(&["ACL", "LOG"]).unwrap();
        format!("{log:?}").contains("tracking")
    })
    .await;
    let k = keys("near-refused");
    publish_through(&a, &k, binary_entry(1)).await;
    for _ in 0..3 {
        assert_eq!(a.read(&k).await.unwrap().entry, Some(binary_entry(1)));
    }
    assert_eq!(a.read_near(&k), None);
    assert_eq!(metrics.near_cache_tracking.get(), 0);
    assert_eq!(metrics.near_cache.with_label_values(&["hit"]).get(), 0);
}
