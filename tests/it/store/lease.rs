//! The fill lease: taken together with the fill's ticket, set only if
//! absent or held for an older generation (never silently extended), one
//! winner among concurrent attempts, renewed and released only by its owner.

use super::{binary_entry, eventually, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use bytes::Bytes;
use sidecache::keys::ObjectKeys;
use sidecache::store::{FillDepends, LeaseReply, PublishChecks, PublishOutcome, Store, Superseded};
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
    assert_eq!(superseded, Some(Superseded::Generation));
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

/// Takes `k`'s lease for `owner` with the tickets of a route and one tag
/// (named after `id`, disjoint from other tests' keys) and records them
/// beside the lease: (lease value, object ticket, dependencies).
async fn lease_with_depends(
    s: &dyn Store,
    k: &ObjectKeys,
    id: &str,
) -> (String, Bytes, FillDepends) {
    let (value, ticket) = lease(s, k, "holder", LEASE).await.expect("free");
    let dep_keys = vec![
        format!("sc:r:{{{id}-route}}:g"),
        format!("sc:t:{{{id}-tag}}:g"),
    ];
    let tickets = s.tag_tickets(&dep_keys, "n", GEN_TTL).await.unwrap();
    let depends = FillDepends {
        route: Some((dep_keys[0].clone(), tickets[0].clone())),
        tags: vec![(dep_keys[1].clone(), tickets[1].clone())],
    };
    assert!(s
        .record_lease_depends(k.lease(), &value, &depends)
        .await
        .unwrap());
    (value, ticket, depends)
}

/// A waiter takes over a fill whose tag (or route) ticket an invalidation
/// replaced, like one whose object ticket is stale: its publish will be
/// refused, and its answer predates the invalidation
/// (docs/architecture.md#no-older-answer-after-an-invalidation). The
/// doomed fill can then neither publish (it learns that the tag moved),
/// renew nor release.
pub async fn lease_of_a_fill_whose_tag_moved_is_superseded(s: &dyn Store) {
    let k = keys("doomed-tag");
    let (old, ticket, depends) = lease_with_depends(s, &k, "doomed-tag").await;
    assert!(
        lease(s, &k, "waiter", LEASE).await.is_none(),
        "every dependency current: waited for"
    );
    let tag_key = &depends.tags[0].0;
    s.invalidate(tag_key, "tagevent", GEN_TTL).await.unwrap();
    let LeaseReply::Won {
        value: new,
        ticket: new_ticket,
        superseded,
    } = s
        .take_lease(&k, "waiter", "n", LEASE, GEN_TTL)
        .await
        .unwrap()
    else {
        panic!("a fill whose tag moved must not be waited for");
    };
    assert_eq!(superseded, Some(Superseded::Tag));
    assert_eq!(new_ticket, ticket, "the object's generation did not move");
    let checks = PublishChecks {
        floor_key: None,
        version: None,
        tags: [depends.route.clone().unwrap(), depends.tags[0].clone()].to_vec(),
    };
    let outcome = s
        .publish_checked(&k, &old, &ticket, binary_entry(1), ENTRY_TTL, &checks)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::TagChanged, "not `lease lost`");
    assert!(!s.renew_lease(k.lease(), &old, LEASE).await.unwrap());
    assert!(!s.unlock(k.lease(), &old).await.unwrap());
    // The doomed fill's record does not follow the lease: the new fill,
    // which recorded nothing, is waited for.
    assert!(
        !s.record_lease_depends(k.lease(), &old, &depends)
            .await
            .unwrap(),
        "only the lease's owner records"
    );
    assert!(lease(s, &k, "third", LEASE).await.is_none());
    assert!(s.unlock(k.lease(), &new).await.unwrap());
}

pub async fn lease_of_a_fill_whose_route_moved_is_superseded(s: &dyn Store) {
    let k = keys("doomed-route");
    let (_, _, depends) = lease_with_depends(s, &k, "doomed-route").await;
    let route_key = &depends.route.as_ref().unwrap().0;
    s.invalidate(route_key, "purge", GEN_TTL).await.unwrap();
    let reply = s
        .take_lease(&k, "waiter", "n", LEASE, GEN_TTL)
        .await
        .unwrap();
    assert!(
        matches!(
            reply,
            LeaseReply::Won {
                superseded: Some(Superseded::Route),
                ..
            }
        ),
        "{reply:?}"
    );
}

/// A dependency record belongs to the lease it was written for: released
/// with it, renewed with it, never applied to the next holder's fill.
pub async fn lease_depends_go_with_their_lease(s: &dyn Store) {
    let k = keys("depends-owned");
    let (old, _, depends) = lease_with_depends(s, &k, "depends-owned").await;
    assert!(s.renew_lease(k.lease(), &old, LEASE).await.unwrap());
    assert!(s.unlock(k.lease(), &old).await.unwrap());
    let (next, _) = lease(s, &k, "next", LEASE).await.expect("released");
    s.invalidate(&depends.tags[0].0, "tagevent", GEN_TTL)
        .await
        .unwrap();
    assert!(
        lease(s, &k, "waiter", LEASE).await.is_none(),
        "the released fill's record does not doom the next one"
    );
    assert!(s.unlock(k.lease(), &next).await.unwrap());
    // A lease that expires takes its record along: the next holder starts
    // without one.
    let short = Duration::from_millis(300);
    let (held, _) = lease(s, &k, "short", short).await.expect("free");
    let fresh = s
        .tag_tickets(&[depends.tags[0].0.clone()], "n", GEN_TTL)
        .await
        .unwrap();
    let current = FillDepends {
        route: None,
        tags: vec![(depends.tags[0].0.clone(), fresh[0].clone())],
    };
    assert!(s
        .record_lease_depends(k.lease(), &held, &current)
        .await
        .unwrap());
    eventually("the short lease to expire", || async {
        lease(s, &k, "after", LEASE).await.is_some()
    })
    .await;
    s.invalidate(&depends.tags[0].0, "again", GEN_TTL)
        .await
        .unwrap();
    assert!(
        lease(s, &k, "waiter", LEASE).await.is_none(),
        "a new holder starts without a record"
    );
}
