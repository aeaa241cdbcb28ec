//! Generations (docs/architecture.md#generation-protocol): a ticket is never
//! absent and stays the same until an invalidation replaces it; invalidations
//! always give a new value, commute and are idempotent in effect; a lost
//! generation comes back fresh.

use super::{binary_entry, eventually, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use bytes::Bytes;
use sidecache::keys::ObjectKeys;
use sidecache::store::{PublishOutcome, Store};
use std::time::Duration;

pub async fn ticket_is_never_absent_and_stable_until_invalidate(s: &dyn Store) {
    let k = keys("t");
    let first = s.ticket(k.generation(), "n1", GEN_TTL).await.unwrap();
    assert!(!first.is_empty());
    // A second reader with another nonce gets the same generation.
    assert_eq!(
        s.ticket(k.generation(), "n2", GEN_TTL).await.unwrap(),
        first
    );
    assert_eq!(s.read(&k).await.unwrap().generation, Some(first.clone()));

    let after = s.invalidate(k.generation(), "n3", GEN_TTL).await.unwrap();
    assert_ne!(after, first);
    assert_eq!(
        s.ticket(k.generation(), "n4", GEN_TTL).await.unwrap(),
        after
    );
}

pub async fn invalidate_always_gives_a_new_distinct_value(s: &dyn Store) {
    let k = keys("inv");
    let mut seen = std::collections::HashSet::new();
    seen.insert(s.ticket(k.generation(), "t", GEN_TTL).await.unwrap());
    // Distinct nonces within one microsecond: the nonce keeps them apart.
    for i in 0..50 {
        let nonce = format!("n{i}");
        let g = s.invalidate(k.generation(), &nonce, GEN_TTL).await.unwrap();
        assert!(seen.insert(g.clone()), "repeated generation {g:?}");
    }
    // Even a reused nonce never yields the value it replaces.
    let mut previous = s.invalidate(k.generation(), "same", GEN_TTL).await.unwrap();
    for _ in 0..50 {
        let g = s.invalidate(k.generation(), "same", GEN_TTL).await.unwrap();
        assert_ne!(g, previous);
        previous = g;
    }
}

pub async fn invalidate_of_a_missing_generation_creates_it(s: &dyn Store) {
    let k = keys("inv-missing");
    let g = s.invalidate(k.generation(), "n", GEN_TTL).await.unwrap();
    assert_eq!(s.ticket(k.generation(), "other", GEN_TTL).await.unwrap(), g);
}

pub async fn invalidations_are_idempotent_and_commute(s: &dyn Store) {
    // Whatever the number and order of invalidations after a ticket, the
    // ticket can no longer publish; the object just misses and refills.
    for (id, invalidations) in [("idem-1", 1), ("idem-2", 2), ("idem-5", 5)] {
        let k = keys(id);
        let (owner, ticket) = lease(s, &k, "owner", LEASE).await.expect("free");
        for i in 0..invalidations {
            s.invalidate(k.generation(), &format!("e{i}"), GEN_TTL)
                .await
                .unwrap();
        }
        let outcome = s
            .publish(&k, &owner, &ticket, binary_entry(1), ENTRY_TTL)
            .await
            .unwrap();
        assert_eq!(outcome, PublishOutcome::GenerationChanged, "{id}");
        // The next fill, with a fresh ticket, publishes normally.
        let (next, fresh) = lease(s, &k, "next", LEASE)
            .await
            .expect("the invalidated fill is superseded");
        assert_ne!(fresh, ticket);
        let outcome = s
            .publish(&k, &next, &fresh, binary_entry(2), ENTRY_TTL)
            .await
            .unwrap();
        assert_eq!(outcome, PublishOutcome::Published, "{id}");
    }
}

pub async fn generation_expires_after_gen_ttl_and_is_recreated_fresh(s: &dyn Store) {
    let k = keys("gen-ttl");
    let first = s
        .ticket(k.generation(), "a", Duration::from_millis(100))
        .await
        .unwrap();
    eventually("generation expires", || async {
        s.read(&k).await.unwrap().generation.is_none()
    })
    .await;
    let second = s.ticket(k.generation(), "b", GEN_TTL).await.unwrap();
    assert_ne!(first, second);
}

pub async fn invalidate_many_replaces_every_generation_in_one_call(s: &dyn Store) {
    let ids: Vec<String> = (0..50).map(|i| format!("many{i}")).collect();
    let gen_keys: Vec<String> = ids
        .iter()
        .map(|id| keys(id).generation().to_owned())
        .collect();
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

/// The fan-out's marked invalidation (`lua/invalidate_marked.lua`): the
/// first application of an event replaces the generation, repeats of it (and
/// of earlier stream entries) leave it, later entries and other events
/// replace it; a marked generation works as a ticket like any other.
pub async fn invalidate_marked_replaces_once_per_event(s: &dyn Store) {
    let k = keys("marked");
    async fn apply(s: &dyn Store, k: &ObjectKeys, mark: &str) -> Bytes {
        let gen_keys = [k.generation().to_owned()];
        s.invalidate_marked(&gen_keys, &[mark.to_owned()], "n", GEN_TTL)
            .await
            .unwrap();
        s.read(k).await.unwrap().generation.expect("a generation")
    }
    let apply = |mark| apply(s, &k, mark);
    let first = apply("s:100-1").await;
    assert!(first.ends_with(b"@s:100-1"), "{first:?}");
    assert_eq!(apply("s:100-1").await, first, "the same entry again");
    assert_eq!(apply("s:100-0").await, first, "an earlier entry");
    assert_eq!(apply("s:99-7").await, first, "an earlier entry");
    let later = apply("s:100-2").await;
    assert_ne!(later, first, "a later entry");
    let row = apply("o:7:123").await;
    assert_ne!(row, later);
    assert_eq!(apply("o:7:123").await, row, "the same row again");
    assert_ne!(apply("o:8:123").await, row, "another row");

    // A marked generation as a fill's ticket.
    let (owner, ticket) = lease(s, &k, "filler", LEASE).await.expect("free");
    assert_eq!(Some(&ticket), s.read(&k).await.unwrap().generation.as_ref());
    let outcome = s
        .publish(&k, &owner, &ticket, binary_entry(1), ENTRY_TTL)
        .await
        .unwrap();
    assert_eq!(outcome, PublishOutcome::Published);
    // Several keys in one call, each with its own mark.
    let many: Vec<String> = (0..3)
        .map(|i| super::keys(&format!("marked{i}")).generation().to_owned())
        .collect();
    let marks: Vec<String> = (0..3).map(|i| format!("s:5-{i}")).collect();
    s.invalidate_marked(&many, &marks, "n", GEN_TTL)
        .await
        .unwrap();
    for (i, key) in many.iter().enumerate() {
        let g = s
            .read(&super::keys(&format!("marked{i}")))
            .await
            .unwrap()
            .generation;
        let g = g.unwrap_or_else(|| panic!("{key} not invalidated"));
        assert!(g.ends_with(format!("@s:5-{i}").as_bytes()));
    }
}
