//! Jittered exponential backoff for reconnect loops and retry schedules.

use rand::Rng;
use std::time::Duration;

/// `base * 2^n` capped at `max`, each delay scaled by a random factor in
/// [0.5, 1.0] so that many sidecars that lost the same server do not come
/// back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            attempt: 0,
        }
    }

    /// The next delay; each call doubles the ceiling until `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = jittered(exponential(self.base, self.max, self.attempt));
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// `base * 2^attempt`, capped at `max`, without jitter.
pub fn exponential(base: Duration, max: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1u32 << attempt.min(20)).min(max)
}

/// `d` scaled by a random factor in [0.5, 1.0].
pub fn jittered(d: Duration) -> Duration {
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
}
