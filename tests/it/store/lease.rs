//! The rebuild lease: set only if absent (never silently extended), one
//! winner among concurrent attempts, released only by its owner.

use super::{eventually, keys, LEASE};
use sidecache::store::Store;
use std::time::Duration;

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

pub async fn renew_lease_extends_only_the_owners_live_lease(s: &dyn Store) {
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
