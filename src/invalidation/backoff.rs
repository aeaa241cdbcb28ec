//! Jittered exponential backoff for reconnect loops and retry schedules.

use rand::Rng;
use std::time::Duration;

/// `base * 2^n` capped at `max`, each delay scaled by a random factor in
/// [0.5, 1.0] so that many sidecars that lost the same server do not come
/// back in lockstep.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            attempt: 0,
        }
    }

    /// The next delay; each call doubles the ceiling until `max`.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = jittered(exponential(self.base, self.max, self.attempt));
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A reconnect schedule: [`Backoff`], except that a refused connect early
/// in an outage is retried at a short fixed pace. A refused connect means
/// nothing listens on the server's port, typically a restart: trying it
/// costs the server nothing (the kernel answers), and the server's first
/// commits after the restart wait for this reconnect.
#[derive(Debug, Clone)]
pub(crate) struct Reconnect {
    backoff: Backoff,
    refused_pace: Duration,
    fast_for: Duration,
    outage_since: Option<tokio::time::Instant>,
}

impl Reconnect {
    /// Backs off from `base` to `max`; refused connects are retried every
    /// `refused_pace` (jittered) during the first `fast_for` of an outage.
    pub(crate) fn new(
        base: Duration,
        max: Duration,
        refused_pace: Duration,
        fast_for: Duration,
    ) -> Self {
        Reconnect {
            backoff: Backoff::new(base, max),
            refused_pace,
            fast_for,
            outage_since: None,
        }
    }

    /// The wait before the next attempt, after one that failed.
    pub(crate) fn next_delay(&mut self, refused: bool) -> Duration {
        let since = *self
            .outage_since
            .get_or_insert_with(tokio::time::Instant::now);
        if refused && since.elapsed() < self.fast_for {
            jittered(self.refused_pace)
        } else {
            self.backoff.next_delay()
        }
    }

    /// The connection works again: the next outage starts afresh.
    pub(crate) fn reset(&mut self) {
        self.backoff.reset();
        self.outage_since = None;
    }
}

/// `base * 2^attempt`, capped at `max`, without jitter.
pub(crate) fn exponential(base: Duration, max: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1u32 << attempt.min(20)).min(max)
}

/// `d` scaled by a random factor in [0.5, 1.0].
pub(crate) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_below_the_ceiling() {
        let s = Duration::from_secs(1);
        assert_eq!(exponential(s, 60 * s, 0), s);
        assert_eq!(exponential(s, 60 * s, 3), 8 * s);
        assert_eq!(exponential(s, 60 * s, 6), 60 * s);
        assert_eq!(exponential(s, 60 * s, u32::MAX), 60 * s);
        let mut b = Backoff::new(s, 60 * s);
        for ceiling in [1, 2, 4, 8, 16, 32, 60, 60] {
            let d = b.next_delay();
            assert!(
                d <= ceiling * s && d >= ceiling * s / 2,
                "{d:?} vs {ceiling}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= s);
    }

    #[test]
    fn refused_connects_are_retried_fast_early_in_an_outage_only() {
        let ms = Duration::from_millis(1);
        let mut r = Reconnect::new(100 * ms, 1000 * ms, 20 * ms, Duration::from_secs(3600));
        for _ in 0..10 {
            let d = r.next_delay(true);
            assert!(d <= 20 * ms && d >= 10 * ms, "{d:?}");
        }
        // Another error backs off, from the base: refused tries did not grow it.
        assert!(r.next_delay(false) <= 100 * ms);
        assert!(r.next_delay(false) > 100 * ms);
        // Past the fast window, refused connects back off too.
        let mut late = Reconnect::new(100 * ms, 1000 * ms, 20 * ms, Duration::ZERO);
        late.next_delay(true);
        late.next_delay(true);
        assert!(late.next_delay(true) > 200 * ms);
        late.reset();
        assert!(late.next_delay(false) <= 100 * ms);
    }
}
