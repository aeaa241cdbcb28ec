//! Keeps a [`SlotMap`] current for a Redis Cluster store: `CLUSTER SLOTS`
//! every heartbeat (a master that fails over or slots that migrate show up
//! within one), and a `PING` routed to one slot of every master so that a
//! master that comes back is reconnected before its breaker's probe.
//!
//! `CLUSTER SLOTS` goes to any node; while the one asked is down the old
//! table stays (the next tick asks another).

use crate::store::slot_map::{SlotMap, SlotRange};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;
use std::sync::Arc;
use std::time::Duration;

/// Refreshes `map` from `conn` every `every`; each call bounded by
/// `timeout`. `changed` runs right after a refresh that changed the table.
pub(crate) async fn keep_current(
    map: Arc<SlotMap>,
    conn: ClusterConnection,
    every: Duration,
    timeout: Duration,
    changed: impl Fn() + Send,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut ask = conn.clone();
        let slots = ask.route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        );
        match tokio::time::timeout(timeout, slots).await {
            Ok(Ok(reply)) => match parse(&reply) {
                Some(ranges) if !ranges.is_empty() => {
                    if map.replace(ranges) {
                        changed();
                    }
                }
                _ => tracing::debug!(?reply, "unexpected CLUSTER SLOTS reply"),
            },
            Ok(Err(error)) => tracing::debug!(%error, "CLUSTER SLOTS failed"),
            Err(_) => tracing::debug!("CLUSTER SLOTS timed out"),
        }
        ping_masters(&map, &conn, timeout).await;
    }
}

/// One `PING` per master, routed by one of its slots (which makes redis-rs
/// reconnect to it if needed), concurrently.
async fn ping_masters(map: &SlotMap, conn: &ClusterConnection, timeout: Duration) {
    let pings = map.first_slots().into_iter().map(|slot| {
        let mut conn = conn.clone();
        async move {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            let _ =
                tokio::time::timeout(timeout, conn.route_command(redis::cmd("PING"), route)).await;
        }
    });
    futures_util::future::join_all(pings).await;
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, ...], replicas...], ...]`
/// as slot ranges (`None`: not that shape).
pub(crate) fn parse(reply: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (start, end, master) = match fields.as_slice() {
                [Value::Int(start), Value::Int(end), Value::Array(master), ..] => {
                    (*start, *end, master)
                }
                _ => return None,
            };
            let (host, port) = match master.as_slice() {
                [Value::BulkString(host), Value::Int(port), ..] => (host, *port),
                _ => return None,
            };
            Some(SlotRange {
                start: u16::try_from(start).ok()?,
                end: u16::try_from(end).ok()?,
                node: format!("{}:{port}", String::from_utf8_lossy(host)).into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_slots() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id1")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id4")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7001), bulk("id2")]),
            ]),
        ]);
        let ranges = parse(&reply).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!(&*ranges[0].node, "127.0.0.1:7000");
        assert_eq!((ranges[1].start, ranges[1].end), (5461, 16383));
        assert!(parse(&Value::Array(vec![Value::Int(1)])).is_none());
        assert!(parse(&Value::Nil).is_none());
    }
}
