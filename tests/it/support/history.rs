//! The history checker of `tests/it/history.rs`
//! (docs/testing.md#history-checker): pure logic over a recorded history, no
//! I/O, so its verdicts are unit-tested on hand-made histories below.
//!
//! A history holds every read and write with its invocation and completion
//! times, every generation value seen in the store (its creation time is
//! the Redis `TIME` embedded in the value), and every wipe (Redis killed
//! and restarted without persistence: all generations lost). All times are
//! microseconds since the Unix epoch on the one machine's real-time clock,
//! which Redis `TIME` and Postgres commit timestamps share.
//!
//! Verdicts:
//! - **stale read**: a read returned version `x` although version `x + 1`
//!   had committed more than [`STALE_AFTER_US`] before the read was
//!   invoked. When `x + 1` committed is bounded from above by everything
//!   that proves it: a write of `x + 1` or later (its Postgres commit
//!   timestamp, else its completion) and a read that returned `x + 1` or
//!   later (its completion). Versions only grow, so a later version's
//!   commit bounds every earlier one.
//! - **non-monotonic pair**: on one instance and object, a read completed
//!   before another was invoked, and the later one returned an older
//!   version (no slack).
//! - **write not invalidated**: an acknowledged write whose object got no
//!   generation created at or after the write's commit. A wipe up to
//!   [`WIPE_COVERS_US`] after the commit excuses it (its generation may
//!   have been created and lost before anyone read it); an older write
//!   must have been invalidated before. Commit → invalidation latency is
//!   measured to the first such generation, for writes whose commit
//!   timestamp is known.
//!
//! A change committed while the feed's source was down (the outbox feed
//! while Postgres restarts: a backend can commit after its postmaster was
//! killed) counts from when the source was back, as the stream feed's
//! change counts from its event's append: sidecache cannot learn of it
//! earlier.

use std::collections::{BTreeMap, HashMap};

/// A read returning an older version is stale once the newer one has been
/// committed this long before the read was invoked
/// (docs/invalidation.md#checked-from-outside-the-history-checker).
pub const STALE_AFTER_US: i64 = 50_000;

/// A wipe excuses the writes committed this long before it.
pub const WIPE_COVERS_US: i64 = 1_000_000;

#[derive(Clone, Debug)]
pub struct Read {
    pub phase: usize,
    /// Which instance (slot) served it.
    pub instance: usize,
    pub object: u64,
    pub invoked: i64,
    pub completed: i64,
    /// The `version` answered; `None` for a failed read (error, non-200).
    pub version: Option<i64>,
    /// `X-Cache` of the answer ("" for a failed read).
    pub cache: String,
}

#[derive(Clone, Debug)]
pub struct Write {
    pub phase: usize,
    pub object: u64,
    pub invoked: i64,
    pub completed: i64,
    /// The version the write created; `None` when the write failed or its
    /// outcome is unknown (it is then not checked).
    pub version: Option<i64>,
    /// The Postgres commit timestamp of that version, when it could be read.
    pub committed: Option<i64>,
}

impl Write {
    /// The earliest the commit can have been: its timestamp, else the
    /// write's invocation (used to decide whether it was invalidated).
    fn commit_from(&self) -> i64 {
        self.committed.unwrap_or(self.invoked)
    }
    /// The latest the commit can have been.
    fn commit_by(&self) -> i64 {
        self.committed.unwrap_or(self.completed)
    }
}

/// A generation value seen in the store for `object`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Generation {
    pub object: u64,
    /// From the value itself (`<secs>.<micros>-...`), see [`created_us`].
    pub created: i64,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub reads: Vec<Read>,
    pub writes: Vec<Write>,
    pub generations: Vec<Generation>,
    /// When Redis lost every generation (killed, restarted empty).
    pub wipes: Vec<i64>,
    /// What the nemesis did when (shown in timelines).
    pub notes: Vec<(i64, String)>,
    /// (down, back): when the feed could not see new changes because its
    /// source was down.
    pub feed_down: Vec<(i64, i64)>,
}

impl History {
    /// When sidecache could first learn of a change committed at `at`.
    fn visible_from(&self, at: i64) -> i64 {
        self.feed_down
            .iter()
            .find(|&&(down, back)| (down..=back).contains(&at))
            .map_or(at, |&(_, back)| back)
    }
}

/// The creation time embedded in a generation value (`lua/ticket.lua`,
/// `lua/invalidate.lua`, `lua/invalidate_marked.lua`: Redis `TIME` as
/// `<secs>.<6-digit micros>-<nonce>[@mark]`).
pub fn created_us(value: &str) -> Option<i64> {
    let (secs, rest) = value.split_once('.')?;
    let micros = rest.get(..6)?;
    Some(secs.parse::<i64>().ok()? * 1_000_000 + micros.parse::<i64>().ok()?)
}

/// A stale read, with how long before its invocation the newer version had
/// committed (at the latest).
#[derive(Clone, Debug)]
pub struct Stale {
    pub read: Read,
    pub age_us: i64,
}

/// What the checker found in one phase.
#[derive(Clone, Debug, Default)]
pub struct PhaseReport {
    pub reads: usize,
    pub failed_reads: usize,
    /// Answers per `X-Cache` value.
    pub cache: BTreeMap<String, usize>,
    pub stale: Vec<Stale>,
    /// (earlier read, later read with an older version).
    pub non_monotonic: Vec<(Read, Read)>,
    pub writes: usize,
    pub failed_writes: usize,
    pub not_invalidated: Vec<Write>,
    /// Writes first covered by a wipe rather than a new generation.
    pub wiped: usize,
    /// Commit → first generation created after it, microseconds.
    pub latencies_us: Vec<i64>,
}

impl PhaseReport {
    pub fn stale_beyond(&self, us: i64) -> usize {
        self.stale.iter().filter(|s| s.age_us > us).count()
    }
    pub fn ok(&self) -> bool {
        self.stale.is_empty() && self.non_monotonic.is_empty() && self.not_invalidated.is_empty()
    }
    /// p50, p99, max of the latencies in milliseconds.
    pub fn latency_ms(&self) -> Option<(f64, f64, f64)> {
        let mut v = self.latencies_us.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        Some((at(0.5), at(0.99), at(1.0)))
    }
}

/// Checks `h`; one report per phase `0..phases`.
pub fn check(h: &History, phases: usize) -> Vec<PhaseReport> {
    let mut out = vec![PhaseReport::default(); phases];
    for r in &h.reads {
        let p = &mut out[r.phase];
        p.reads += 1;
        match r.version {
            Some(_) => *p.cache.entry(r.cache.clone()).or_default() += 1,
            None => p.failed_reads += 1,
        }
    }
    for s in stale_reads(h) {
        out[s.read.phase].stale.push(s);
    }
    for (a, b) in non_monotonic(&h.reads) {
        out[b.phase].non_monotonic.push((a, b));
    }
    for w in &h.writes {
        let p = &mut out[w.phase];
        p.writes += 1;
        if w.version.is_none() {
            p.failed_writes += 1;
            continue;
        }
        match invalidation(h, w) {
            None => p.not_invalidated.push(w.clone()),
            Some(Cover::Wipe) => p.wiped += 1,
            Some(Cover::Generation(at)) => {
                if let Some(c) = w.committed {
                    p.latencies_us.push(at - h.visible_from(c));
                }
            }
        }
    }
    out
}

/// Per object: (version, time by which it had committed), sorted by
/// version, then reduced to "every version >= v had committed by t" (a
/// suffix minimum), so `x + 1`'s bound is one binary search.
fn commit_bounds(h: &History) -> HashMap<u64, Vec<(i64, i64)>> {
    let mut evidence: HashMap<u64, Vec<(i64, i64)>> = HashMap::new();
    for w in &h.writes {
        if let Some(v) = w.version {
            evidence
                .entry(w.object)
                .or_default()
                .push((v, h.visible_from(w.commit_by())));
        }
    }
    for r in &h.reads {
        if let Some(v) = r.version {
            evidence.entry(r.object).or_default().push((v, r.completed));
        }
    }
    for list in evidence.values_mut() {
        list.sort_unstable();
        let mut min = i64::MAX;
        for e in list.iter_mut().rev() {
            min = min.min(e.1);
            e.1 = min;
        }
    }
    evidence
}

fn stale_reads(h: &History) -> Vec<Stale> {
    let mut stale = behind(h);
    stale.retain(|s| s.age_us > STALE_AFTER_US);
    stale
}

/// Every read that returned a version older than one committed before it
/// was invoked, however briefly (the stale verdict is those beyond
/// [`STALE_AFTER_US`]): how far behind each answer path runs.
pub fn behind(h: &History) -> Vec<Stale> {
    let bounds = commit_bounds(h);
    let mut stale = Vec::new();
    for r in &h.reads {
        let (Some(x), Some(list)) = (r.version, bounds.get(&r.object)) else {
            continue;
        };
        // The first evidence of a version above x bounds x + 1's commit.
        let i = list.partition_point(|e| e.0 <= x);
        if let Some(&(_, newer_by)) = list.get(i) {
            let age_us = r.invoked - newer_by;
            if age_us > 0 {
                stale.push(Stale {
                    read: r.clone(),
                    age_us,
                });
            }
        }
    }
    stale
}

/// Per (instance, object): each read against the highest version among
/// the reads that completed before it was invoked.
fn non_monotonic(reads: &[Read]) -> Vec<(Read, Read)> {
    let mut groups: HashMap<(usize, u64), Vec<&Read>> = HashMap::new();
    for r in reads.iter().filter(|r| r.version.is_some()) {
        groups.entry((r.instance, r.object)).or_default().push(r);
    }
    let mut found = Vec::new();
    for group in groups.values() {
        let mut by_completion = group.clone();
        by_completion.sort_by_key(|r| r.completed);
        let mut by_invocation = group.clone();
        by_invocation.sort_by_key(|r| r.invoked);
        let mut done = by_completion.iter().peekable();
        let mut highest: Option<&Read> = None;
        for r in by_invocation {
            while let Some(d) = done.next_if(|d| d.completed < r.invoked) {
                if highest.is_none_or(|h| d.version > h.version) {
                    highest = Some(d);
                }
            }
            if let Some(h) = highest.filter(|h| r.version < h.version) {
                found.push(((*h).clone(), r.clone()));
            }
        }
    }
    found
}

enum Cover {
    /// The first generation of the object created after the commit.
    Generation(i64),
    Wipe,
}

fn invalidation(h: &History, w: &Write) -> Option<Cover> {
    let from = w.commit_from();
    let generation = h
        .generations
        .iter()
        .filter(|g| g.object == w.object && g.created >= from)
        .map(|g| g.created)
        .min();
    let wipe = h
        .wipes
        .iter()
        .copied()
        .filter(|&at| at >= from && at - w.commit_by() <= WIPE_COVERS_US)
        .min();
    match (generation, wipe) {
        (Some(g), Some(x)) if x < g => Some(Cover::Wipe),
        (Some(g), _) => Some(Cover::Generation(g)),
        (None, Some(_)) => Some(Cover::Wipe),
        (None, None) => None,
    }
}

/// Everything recorded about `object` between `from` and `to` (plus the
/// generations created then), one event per line in time order, times in
/// ms relative to `from`: the example printed with a violation.
pub fn timeline(h: &History, object: u64, from: i64, to: i64) -> String {
    let mut lines: Vec<(i64, String)> = Vec::new();
    let ms = |t: i64| (t - from) as f64 / 1e3;
    for w in h.writes.iter().filter(|w| w.object == object) {
        if w.completed >= from && w.invoked <= to {
            lines.push((
                w.invoked,
                format!(
                    "write  [{:>8.1} .. {:>8.1}] v{:?} committed at {:?}",
                    ms(w.invoked),
                    ms(w.completed),
                    w.version,
                    w.committed.map(ms)
                ),
            ));
        }
    }
    for r in h.reads.iter().filter(|r| r.object == object) {
        if r.completed >= from && r.invoked <= to {
            lines.push((
                r.invoked,
                format!(
                    "read   [{:>8.1} .. {:>8.1}] instance {} v{:?} {}",
                    ms(r.invoked),
                    ms(r.completed),
                    r.instance,
                    r.version,
                    r.cache
                ),
            ));
        }
    }
    for g in h.generations.iter().filter(|g| g.object == object) {
        if (from..=to).contains(&g.created) {
            lines.push((
                g.created,
                format!("generation created at {:>8.1}", ms(g.created)),
            ));
        }
    }
    for &at in &h.wipes {
        if (from..=to).contains(&at) {
            lines.push((at, format!("wipe at {:>8.1}", ms(at))));
        }
    }
    for (at, note) in &h.notes {
        if (from..=to).contains(at) {
            lines.push((*at, format!("nemesis at {:>8.1}: {note}", ms(*at))));
        }
    }
    lines.sort_by_key(|l| l.0);
    lines.into_iter().map(|l| l.1 + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000;

    fn read(instance: usize, invoked_ms: i64, completed_ms: i64, version: i64) -> Read {
        Read {
            phase: 0,
            instance,
            object: 1,
            invoked: invoked_ms * MS,
            completed: completed_ms * MS,
            version: Some(version),
            cache: "HIT".into(),
        }
    }

    fn write(invoked_ms: i64, committed_ms: i64, completed_ms: i64, version: i64) -> Write {
        Write {
            phase: 0,
            object: 1,
            invoked: invoked_ms * MS,
            completed: completed_ms * MS,
            version: Some(version),
            committed: Some(committed_ms * MS),
        }
    }

    fn generation(created_ms: i64) -> Generation {
        Generation {
            object: 1,
            created: created_ms * MS,
        }
    }

    fn one(h: &History) -> PhaseReport {
        check(h, 1).remove(0)
    }

    #[test]
    fn a_read_long_after_the_commit_returning_the_old_version_is_stale() {
        let h = History {
            writes: vec![write(1000, 1002, 1003, 2)],
            reads: vec![read(0, 1100, 1101, 1)],
            generations: vec![generation(1003)],
            ..History::default()
        };
        let r = one(&h);
        assert_eq!(r.stale.len(), 1);
        assert_eq!(r.stale[0].age_us, 98 * MS);
        assert!(!r.ok());
    }

    #[test]
    fn a_read_concurrent_with_the_write_or_within_the_bound_is_not_stale() {
        let h = History {
            writes: vec![write(1000, 1002, 1003, 2)],
            reads: vec![
                // Invoked before the write, completed after it.
                read(0, 990, 1010, 1),
                // Overlapping the write.
                read(1, 1001, 1004, 1),
                // Within 50 ms after the commit.
                read(2, 1050, 1051, 1),
            ],
            generations: vec![generation(1003)],
            ..History::default()
        };
        let r = one(&h);
        assert!(r.stale.is_empty(), "{:?}", r.stale);
        assert!(r.ok());
    }

    #[test]
    fn a_read_of_a_newer_version_bounds_the_commit_of_a_failed_write() {
        // The write's answer was lost, but a read saw version 2 complete at
        // 1010: a read of version 1 invoked 100 ms later is stale.
        let mut lost = write(1000, 0, 1500, 2);
        lost.version = None;
        lost.committed = None;
        let h = History {
            writes: vec![lost],
            reads: vec![read(0, 1005, 1010, 2), read(1, 1110, 1111, 1)],
            ..History::default()
        };
        let r = one(&h);
        assert_eq!(r.stale.len(), 1);
        assert_eq!(r.stale[0].age_us, 100 * MS);
        assert_eq!(r.failed_writes, 1);
    }

    #[test]
    fn a_later_version_bounds_the_commit_of_every_earlier_one() {
        // Version 3's commit at 1100 proves version 2 committed by then.
        let h = History {
            writes: vec![write(1090, 1100, 1101, 3)],
            reads: vec![read(0, 1200, 1201, 1)],
            generations: vec![generation(1101)],
            ..History::default()
        };
        assert_eq!(one(&h).stale.len(), 1);
    }

    #[test]
    fn an_older_version_after_a_newer_one_on_the_same_instance_is_flagged() {
        let h = History {
            reads: vec![read(0, 1000, 1001, 2), read(0, 1002, 1003, 1)],
            ..History::default()
        };
        let r = one(&h);
        assert_eq!(r.non_monotonic.len(), 1);
        assert_eq!(r.non_monotonic[0].0.version, Some(2));
        assert_eq!(r.non_monotonic[0].1.version, Some(1));
    }

    #[test]
    fn overlapping_reads_and_other_instances_are_not_ordered() {
        let h = History {
            reads: vec![
                read(0, 1000, 1005, 2),
                // Invoked before the first completed: concurrent.
                read(0, 1004, 1006, 1),
                // Another instance.
                read(1, 1010, 1011, 1),
                // Same version again: fine.
                read(0, 1020, 1021, 2),
            ],
            ..History::default()
        };
        assert!(one(&h).non_monotonic.is_empty());
    }

    #[test]
    fn a_write_without_a_later_generation_is_not_invalidated() {
        let h = History {
            writes: vec![write(1000, 1002, 1003, 2)],
            // Created before the commit: that is the old generation.
            generations: vec![generation(1001)],
            ..History::default()
        };
        let r = one(&h);
        assert_eq!(r.not_invalidated.len(), 1);
        assert!(!r.ok());
    }

    #[test]
    fn the_first_generation_after_the_commit_gives_the_latency() {
        let h = History {
            writes: vec![write(1000, 1002, 1003, 2)],
            generations: vec![generation(1001), generation(1009), generation(1004)],
            ..History::default()
        };
        let r = one(&h);
        assert!(r.not_invalidated.is_empty());
        assert_eq!(r.latencies_us, vec![2 * MS]);
    }

    #[test]
    fn a_change_committed_while_the_feed_was_down_counts_from_its_return() {
        // Committed at 1010 while the source was down (1000–2000): reads of
        // version 1 until 2050 are not stale, one at 2060 is, and the
        // latency counts from 2000.
        let h = History {
            writes: vec![write(990, 1010, 1020, 2)],
            reads: vec![
                read(0, 1500, 1501, 1),
                read(1, 2050, 2051, 1),
                read(2, 2060, 2061, 1),
            ],
            generations: vec![generation(2030)],
            feed_down: vec![(1000 * MS, 2000 * MS)],
            ..History::default()
        };
        let r = one(&h);
        assert_eq!(r.stale.len(), 1, "{:?}", r.stale);
        assert_eq!(r.stale[0].age_us, 60 * MS);
        assert_eq!(r.latencies_us, vec![30 * MS]);
        // Without the outage every one of those reads is stale.
        let h = History {
            feed_down: Vec::new(),
            ..h
        };
        assert_eq!(one(&h).stale.len(), 3);
    }

    #[test]
    fn a_wipe_soon_after_the_commit_covers_the_write() {
        let h = History {
            writes: vec![write(1000, 1002, 1003, 2)],
            wipes: vec![1005 * MS],
            ..History::default()
        };
        let r = one(&h);
        assert!(r.not_invalidated.is_empty());
        assert_eq!(r.wiped, 1);
        assert!(r.latencies_us.is_empty());
        // A write left uninvalidated for longer is not excused by a wipe.
        let late = History {
            wipes: vec![(1002 + 1001) * MS],
            ..h
        };
        assert_eq!(one(&late).not_invalidated.len(), 1);
    }

    #[test]
    fn generation_values_carry_their_creation_time() {
        assert_eq!(
            created_us("1764590000.000123-abc@o:5:99"),
            Some(1_764_590_000_000_123)
        );
        assert_eq!(
            created_us("1764590000.123456-n"),
            Some(1_764_590_000_123_456)
        );
        assert_eq!(created_us("garbage"), None);
    }

    #[test]
    fn latency_percentiles() {
        let r = PhaseReport {
            latencies_us: (1..=100).map(|i| i * MS).collect(),
            ..PhaseReport::default()
        };
        assert_eq!(r.latency_ms(), Some((51.0, 99.0, 100.0)));
    }
}
