//! The last few dead-lettered events (poison from the outbox or the
//! stream), for the status page. Bounded: the newest [`KEEP`] only.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Dead letters kept.
pub(crate) const KEEP: usize = 20;
/// Reasons are cut to this many characters.
const MAX_REASON: usize = 300;

/// One dead-lettered event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct DeadLetter {
    /// Unix time in milliseconds.
    pub time_ms: u64,
    pub source: &'static str,
    pub reason: String,
}

#[derive(Debug, Default)]
pub(crate) struct RecentDeadLetters {
    list: Mutex<VecDeque<DeadLetter>>,
}

impl RecentDeadLetters {
    pub(crate) fn record(&self, source: &'static str, reason: &str) {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let reason: String = reason.chars().take(MAX_REASON).collect();
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() == KEEP {
            list.pop_front();
        }
        list.push_back(DeadLetter {
            time_ms,
            source,
            reason,
        });
    }

    /// Newest first.
    pub(crate) fn newest_first(&self) -> Vec<DeadLetter> {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_bounds_reasons() {
        let recent = RecentDeadLetters::default();
        for i in 0..KEEP + 5 {
            recent.record("outbox", &format!("r{i}"));
        }
        let list = recent.newest_first();
        assert_eq!(list.len(), KEEP);
        assert_eq!(list[0].reason, format!("r{}", KEEP + 4));
        assert_eq!(list[KEEP - 1].reason, "r5");
        recent.record("stream", &"x".repeat(10_000));
        assert_eq!(recent.newest_first()[0].reason.len(), MAX_REASON);
    }
}
