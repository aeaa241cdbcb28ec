//! One behavioural suite for the `Store` contract
//! (docs/testing.md#store-suite), run on every backend: the embedded
//! `MemoryStore` (paused Tokio time, so TTLs expire virtually), `RedisStore` on
//! a private redis-server started by the harness (real time), and `RedisStore`
//! with the near cache; the cluster runs it too (`cluster`). The suite's
//! functions live by concern in `generation`, `lease`, `publish` and `bloom`;
//! the `suite!` list below turns each into one test per backend (`memory::…`,
//! `redis::…`, `redis_near::…`). Then Redis-only tests: the script cache
//! flushed (`script_flush`), the server down, killed or paused (`breaker`), a
//! cluster (`cluster`), and the near cache's coherence (`near_cache`).
//!
//! No sleep-and-hope: expiry is awaited by polling with a bounded deadline.

mod bloom;
mod breaker;
mod cluster;
mod depends;
mod generation;
mod lease;
mod near_cache;
mod near_cluster;
mod near_sentinel;
mod publish;
mod script_flush;

use crate::support::redis::RedisServer;
use bytes::Bytes;
use sidecache::config::{NearCacheConfig, RedisConfig, RedisTarget};
use sidecache::keys::ObjectKeys;
use sidecache::metrics::Metrics;
use sidecache::store::{LeaseReply, RedisStore, Store};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

const GEN_TTL: Duration = Duration::from_secs(600);
const LEASE: Duration = Duration::from_secs(30);
const ENTRY_TTL: Duration = Duration::from_secs(60);
/// Upper bound for anything awaited by polling.
const EVENTUALLY: Duration = Duration::from_secs(5);

/// The keys of object `id`, shaped like `keys::object_keys` builds them (one hash
/// slot per object).
fn keys(id: &str) -> ObjectKeys {
    ObjectKeys::from_parts(
        &format!("sc:o:{{app:{id}}}:e:v3:var"),
        &format!("sc:o:{{app:{id}}}:g"),
        &format!("sc:o:{{app:{id}}}:l:var"),
    )
}

/// Polls `check` every 10 ms until it holds; fails after `EVENTUALLY`. Not
/// the harness's `eventually`: this one runs on Tokio's clock, so under the
/// memory backend's paused time the deadline and the TTLs pass virtually.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + EVENTUALLY;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "not within {EVENTUALLY:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes `k`'s fill lease for `owner` (and so the fill's ticket): the lease
/// value (what publish, renew and unlock compare) and the ticket if won,
/// `None` if a fill of the current generation holds it.
async fn lease(
    s: &dyn Store,
    k: &ObjectKeys,
    owner: &str,
    ttl: Duration,
) -> Option<(String, Bytes)> {
    match s.take_lease(k, owner, "n", ttl, GEN_TTL).await.unwrap() {
        LeaseReply::Won { value, ticket, .. } => Some((value, ticket)),
        LeaseReply::Held => None,
    }
}

/// A body that is not UTF-8 and contains NUL: values must be binary-safe.
fn binary_entry(tag: u8) -> Bytes {
    Bytes::from(vec![0x00, 0xff, 0xfe, tag, b'\r', b'\n', 0x00])
}

/// The command timeout and breaker cooldown of the Redis-only fault tests.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
const COOLDOWN: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------
// Running the suite against each backend.
// ---------------------------------------------------------------------------

fn redis_config(server: &RedisServer, command_timeout: Duration) -> RedisConfig {
    RedisConfig {
        target: RedisTarget::Single(server.url()),
        command_timeout,
        near_cache: None,
        tls: None,
        replicas_ack: None,
    }
}

fn redis_store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(
        &redis_config(server, Duration::from_secs(2)),
        Duration::from_secs(1),
        &Metrics::new(),
    )
    .expect("redis store")
}

/// A Redis store with the near cache on (`max_age` beyond any test).
fn near_connect(server: &RedisServer, command_timeout: Duration, metrics: &Metrics) -> RedisStore {
    let cfg = RedisConfig {
        near_cache: Some(NearCacheConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(30),
        }),
        ..redis_config(server, command_timeout)
    };
    RedisStore::connect(&cfg, Duration::from_millis(100), metrics).expect("redis store")
}

/// [`near_connect`], once its tracked connection is up.
async fn near_store(server: &RedisServer, metrics: &Metrics) -> RedisStore {
    let store = near_connect(server, Duration::from_secs(2), metrics);
    eventually("near cache tracking", || async {
        metrics.near_cache_tracking.get() == 1
    })
    .await;
    store
}

macro_rules! suite {
    ($($concern:ident::$name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    let store = sidecache::store::MemoryStore::new();
                    super::$concern::$name(&store).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $name() {
                    let server = super::RedisServer::start();
                    let store = super::redis_store(&server);
                    super::$concern::$name(&store).await;
                }
            )*
        }
        /// Redis with the near cache: every read first asks process memory.
        mod redis_near {
            $(
                #[tokio::test]
                async fn $name() {
                    let server = super::RedisServer::start();
                    let store = super::near_store(&server, &super::Metrics::new()).await;
                    super::$concern::$name(&store).await;
                }
            )*
        }
        /// Every suite function in turn (their keys are disjoint), for a
        /// backend too costly to start once per test.
        async fn whole_suite(s: &dyn Store) {
            $( $concern::$name(s).await; )*
        }
    };
}

suite!(
    publish::read_of_missing_keys,
    generation::ticket_is_never_absent_and_stable_until_invalidate,
    generation::invalidate_always_gives_a_new_distinct_value,
    generation::invalidate_of_a_missing_generation_creates_it,
    generation::invalidations_are_idempotent_and_commute,
    generation::generation_expires_after_gen_ttl_and_is_recreated_fresh,
    generation::invalidate_many_replaces_every_generation_in_one_call,
    generation::invalidate_marked_replaces_once_per_event,
    lease::lease_is_set_if_absent,
    lease::lease_of_an_older_generation_is_superseded,
    lease::concurrent_lease_attempts_have_exactly_one_winner,
    lease::unlock_only_deletes_own_lease,
    lease::renew_lease_extends_only_the_owners_live_lease,
    lease::lease_of_a_fill_whose_tag_moved_is_superseded,
    lease::lease_of_a_fill_whose_route_moved_is_superseded,
    lease::lease_depends_go_with_their_lease,
    publish::publish_needs_lease_owner_and_matching_ticket,
    publish::publish_rejected_after_invalidate_stale_backfill,
    publish::publish_rejected_after_generation_lost_and_recreated_aba,
    publish::publish_rejected_when_lease_expired_and_taken,
    publish::delete_if_equals_only_deletes_the_value_seen,
    publish::entry_expires_after_its_ttl,
    depends::publish_checked_refuses_below_the_floor,
    depends::publish_checked_refuses_moved_or_lost_tags,
    depends::tag_tickets_since_refuses_tags_replaced_since_the_start,
    bloom::bloom_is_unknown_until_activated_then_answers,
    bloom::bloom_signature_mismatch_short_bitmap_and_disable_are_unknown,
    bloom::bloom_build_lock_is_exclusive_and_activation_needs_the_owner,
    bloom::bloom_renew_keeps_only_the_owners_build_alive,
    bloom::bloom_add_reaches_active_filter_and_running_build,
    bloom::bloom_crashed_build_leaves_the_old_filter_and_its_candidate_expires,
);
