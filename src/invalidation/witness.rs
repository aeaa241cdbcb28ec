//! Witnesses (issue 21): which instances run a feed's fan-out.
//!
//! The fan-out (issue 19) is what keeps a stopped consumer from delaying an
//! invalidation: instances besides the one the feed handed the event to
//! apply it as soon as they see it. Run by every instance, it costs each
//! event N applications (and with the outbox N reads of the pending rows);
//! run by `k` instances (`invalidation.witnesses`, default 2), it costs the
//! consumer's application plus `k` covered checks, whatever N. With k ≥ 2,
//! one stopped instance, witness or not, still never delays an event: the
//! other witness applies it.
//!
//! A witness holds one of the feed's `k` slots in the store
//! (`lua/witness.lua`: keys `<ns>w:{<feed>}:<i>`, value this process's
//! token, TTL [`SLOT_TTL`]). The feed's own loop beats every
//! [`BEAT_EVERY`] (one script call: renew, or try to take a free slot), so
//! a slot is held only while the feed runs. A slot whose holder stopped
//! (SIGSTOP, crash, lost store) expires, and the next instance to beat takes
//! it: `k` witnesses again within `SLOT_TTL + BEAT_EVERY`. Only `k`
//! simultaneous stops leave events to the consumers meanwhile. A failed
//! beat keeps what the instance believed: one witness too many costs a
//! covered check per event, never a cache miss. The embedded store serves
//! one process, which is always the witness.

use super::invalidator::Invalidator;
use prometheus::IntGauge;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info};

/// How long a slot outlives its holder's last beat.
pub const SLOT_TTL: Duration = Duration::from_secs(3);
/// How often a feed beats (renews its slot, or tries to take one).
pub const BEAT_EVERY: Duration = Duration::from_secs(1);

/// One feed's witness role in this process.
pub struct Witness {
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
    pub fn new(invalidator: Arc<Invalidator>, feed: &'static str, name: &str, k: u32) -> Witness {
        let slots = crate::keys::witness_keys(&invalidator.namespace(), &format!("{feed}.{name}"), k);
        let gauge = invalidator
            .metrics()
            .feed_witness
            .with_label_values(&[feed]);
        gauge.set(0);
        Witness {
            invalidator,
            slots,
            owner: token(),
            slot: None,
            next_beat: Instant::now(),
            gauge,
        }
    }

    pub fn is_witness(&self) -> bool {
        self.slot.is_some()
    }

    /// The slot held (0 also reports the outbox gauges).
    pub fn slot(&self) -> Option<usize> {
        self.slot
    }

    /// When the next beat is due.
    pub fn due_at(&self) -> Instant {
        self.next_beat
    }

    /// Renews the slot held, or tries to take a free one. True if this
    /// changed whether the process is a witness.
    pub async fn beat(&mut self) -> bool {
        self.next_beat = Instant::now() + BEAT_EVERY;
        let was = self.is_witness();
        match self
            .invalidator
            .witness(&self.slots, &self.owner, SLOT_TTL)
            .await
        {
            Ok(slot) => {
                if slot != self.slot {
                    match slot {
                        Some(i) => info!(slot = i, key = %self.slots[i], "feed witness: slot taken"),
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
    pub async fn beat_if_due(&mut self) -> bool {
        match Instant::now() >= self.next_beat {
            true => self.beat().await,
            false => false,
        }
    }

    /// Gives the slot up (shutdown): another instance takes it at its next
    /// beat instead of after [`SLOT_TTL`].
    pub async fn release(&mut self) {
        if let Some(i) = self.slot.take() {
            let _ = self
                .invalidator
                .release_witness(&self.slots[i], &self.owner)
                .await;
        }
        self.gauge.set(0);
    }
}

/// `host-pid-random`: unique per process (a restarted process is a new
/// owner), and names the process for an operator reading the slot keys.
fn token() -> String {
    use rand::Rng;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::rng().random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_name_the_process() {
        let (a, b) = (token(), token());
        assert_ne!(a, b);
        assert!(a.contains(&format!("-{}-", std::process::id())));
    }
}
