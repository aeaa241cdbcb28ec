//! One shard of the embedded store: its keys with their TTLs, its Bloom
//! bitmaps, its share of the byte budget and the eviction queues
//! ([`super::evict`]). Every method runs under the shard's lock; the
//! protocol steps in `super` are built from them.
//!
//! A key costs `key + value + KEY_OVERHEAD` bytes against the budget, the
//! overhead standing for the map slot, the key's and value's allocations
//! and the queue ticket, so that the charged bytes track the process's
//! resident memory (bench/README.md#embedded-store). Bloom bitmaps are
//! sized by the filter config and are not charged.

use super::bitmap::Bitmap;
use super::evict::{generation_of, is_object_generation, Kind, Queue, Queues, Ticket};
use crate::metrics::MemoryStoreMetrics;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Lower bound on writes between sweeps, so small maps are not swept on
/// every write.
pub(super) const SWEEP_MIN_WRITES: usize = 1024;

/// Bytes charged per key beyond its key and value (measured:
/// bench/README.md#embedded-store).
pub(crate) const KEY_OVERHEAD: usize = 160;

/// Share of the entry bytes the small (probationary) queue may hold.
const SMALL_SHARE: usize = 10;

/// Oldest anchors looked at for a generation nothing depends on, per
/// eviction.
const ORPHAN_SCAN: usize = 4;

pub(super) struct Slot {
    pub(super) value: Bytes,
    pub(super) expires: Instant,
    /// Which write made this key: tickets of earlier writes are stale.
    id: u64,
    /// Reads since it entered its queue, capped at 3.
    freq: u8,
    queue: Queue,
    kind: Kind,
    /// An object generation: its object's entries and leases (fills in
    /// flight) in this shard.
    deps: u32,
}

/// What one shard holds and charges.
pub(super) struct Shard {
    map: HashMap<Arc<str>, Slot>,
    /// Bloom bitmaps (active and candidates), mutable in place.
    pub(super) bitmaps: HashMap<String, Bitmap>,
    writes_since_sweep: usize,
    budget: usize,
    usage: Usage,
    queues: Queues,
    next_id: u64,
}

/// Charged bytes, total and per queue, mirrored into the metrics.
struct Usage {
    bytes: usize,
    small: usize,
    main: usize,
    entries: usize,
    metrics: MemoryStoreMetrics,
}

impl Usage {
    fn add(&mut self, slot: &Slot, charge: usize) {
        self.bytes += charge;
        self.by_queue(slot.queue, charge as isize);
        if slot.kind == Kind::Entry {
            self.entries += 1;
            self.metrics.entries.inc();
        }
        self.metrics.keys.inc();
        self.metrics.bytes.add(charge as i64);
    }

    fn sub(&mut self, slot: &Slot, charge: usize) {
        self.bytes -= charge;
        self.by_queue(slot.queue, -(charge as isize));
        if slot.kind == Kind::Entry {
            self.entries -= 1;
            self.metrics.entries.dec();
        }
        self.metrics.keys.dec();
        self.metrics.bytes.sub(charge as i64);
    }

    fn by_queue(&mut self, queue: Queue, delta: isize) {
        match queue {
            Queue::Small => self.small = self.small.wrapping_add_signed(delta),
            Queue::Main => self.main = self.main.wrapping_add_signed(delta),
            Queue::Anchor => {}
        }
    }
}

/// Whether a key of this kind keeps its object's generation from being
/// evicted as an orphan: an entry stamped with it, a fill in flight.
fn depends(kind: Kind) -> bool {
    matches!(kind, Kind::Entry | Kind::Lease)
}

fn charge(key: &str, value: &Bytes) -> usize {
    key.len() + value.len() + KEY_OVERHEAD
}

/// What one eviction step did.
enum Step {
    Evicted,
    /// The head was the key being written: put back.
    Protected,
    /// Nothing left to evict.
    Empty,
}

impl Shard {
    pub(super) fn new(budget: usize, metrics: MemoryStoreMetrics) -> Shard {
        Shard {
            map: HashMap::new(),
            bitmaps: HashMap::new(),
            writes_since_sweep: 0,
            budget,
            usage: Usage {
                bytes: 0,
                small: 0,
                main: 0,
                entries: 0,
                metrics,
            },
            queues: Queues::default(),
            next_id: 0,
        }
    }

    /// Keys held, including expired ones not yet swept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes charged.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.usage.bytes
    }

    /// The live value, counting the read for the eviction policy.
    pub(super) fn get(&mut self, key: &str, now: Instant) -> Option<&Bytes> {
        if self.map.get(key).is_some_and(|slot| slot.expires <= now) {
            self.remove(key);
        }
        let slot = self.map.get_mut(key)?;
        slot.freq = (slot.freq + 1).min(3);
        Some(&slot.value)
    }

    /// The value and its remaining TTL, without counting a read.
    pub(super) fn get_with_ttl(
        &mut self,
        key: &str,
        now: Instant,
    ) -> Option<(Bytes, Option<Duration>)> {
        if self.map.get(key).is_some_and(|slot| slot.expires <= now) {
            self.remove(key);
        }
        let slot = self.map.get(key)?;
        Some((
            slot.value.clone(),
            Some(slot.expires.saturating_duration_since(now)),
        ))
    }

    /// `SET key value PX ttl`, then evicts until the shard is within its
    /// budget again (never the key just written).
    pub(super) fn set(&mut self, key: &str, value: Bytes, ttl: Duration, now: Instant) {
        let expires = deadline(now, ttl);
        let new_charge = charge(key, &value);
        match self.map.get_mut(key) {
            // A rewrite keeps the key's place and reads in its queue.
            Some(slot) if slot.expires > now => {
                let old_charge = charge(key, &slot.value);
                slot.value = value;
                slot.expires = expires;
                let (queue, kind) = (slot.queue, slot.kind);
                let probe = Slot {
                    value: Bytes::new(),
                    expires,
                    id: 0,
                    freq: 0,
                    queue,
                    kind,
                    deps: 0,
                };
                self.usage.sub(&probe, old_charge);
                self.usage.add(&probe, new_charge);
            }
            _ => {
                self.remove(key);
                let kind = Kind::of(key);
                let queue = match Kind::queue(key, kind) {
                    Queue::Small => self.queues.admit(key),
                    other => other,
                };
                if depends(kind) {
                    self.depend(key, true);
                }
                self.next_id += 1;
                let slot = Slot {
                    value,
                    expires,
                    id: self.next_id,
                    freq: 0,
                    queue,
                    kind,
                    deps: 0,
                };
                let key: Arc<str> = Arc::from(key);
                self.usage.add(&slot, new_charge);
                self.queues.push(
                    queue,
                    Ticket {
                        key: key.clone(),
                        id: slot.id,
                    },
                );
                self.map.insert(key, slot);
            }
        }
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= SWEEP_MIN_WRITES.max(self.map.len() / 2) {
            self.sweep(now);
        }
        self.make_room(key, now);
    }

    /// Whether a value of `len` bytes under `key` can fit at all.
    pub(super) fn fits(&self, key: &str, len: usize) -> bool {
        key.len() + len + KEY_OVERHEAD <= self.budget
    }

    /// `PEXPIRE`: a new TTL for a live key, without rewriting it.
    pub(super) fn touch(&mut self, key: &str, ttl: Duration, now: Instant) {
        if let Some(slot) = self.map.get_mut(key) {
            slot.expires = deadline(now, ttl);
        }
    }

    pub(super) fn remove(&mut self, key: &str) -> bool {
        match self.map.remove_entry(key) {
            Some((key, slot)) => {
                self.usage.sub(&slot, charge(&key, &slot.value));
                if depends(slot.kind) {
                    self.depend(&key, false);
                }
                true
            }
            None => false,
        }
    }

    /// Counts an entry or lease `key` in (or out of) its generation.
    fn depend(&mut self, key: &str, added: bool) {
        let Some(generation) = generation_of(key) else {
            return;
        };
        if let Some(slot) = self.map.get_mut(generation.as_str()) {
            slot.deps = if added {
                slot.deps.saturating_add(1)
            } else {
                slot.deps.saturating_sub(1)
            };
        }
    }

    /// Drops every expired key, and stale queue tickets with them.
    fn sweep(&mut self, now: Instant) {
        let Shard { map, usage, .. } = self;
        let mut gone_entries = Vec::new();
        map.retain(|key, slot| {
            let live = slot.expires > now;
            if !live {
                usage.sub(slot, charge(key, &slot.value));
                if depends(slot.kind) {
                    gone_entries.push(key.clone());
                }
            }
            live
        });
        for key in gone_entries {
            self.depend(&key, false);
        }
        self.writes_since_sweep = 0;
        self.compact_if_stale();
    }

    /// Drops stale tickets once they outnumber the keys, so keys written
    /// and deleted over and over (leases) cannot grow the queues.
    fn compact_if_stale(&mut self) {
        if self.queues.len() <= 2 * self.map.len() + 64 {
            return;
        }
        let map = &self.map;
        self.queues.compact(|queue, t| {
            map.get(&t.key)
                .is_some_and(|slot| slot.id == t.id && slot.queue == queue)
        });
    }

    fn make_room(&mut self, written: &str, now: Instant) {
        let mut protected = 0;
        while self.usage.bytes > self.budget && protected < 2 {
            match self.evict_one(written, now) {
                Step::Evicted => {}
                Step::Protected => protected += 1,
                Step::Empty => break,
            }
        }
        self.compact_if_stale();
    }

    /// Evicts one key (see [`super::evict`] for the order). Expired keys
    /// met on the way are dropped uncounted.
    fn evict_one(&mut self, written: &str, now: Instant) -> Step {
        if self.evict_orphan(written, now) {
            return Step::Evicted;
        }
        // The small queue's head was the key being written: take from main.
        let mut small_blocked = false;
        loop {
            let queue = if self.usage.small + self.usage.main == 0
                || (self.usage.main == 0 && small_blocked)
            {
                Queue::Anchor
            } else if self.usage.main == 0
                || (!small_blocked
                    && self.usage.small * SMALL_SHARE > self.usage.small + self.usage.main)
            {
                Queue::Small
            } else {
                Queue::Main
            };
            let popped = match queue {
                Queue::Small => self.queues.small.pop_front(),
                Queue::Main => self.queues.main.pop_front(),
                Queue::Anchor => self.queues.anchors.pop_front(),
            };
            // Entry bytes without a ticket cannot happen (every key is
            // queued when written); stop rather than spin.
            let Some(ticket) = popped else {
                return Step::Empty;
            };
            let Some(slot) = self.map.get_mut(&ticket.key) else {
                continue;
            };
            if slot.id != ticket.id || slot.queue != queue {
                continue;
            }
            if slot.expires <= now {
                self.remove(&ticket.key);
                continue;
            }
            if &*ticket.key == written {
                self.queues.push(queue, ticket);
                if queue == Queue::Small && !small_blocked {
                    small_blocked = true;
                    continue;
                }
                return Step::Protected;
            }
            match queue {
                Queue::Small if slot.freq > 0 => {
                    slot.freq = 0;
                    slot.queue = Queue::Main;
                    let moved = charge(&ticket.key, &slot.value) as isize;
                    self.usage.by_queue(Queue::Small, -moved);
                    self.usage.by_queue(Queue::Main, moved);
                    self.queues.main.push_back(ticket);
                }
                Queue::Main if slot.freq > 0 => {
                    slot.freq -= 1;
                    self.queues.main.push_back(ticket);
                }
                _ => {
                    let kind = slot.kind;
                    self.remove(&ticket.key);
                    if queue == Queue::Small {
                        let cap = self.usage.entries.max(64);
                        self.queues.remember(&ticket.key, cap);
                    }
                    if kind == Kind::Floor {
                        // A floor outlives its generation's loss, not the
                        // other way round: a generation left without its
                        // floor would let a fill below the floor publish.
                        self.evict_generation_of(&ticket.key);
                    }
                    self.count(kind);
                    return Step::Evicted;
                }
            }
        }
    }

    /// Evicts an object generation no entry depends on, if one is among
    /// the oldest anchors; the others looked at go to the back.
    fn evict_orphan(&mut self, written: &str, now: Instant) -> bool {
        for _ in 0..ORPHAN_SCAN {
            let Some(ticket) = self.queues.anchors.pop_front() else {
                return false;
            };
            let Some(slot) = self.map.get(&ticket.key) else {
                continue;
            };
            if slot.id != ticket.id || slot.queue != Queue::Anchor {
                continue;
            }
            if slot.expires <= now {
                self.remove(&ticket.key);
                continue;
            }
            let orphan = slot.deps == 0 && is_object_generation(&ticket.key);
            if orphan && &*ticket.key != written {
                self.remove(&ticket.key);
                self.count(Kind::Generation);
                return true;
            }
            self.queues.anchors.push_back(ticket);
        }
        false
    }

    /// Drops the generation of the object whose floor key is `floor_key`.
    fn evict_generation_of(&mut self, floor_key: &str) {
        if let Some(object) = floor_key.strip_suffix(":f") {
            let generation = format!("{object}:g");
            if self.remove(&generation) {
                self.count(Kind::Generation);
            }
        }
    }

    fn count(&self, kind: Kind) {
        let index = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.usage.metrics.evictions[index].inc();
    }
}

/// `now + ttl`, with Redis' rule that a TTL is at least 1 ms.
pub(super) fn deadline(now: Instant, ttl: Duration) -> Instant {
    let ttl = ttl.max(Duration::from_millis(1));
    now.checked_add(ttl)
        // A TTL beyond the clock's range means "practically forever".
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
