//! The fill lease: taken together with the fill's ticket, set only if
//! absent or held for an older generation (never silently extended), one
//! winner among concurrent attempts, renewed and released only by its owner.

use super::{binary_entry, eventually, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use sidecache::store::{LeaseReply, PublishOutcome, Store};
use std::time::Duration;

pub async fn lease_is_set_if_absent(s: &dyn Store) {
    let k = keys("nx");
    let (a, ticket) = lease(s, &k, "a", LEASE).await.expect("free");
    assert_eq!(a, format!("a@{}", String::from_utf8_lossy(&ticket)));
    assert_eq!(
        s.read(&k).await.unwrap().generation,
        Some(ticket),
        "the ticket is the generation, created if missing"
    );
    assert!(lease(s, &k, "b", LEASE).await.is_none());
    // Even for the same owner: a lease is never silently extended.
    assert!(lease(s, &k, "a", LEASE).await.is_none());
}

/// A fill whose ticket an invalidation (or a lost generation) replaced is not
/// waited for; the next attempt takes the lease over, and the superseded fill
/// can no longer renew, publish or release it
/// (docs/architecture.md#no-older-answer-after-an-invalidation).
pub async fn lease_of_an_older_generation_is_superseded(s: &dyn Store) {
    let k = keys("supersede");
    let (old, old_ticket) = lease(s, &k, "old", LEASE).await.expect("free");
    s.invalidate(k.generation(), "w", GEN_TTL).await.unwrap();
    let LeaseReply::Won {
        value: new,
        ticket,
        superseded,
    } = s.take_lease(&k, "new", "n", LEASE, GEN_TTL).await.unwrap()
    else {
        panic!("a fill of an older generation must not be waited for");
    };
    assert!(superseded);
    assert_ne!(ticket, old_ticket);
    assert_eq!(s.read(&k).await.unwrap().generation.as_ref(), Some(&ticket));
    assert!(!s.renew_lease(k.lease(), &old, LEASE).await.unwrap());
    let outcome = s
        .publish(&k, &old, &old_ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::GenerationChanged);
    assert!(!s.unlock(k.lease(), &old).await.unwrap());
    assert!(
        lease(s, &k, "third", LEASE).await.is_none(),
        "the new fill is current: waited for"
    );
    let outcome = s
        .publish(&k, &new, &ticket, binary_entry(2), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    // A lost generation: the recreated one is new, the holder superseded.
    assert!(s.delete_if_equals(k.generation(), &ticket).await.unwrap());
    let (_, recreated) = lease(s, &k, "after-loss", LEASE)
        .await
        .expect("the fill of a lost generation is superseded");
    assert_ne!(recreated, ticket);
}

pub async fn concurrent_lease_attempts_have_exactly_one_winner(s: &dyn Store) {
    let k = keys("race");
    let owners: Vec<String> = (0..32).map(|i| format!("owner-{i}")).collect();
    let attempts = owners
        .iter()
        .map(|o| s.take_lease(&k, o, o, LEASE, GEN_TTL));
    let replies = futures_util::future::join_all(attempts).await;
    let winners = replies
        .into_iter()
        .map(Result::unwrap)
        .filter(|r| matches!(r, LeaseReply::Won { .. }))
        .count();
    assert_eq!(winners, 1);
}

pub async fn unlock_only_deletes_own_lease(s: &dyn Store) {
    let k = keys("unlock");
    assert!(
        !s.unlock(k.lease(), "nobody").await.unwrap(),
        "missing lease"
    );
    let (a, _) = lease(s, &k, "a", LEASE).await.expect("free");
    assert!(
        !s.unlock(k.lease(), "a").await.unwrap(),
        "the owner token alone is not the value"
    );
    assert!(lease(s, &k, "b", LEASE).await.is_none(), "a still holds it");
    assert!(s.unlock(k.lease(), &a).await.unwrap());
    assert!(!s.unlock(k.lease(), &a).await.unwrap(), "already released");
    assert!(lease(s, &k, "b", LEASE).await.is_some());
}

pub async fn renew_lease_extends_only_the_owners_live_lease(s: &dyn Store) {
    let k = keys("renew");
    let short = Duration::from_millis(300);
    assert!(
        !s.renew_lease(k.lease(), "a", LEASE).await.unwrap(),
        "renewing creates nothing"
    );
    let (a, _) = lease(s, &k, "a", short).await.expect("free");
    assert!(
        !s.renew_lease(k.lease(), "b", LEASE).await.unwrap(),
        "not b's"
    );
    assert!(s.renew_lease(k.lease(), &a, LEASE).await.unwrap());
    // Well past the first TTL the renewed lease is still held.
    tokio::time::sleep(short * 2).await;
    assert!(lease(s, &k, "b", short).await.is_none());
    assert!(s.unlock(k.lease(), &a).await.unwrap());
    assert!(
        !s.renew_lease(k.lease(), &a, LEASE).await.unwrap(),
        "a released lease is not revived"
    );
    // An expired lease cannot be renewed, and a late renewal leaves the
    // next owner's lease alone.
    let (b, _) = lease(s, &k, "b", short).await.expect("free");
    eventually("b's lease to expire", || async {
        lease(s, &k, "c", LEASE).await.is_some()
    })
    .await;
    assert!(!s.renew_lease(k.lease(), &b, short).await.unwrap());
    assert!(lease(s, &k, "d", LEASE).await.is_none(), "c still holds it");
}
