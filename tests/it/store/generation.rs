//! Generations (SPEC §5.3): a ticket is never absent and stays the same
//! until an invalidation replaces it; invalidations always give a new value,
//! commute and are idempotent in effect; a lost generation comes back fresh.

use super::{binary_entry, eventually, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use sidecache::store::{PublishOutcome, Store};
use std::time::Duration;

pub async fn ticket_is_never_absent_and_stable_until_invalidate(s: &dyn Store) {
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

pub async fn invalidate_always_gives_a_new_distinct_value(s: &dyn Store) {
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

pub async fn invalidate_of_a_missing_generation_creates_it(s: &dyn Store) {
    let k = keys("inv-missing");
    let g = s.invalidate(&k.generation, "n", GEN_TTL).await.unwrap();
    assert_eq!(s.ticket(&k.generation, "other", GEN_TTL).await.unwrap(), g);
}

pub async fn invalidations_are_idempotent_and_commute(s: &dyn Store) {
    // Whatever the number and order of invalidations after a ticket, the
    // ticket can no longer publish; the object just misses and refills.
    for (id, invalidations) in [("idem-1", 1), ("idem-2", 2), ("idem-5", 5)] {
        let k = keys(id);
        let (owner, ticket) = lease(s, &k, "owner", LEASE).await.expect("free");
        for i in 0..invalidations {
            s.invalidate(&k.generation, &format!("e{i}"), GEN_TTL)
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

pub async fn invalidate_many_replaces_every_generation_in_one_call(s: &dyn Store) {
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
