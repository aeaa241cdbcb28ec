//! Entries: reading what is not there, publishing only under our lease and
//! the current generation (stale backfill, ABA, an expired lease taken by
//! another filler), compare-and-delete, and the entry TTL.

use super::{binary_entry, eventually, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use bytes::Bytes;
use sidecache::store::{PublishOutcome, Snapshot, Store};
use std::time::Duration;
use tokio::time::Instant;

pub async fn read_of_missing_keys(s: &dyn Store) {
    assert_eq!(s.read(&keys("missing")).await.unwrap(), Snapshot::default());
}

pub async fn publish_needs_lease_owner_and_matching_ticket(s: &dyn Store) {
    let k = keys("pub");
    let ticket = s.ticket(k.generation(), "n", GEN_TTL).await.unwrap();
    let entry = binary_entry(7);

    // No lease at all.
    let outcome = s
        .publish(&k, "me", &ticket, entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // Someone else's lease (for the same ticket).
    let (other, their_ticket) = lease(s, &k, "other", LEASE).await.expect("free");
    assert_eq!(their_ticket, ticket);
    let outcome = s
        .publish(&k, "me", &ticket, entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // Our lease, a ticket we never got.
    assert!(s.unlock(k.lease(), &other).await.unwrap());
    let (me, _) = lease(s, &k, "me", LEASE).await.expect("free");
    let outcome = s
        .publish(&k, &me, b"1.000000-forged", entry.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);

    // Our lease and the current ticket: published, bytes intact.
    let outcome = s
        .publish(&k, &me, &ticket, entry.clone(), ENTRY_TTL)
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
pub async fn publish_rejected_after_invalidate_stale_backfill(s: &dyn Store) {
    let k = keys("stale");
    let (filler, ticket) = lease(s, &k, "filler", LEASE).await.expect("free");
    s.invalidate(k.generation(), "writer", GEN_TTL)
        .await
        .unwrap();
    let outcome = s
        .publish(&k, &filler, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);
}

/// Seed 000 §8.6: the generation key is lost (eviction, restart, DEL) and
/// recreated by another reader's ticket. The old ticket must not match.
pub async fn publish_rejected_after_generation_lost_and_recreated_aba(s: &dyn Store) {
    let k = keys("aba");
    let (filler, ticket) = lease(s, &k, "filler", LEASE).await.expect("free");

    // Lost: a missing generation counts as changed.
    assert!(s.delete_if_equals(k.generation(), &ticket).await.unwrap());
    let outcome = s
        .publish(&k, &filler, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);

    // Recreated by another reader's ticket: a fresh value, not the old one.
    let recreated = s.ticket(k.generation(), "other", GEN_TTL).await.unwrap();
    assert_ne!(recreated, ticket);
    let outcome = s
        .publish(&k, &filler, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert_eq!(s.read(&k).await.unwrap().entry, None);
}

pub async fn publish_rejected_when_lease_expired_and_taken(s: &dyn Store) {
    let k = keys("lease-exp");
    let short = Duration::from_millis(100);
    let (slow, ticket) = lease(s, &k, "slow", short).await.expect("free");
    // The lease runs out while "slow" waits on the upstream; "fast" takes it
    // (for the same generation).
    let deadline = Instant::now() + Duration::from_secs(5);
    let fast = loop {
        if let Some((fast, fast_ticket)) = lease(s, &k, "fast", LEASE).await {
            assert_eq!(fast_ticket, ticket);
            break fast;
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let outcome = s
        .publish(&k, &slow, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::LeaseLost);
    // The slow filler's unlock must not release the new owner's lease.
    assert!(!s.unlock(k.lease(), &slow).await.unwrap());
    let outcome = s
        .publish(&k, &fast, &ticket, binary_entry(2), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
}

pub async fn delete_if_equals_only_deletes_the_value_seen(s: &dyn Store) {
    let k = keys("cad");
    let (o, ticket) = lease(s, &k, "o", LEASE).await.expect("free");
    let corrupt = Bytes::from_static(b"\x00garbage\xff");
    let outcome = s
        .publish(&k, &o, &ticket, corrupt.clone(), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);

    assert!(!s
        .delete_if_equals(k.entry(), b"something else")
        .await
        .unwrap());
    assert_eq!(s.read(&k).await.unwrap().entry, Some(corrupt.clone()));
    assert!(s.delete_if_equals(k.entry(), &corrupt).await.unwrap());
    assert_eq!(s.read(&k).await.unwrap().entry, None);
    assert!(
        !s.delete_if_equals(k.entry(), &corrupt).await.unwrap(),
        "missing key"
    );
}

pub async fn entry_expires_after_its_ttl(s: &dyn Store) {
    let k = keys("ttl");
    let (o, ticket) = lease(s, &k, "o", LEASE).await.expect("free");
    let ttl = Duration::from_millis(150);
    let published_at = Instant::now();
    let outcome = s
        .publish(&k, &o, &ticket, binary_entry(3), ttl)
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
