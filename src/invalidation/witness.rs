//! Witnesses: which instances run a feed's fan-out
//! (docs/invalidation.md#witnesses-k-instances-fan-out-not-all-of-them).
//!
//! The fan-out (docs/invalidation.md#no-feed-waits-for-one-instance) is what
//! keeps a stopped consumer from delaying an invalidation: instances besides
//! the one the feed handed the event to apply it as soon as they see it. Run by
//! every instance, it costs each event N applications (and with the outbox N
//! reads of the pending rows); run by `k` instances (`invalidation.witnesses`,
//! default 2), it costs the consumer's application plus `k` covered checks,
//! whatever N. With k ≥ 2, one stopped instance, witness or not, still never
//! delays an event: the other witness applies it.
//!
//! A witness holds one of the feed's `k` slots in the store
//! (`lua/witness.lua`: keys `<ns>w:{<feed>}:<i>`, value this process's
//! token, TTL [`SLOT_TTL`]). The feed's own loop beats (one script call):
//! a witness renews its slot every [`RENEW_EVERY`], so a slot is held only
//! while the feed runs; any other instance tries again when the first slot
//! would expire (the script says when, [`WitnessSlot::free_in`]), so a
//! slot whose holder stopped (SIGSTOP, crash, lost store) is taken as it
//! expires: `k` witnesses again within about `SLOT_TTL` of the stop, at
//! about one call per `SLOT_TTL` per instance. Only `k` simultaneous stops
//! leave events to the consumers meanwhile. A failed beat keeps what the
//! instance believed: one witness too many costs a covered check per
//! event, never a cache miss. The embedded store serves one process, which
//! is always the witness.

use super::invalidator::Invalidator;
use crate::store::WitnessSlot;
use prometheus::IntGauge;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info};

/// How long a slot outlives its holder's last renewal: the longest a
/// stopped witness's slot stays vacant.
pub(crate) const SLOT_TTL: Duration = Duration::from_millis(1500);
/// How often a witness renews its slot.
pub(crate) const RENEW_EVERY: Duration = Duration::from_millis(500);
/// Spread of the retries of the instances waiting for a slot to expire.
const RETRY_JITTER: Duration = Duration::from_millis(50);
/// Bounds of that retry (a clock step or an odd reply cannot spin it).
const RETRY_MIN: Duration = Duration::from_millis(20);

/// One feed's witness role in this process.
pub(crate) struct Witness {
    invalidator: Arc<Invalidator>,
    slots: Vec<String>,
    owner: String,
    /// The slot this process holds, as of the last successful beat.
    slot: Option<usize>,
    next_beat: Instant,
    gauge: IntGauge,
}

impl Witness {
    /// `feed` is the metric label (`outbox`, `stream`); `name` the table
    /// or stream, so that two feeds never share slots.
    pub(crate) fn new(
        invalidator: Arc<Invalidator>,
        feed: &'static str,
        name: &str,
        k: u32,
    ) -> Witness {
        let slots =
            crate::keys::witness_keys(&invalidator.namespace(), &format!("{feed}.{name}"), k);
        let gauge = invalidator
            .metrics()
            .feed_witness
            .with_label_values(&[feed]);
        gauge.set(0);
        Witness {
            invalidator,
            slots,
            owner: super::process_token(),
            slot: None,
            next_beat: Instant::now(),
            gauge,
        }
    }

    pub(crate) fn is_witness(&self) -> bool {
        self.slot.is_some()
    }

    /// The slot held (0 also reports the outbox gauges).
    pub(crate) fn slot(&self) -> Option<usize> {
        self.slot
    }

    /// When the next beat is due.
    pub(crate) fn due_at(&self) -> Instant {
        self.next_beat
    }

    /// Renews the slot held, or tries to take a free one. True if this
    /// changed whether the process is a witness.
    pub(crate) async fn beat(&mut self) -> bool {
        let was = self.is_witness();
        let reply = self
            .invalidator
            .witness(&self.slots, &self.owner, SLOT_TTL)
            .await;
        self.next_beat = Instant::now()
            + match &reply {
                Ok(WitnessSlot {
                    held: None,
                    free_in,
                }) => {
                    let jitter = rand::rng().random_range(Duration::ZERO..=RETRY_JITTER);
                    (*free_in).clamp(RETRY_MIN, SLOT_TTL) + jitter
                }
                _ => RENEW_EVERY,
            };
        match reply {
            Ok(WitnessSlot { held: slot, .. }) => {
                if slot != self.slot {
                    match slot {
                        Some(i) => {
                            info!(slot = i, key = %self.slots[i], "feed witness: slot taken")
                        }
                        None => info!("feed witness: every slot held by others; fan-out stops"),
                    }
                }
                self.slot = slot;
            }
            Err(e) => debug!(error = %e, "feed witness beat failed; keeping the last answer"),
        }
        self.gauge.set(i64::from(self.is_witness()));
        was != self.is_witness()
    }

    /// [`Witness::beat`] if it is due.
    pub(crate) async fn beat_if_due(&mut self) -> bool {
        match Instant::now() >= self.next_beat {
            true => self.beat().await,
            false => false,
        }
    }

    /// Gives the slot up (shutdown): another instance takes it at its next
    /// try instead of after [`SLOT_TTL`].
    pub(crate) async fn release(&mut self) {
        if let Some(i) = self.slot.take() {
            let _ = self
                .invalidator
                .release_witness(&self.slots[i], &self.owner)
                .await;
        }
        self.gauge.set(0);
    }
}
