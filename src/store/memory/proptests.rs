//! Property: under any interleaving of fills (lease, then publish later),
//! invalidations, reads and evictions forced by a tiny budget, no read
//! that passes the serving rule (stamp == current generation) returns an
//! answer older than the object's last invalidation
//! (docs/architecture.md#invariants).

use super::*;
use proptest::prelude::*;

const OBJECTS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// Take the lease of an object: the fill's answer is the data as it
    /// is now (the upstream call comes after the ticket).
    Begin(usize),
    /// Publish the n-th fill begun (modulo those pending).
    Publish(usize),
    /// The data changes and the invalidation runs.
    Invalidate(usize),
    /// A request checks what it would serve.
    Read(usize),
    /// Fills of other objects, forcing evictions of every kind.
    Churn(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..OBJECTS).prop_map(Op::Begin),
        any::<usize>().prop_map(Op::Publish),
        (0..OBJECTS).prop_map(Op::Invalidate),
        (0..OBJECTS).prop_map(Op::Read),
        (1u8..40).prop_map(Op::Churn),
    ]
}

fn keys(id: usize) -> ObjectKeys {
    ObjectKeys::from_parts(
        &format!("sc:o:{{r:{id}}}:e:v3:v"),
        &format!("sc:o:{{r:{id}}}:g"),
        &format!("sc:o:{{r:{id}}}:l:v"),
    )
}

/// The entry: the stamped generation and the data version it holds.
fn entry(ticket: &[u8], version: u64) -> Bytes {
    Bytes::from(format!("{}|{version}", String::from_utf8_lossy(ticket)))
}

fn served(snapshot: &Snapshot) -> Option<u64> {
    let entry = std::str::from_utf8(snapshot.entry.as_ref()?).ok()?;
    let (stamp, version) = entry.rsplit_once('|')?;
    let current = snapshot.generation.as_ref()?;
    (stamp.as_bytes() == current.as_ref()).then(|| version.parse().ok())?
}

struct Fill {
    object: usize,
    owner: String,
    ticket: Bytes,
    version: u64,
}

async fn run(ops: Vec<Op>, budget: u64) -> Result<(), TestCaseError> {
    let store = MemoryStore::with_budget(budget, 1, MemoryStoreMetrics::new(None));
    let long = Duration::from_secs(3600);
    let mut versions = [0u64; OBJECTS];
    let mut pending: Vec<Fill> = Vec::new();
    let mut churned = 0usize;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Begin(object) => {
                let nonce = format!("b{step}");
                let reply = store
                    .take_lease(&keys(object), &nonce, &nonce, long, long)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let LeaseReply::Won { value, ticket, .. } = reply {
                    pending.push(Fill {
                        object,
                        owner: value,
                        ticket,
                        version: versions[object],
                    });
                }
            }
            Op::Publish(n) if !pending.is_empty() => {
                let fill = pending.remove(n % pending.len());
                let k = keys(fill.object);
                let body = entry(&fill.ticket, fill.version);
                store
                    .publish(&k, &fill.owner, &fill.ticket, body, long)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                store
                    .unlock(k.lease(), &fill.owner)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Publish(_) => {}
            Op::Invalidate(object) => {
                versions[object] += 1;
                let nonce = format!("i{step}");
                store
                    .invalidate(keys(object).generation(), &nonce, long)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Read(object) => {
                let snapshot = store
                    .read(&keys(object))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(version) = served(&snapshot) {
                    prop_assert_eq!(
                        version,
                        versions[object],
                        "object {} served an answer from before its last invalidation",
                        object
                    );
                }
            }
            Op::Churn(n) => {
                for _ in 0..n {
                    churned += 1;
                    let k = keys(OBJECTS + churned);
                    let nonce = format!("c{churned}");
                    if let Ok(LeaseReply::Won { value, ticket, .. }) =
                        store.take_lease(&k, &nonce, &nonce, long, long).await
                    {
                        let body = Bytes::from(vec![b'x'; 200]);
                        let _ = store.publish(&k, &value, &ticket, body, long).await;
                        let _ = store.unlock(k.lease(), &value).await;
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_read_returns_an_answer_older_than_the_last_invalidation(
        ops in proptest::collection::vec(op(), 1..120),
        budget in 2_000u64..12_000,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        runtime.block_on(run(ops, budget))?;
    }
}
