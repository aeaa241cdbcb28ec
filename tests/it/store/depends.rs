//! Version floors and cache tags (docs/invalidation.md#dependent-invalidation):
//! `raise_floors` keeps the highest revision, `publish_checked` refuses an
//! answer below the floor or whose tag generations moved since their tickets
//! (invalidated or lost), and `tag_tickets` / `read_tags` read what the hit
//! check compares.

use super::{binary_entry, keys, lease, ENTRY_TTL, GEN_TTL, LEASE};
use sidecache::store::{PublishChecks, PublishOutcome, Store};

pub async fn publish_checked_refuses_below_the_floor(s: &dyn Store) {
    let k = keys("floor");
    let floor_key = "sc:o:{app:floor}:f".to_owned();
    let checks = |version| PublishChecks {
        floor_key: Some(floor_key.clone()),
        version,
        tags: vec![],
    };
    let (me, ticket) = lease(s, &k, "me", LEASE).await.expect("free");
    let (k, me, ticket) = (&k, &me, &ticket);
    let publish = |version| {
        let checks = checks(version);
        async move {
            s.publish_checked(k, me, ticket, binary_entry(1), ENTRY_TTL, &checks)
                .await
                .unwrap()
        }
    };
    // No floor yet: any version, even none, is published.
    assert_eq!(publish(None).await, PublishOutcome::Published);
    s.raise_floors(&[(floor_key.clone(), 7)], GEN_TTL)
        .await
        .unwrap();
    // A lower revision arriving later does not lower it.
    s.raise_floors(&[(floor_key.clone(), 3)], GEN_TTL)
        .await
        .unwrap();
    assert_eq!(publish(Some(6)).await, PublishOutcome::BelowFloor);
    assert_eq!(publish(None).await, PublishOutcome::BelowFloor);
    assert_eq!(publish(Some(7)).await, PublishOutcome::Published);
    assert_eq!(publish(Some(8)).await, PublishOutcome::Published);
}

pub async fn publish_checked_refuses_moved_or_lost_tags(s: &dyn Store) {
    let tag_keys = vec!["sc:t:{a}:g".to_owned(), "sc:t:{b}:g".to_owned()];
    let refs: Vec<&str> = tag_keys.iter().map(String::as_str).collect();
    assert_eq!(s.read_tags(&refs).await.unwrap(), vec![None, None]);
    let tickets = s.tag_tickets(&tag_keys, "n", GEN_TTL).await.unwrap();
    assert_eq!(tickets.len(), 2);
    // Stable until invalidated, and what `read_tags` reads.
    assert_eq!(
        s.tag_tickets(&tag_keys, "m", GEN_TTL).await.unwrap(),
        tickets
    );
    let current = s.read_tags(&refs).await.unwrap();
    assert_eq!(
        current,
        tickets.iter().cloned().map(Some).collect::<Vec<_>>()
    );
    let checks = PublishChecks {
        floor_key: None,
        version: None,
        tags: tag_keys
            .iter()
            .cloned()
            .zip(tickets.iter().cloned())
            .collect(),
    };
    for (id, change) in [("tag-moved", 0), ("tag-lost", 1), ("tag-kept", 2)] {
        let k = keys(id);
        let (me, ticket) = lease(s, &k, "me", LEASE).await.expect("free");
        let t = s.tag_tickets(&tag_keys, "n", GEN_TTL).await.unwrap();
        let checks = PublishChecks {
            tags: tag_keys.iter().cloned().zip(t).collect(),
            ..checks.clone()
        };
        match change {
            0 => {
                s.invalidate(&tag_keys[1], "x", GEN_TTL).await.unwrap();
            }
            1 => {
                // Lost (evicted, deleted): a missing tag counts as moved.
                let held = checks.tags[0].1.clone();
                assert!(s.delete_if_equals(&tag_keys[0], &held).await.unwrap());
            }
            _ => {}
        }
        let outcome = s
            .publish_checked(&k, &me, &ticket, binary_entry(2), ENTRY_TTL, &checks)
            .await
            .unwrap();
        let want = if change == 2 {
            PublishOutcome::Published
        } else {
            PublishOutcome::TagChanged
        };
        assert_eq!(outcome, want, "{id}");
        assert_eq!(
            s.read(&k).await.unwrap().entry.is_some(),
            change == 2,
            "{id}"
        );
    }
}

/// Tickets for tags a fill learned only from its answer: taken at publish
/// if none of those tags was replaced since the fill began (the clock
/// `tag_tickets_timed` read with the fill's other tickets); a missing tag
/// is created then. Not on a cluster (no one clock: `None`).
pub async fn tag_tickets_since_refuses_tags_replaced_since_the_start(s: &dyn Store) {
    let before = "sc:t:{since-before}:g".to_owned();
    let fresh = "sc:t:{since-fresh}:g".to_owned();
    let moved = "sc:t:{since-moved}:g".to_owned();
    let route = vec!["sc:r:{since}:g".to_owned()];
    let earlier = s
        .tag_tickets(&[before.clone(), moved.clone()], "n", GEN_TTL)
        .await
        .unwrap();
    // Generations carry microseconds: let the clock pass the ones just made.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let (tickets, start) = s.tag_tickets_timed(&route, "n", GEN_TTL).await.unwrap();
    assert_eq!(tickets.len(), 1);
    let Some(start) = start else {
        return; // a cluster: the pipeline keeps such answers unstored
    };
    std::thread::sleep(std::time::Duration::from_millis(2));
    s.invalidate(&moved, "x", GEN_TTL).await.unwrap();
    // Made before the start, or missing: ticketed (and created).
    let both = [before.clone(), fresh.clone()];
    let got = s.tag_tickets_since(&both, &start, "m", GEN_TTL).await;
    let got = got.unwrap().expect("no tag replaced since the start");
    assert_eq!(got[0], earlier[0]);
    let refs: Vec<&str> = both.iter().map(String::as_str).collect();
    let current = s.read_tags(&refs).await.unwrap();
    assert_eq!(current, got.iter().cloned().map(Some).collect::<Vec<_>>());
    // Replaced since the start: refused, and nothing is written for the
    // others (`other` stays missing).
    let other = "sc:t:{since-other}:g".to_owned();
    let with_moved = [other.clone(), moved.clone()];
    let refused = s.tag_tickets_since(&with_moved, &start, "m", GEN_TTL).await;
    assert_eq!(refused.unwrap(), None);
    assert_eq!(s.read_tags(&[other.as_str()]).await.unwrap(), vec![None]);
    // Created by someone else after the start: refused as well (it may be
    // an invalidation's).
    let (_, later) = s.tag_tickets_timed(&route, "n", GEN_TTL).await.unwrap();
    let later = later.expect("the same store keeps one clock");
    assert!(later > start);
    let refused = s
        .tag_tickets_since(std::slice::from_ref(&fresh), &start, "m", GEN_TTL)
        .await;
    assert_eq!(refused.unwrap(), None);
}
