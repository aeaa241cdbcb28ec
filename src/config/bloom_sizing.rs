//! Filter size from the operator's numbers: `m` bits and `k` hash positions
//! from `capacity` (expected members) and `fp_rate` (target false-positive
//! probability), by the standard formulas
//!
//! ```text
//! m = ceil(-n · ln p / (ln 2)²)      k = round(m / n · ln 2), at least 1
//! ```
//!
//! Absurd inputs are errors, not silently clamped: a filter that cannot
//! meet its target would look configured while being useless.

/// Upper bound on `m`: 2³² bits is 512 MiB per filter, far beyond any
/// catalogue a sidecar should hold in one Redis string (and Redis' SETBIT
/// limit). Anything larger is a configuration mistake.
pub(crate) const MAX_BITS: u64 = 1 << 32;

/// More positions per check than this means `fp_rate` is absurdly small;
/// each position is one `GETBIT` on the request path.
pub(crate) const MAX_HASHES: u32 = 32;

/// The size of one filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Bits in the bitmap.
    pub m: u64,
    /// Positions per element.
    pub k: u32,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum SizingError {
    #[error("capacity must be at least 1")]
    ZeroCapacity,
    #[error("fp_rate {0} must be strictly between 0 and 1")]
    FpRate(f64),
    #[error("capacity {capacity} at fp_rate {fp_rate} needs {bits} bits; the limit is {MAX_BITS} (512 MiB)")]
    TooLarge {
        capacity: u64,
        fp_rate: f64,
        bits: f64,
    },
    #[error("fp_rate {0} needs more than {MAX_HASHES} hash positions per id")]
    TooManyHashes(f64),
}

impl Sizing {
    pub(crate) fn new(capacity: u64, fp_rate: f64) -> Result<Sizing, SizingError> {
        if capacity == 0 {
            return Err(SizingError::ZeroCapacity);
        }
        // Also rejects NaN (every comparison is false).
        if !(fp_rate > 0.0 && fp_rate < 1.0) {
            return Err(SizingError::FpRate(fp_rate));
        }
        let n = capacity as f64;
        let ln2 = std::f64::consts::LN_2;
        let bits = (-n * fp_rate.ln() / (ln2 * ln2)).ceil();
        // `bits` is finite and positive here (n ≥ 1, 0 < p < 1).
        if bits > MAX_BITS as f64 {
            return Err(SizingError::TooLarge {
                capacity,
                fp_rate,
                bits,
            });
        }
        // At least 8 bits: a one-byte bitmap, never an empty string.
        let m = (bits as u64).max(8);
        let k = ((m as f64 / n) * ln2).round().max(1.0);
        if k > MAX_HASHES as f64 {
            return Err(SizingError::TooManyHashes(fp_rate));
        }
        Ok(Sizing { m, k: k as u32 })
    }

    /// The false-positive rate this size gives with `n` members:
    /// `(1 - e^(-k·n/m))^k`. What the tests hold `new` to.
    #[cfg(test)]
    fn expected_fp_rate(&self, n: u64) -> f64 {
        let k = f64::from(self.k);
        (1.0 - (-k * n as f64 / self.m as f64).exp()).powf(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textbook_values() {
        // n = 10 000, p = 1 %: m = 95 851 bits (~11.7 KiB), k = 7.
        assert_eq!(
            Sizing::new(10_000, 0.01).unwrap(),
            Sizing { m: 95_851, k: 7 }
        );
        // n = 100 000, p = 0.1 %: m = 1 437 759, k = 10.
        assert_eq!(
            Sizing::new(100_000, 0.001).unwrap(),
            Sizing {
                m: 1_437_759,
                k: 10
            }
        );
        let s = Sizing::new(1, 0.5).unwrap();
        assert!(s.m >= 8 && s.k >= 1);
    }

    #[test]
    fn expected_rate_meets_the_target() {
        for (n, p) in [(1_000, 0.05), (10_000, 0.01), (1_000_000, 0.001)] {
            let s = Sizing::new(n, p).unwrap();
            let got = s.expected_fp_rate(n);
            assert!(got <= p * 1.05, "n={n} p={p}: {got}");
        }
    }

    #[test]
    fn absurd_inputs_are_errors() {
        assert_eq!(Sizing::new(0, 0.01), Err(SizingError::ZeroCapacity));
        for p in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(Sizing::new(10, p), Err(SizingError::FpRate(_))),
                "{p}"
            );
        }
        assert!(matches!(
            Sizing::new(u64::MAX, 0.01),
            Err(SizingError::TooLarge { .. })
        ));
        assert!(matches!(
            Sizing::new(1_000_000_000, 1e-9),
            Err(SizingError::TooLarge { .. })
        ));
        assert!(matches!(
            Sizing::new(10, 1e-12),
            Err(SizingError::TooManyHashes(_))
        ));
    }
}
