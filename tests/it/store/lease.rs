//! The rebuild lease: set only if absent (never silently extended), one
//! winner among concurrent attempts, released only by its owner.

use super::{keys, LEASE};
use sidecache::store::Store;

pub async fn lease_is_set_if_absent(s: &dyn Store) {
    let k = keys("nx");
    assert!(s.try_lease(&k.lease, "a", LEASE).await.unwrap());
    assert!(!s.try_lease(&k.lease, "b", LEASE).await.unwrap());
    // NX even for the same owner: a lease is never silently extended.
    assert!(!s.try_lease(&k.lease, "a", LEASE).await.unwrap());
}

pub async fn concurrent_lease_attempts_have_exactly_one_winner(s: &dyn Store) {
    let k = keys("race");
    let owners: Vec<String> = (0..32).map(|i| format!("owner-{i}")).collect();
    let attempts = owners.iter().map(|o| s.try_lease(&k.lease, o, LEASE));
    let won = futures_util::future::join_all(attempts).await;
    let winners = won.into_iter().map(Result::unwrap).filter(|w| *w).count();
    assert_eq!(winners, 1);
}

pub async fn unlock_only_deletes_own_lease(s: &dyn Store) {
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
