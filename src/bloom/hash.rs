//! Bit positions of an element, and the filter's signature.
//!
//! Positions are a shared protocol: every instance (and every version of
//! sidecache that shares a Redis) must compute the same ones, or one
//! instance's bitmap answers "certainly absent" for another's members. So
//! the scheme is fixed and pinned by test vectors below; any change must
//! bump [`FORMAT_VERSION`], which changes the signature, which makes every
//! old bitmap answer "unknown" until it is rebuilt.
//!
//! Scheme (Kirsch–Mitzenmacher double hashing over one SHA-256):
//! `d = SHA-256(route ‖ 0x00 ‖ scope ‖ 0x00 ‖ id)` (UTF-8),
//! `h1 = d[0..8]` and `h2 = d[8..16]` as big-endian u64, `h2 |= 1` (odd, so
//! never zero and the k positions never collapse to one),
//! `pos_i = (h1 + i·h2) mod m` for `i = 0..k`, computed in u128 so nothing
//! wraps. The route and scope take part so that equal ids of two tenants
//! or routes land on unrelated bits.

use crate::config::bloom_sizing::Sizing;
use sha2::{Digest, Sha256};

/// Version of the bitmap format and hashing scheme. Part of the signature.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Algorithm name in the signature.
pub(crate) const ALGORITHM: &str = "sha256-dh";

/// The `k` bit positions of `id` in the filter of `route` / `scope`.
pub fn positions(route: &str, scope: &str, id: &str, size: Sizing) -> Vec<u64> {
    let mut out = Vec::with_capacity(size.k as usize);
    push_positions(route, scope, id, size, &mut out);
    out
}

/// [`positions`], appended to `out` (builds reuse one buffer per batch).
pub(crate) fn push_positions(route: &str, scope: &str, id: &str, size: Sizing, out: &mut Vec<u64>) {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0u8]);
    h.update(scope.as_bytes());
    h.update([0u8]);
    h.update(id.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    let mut second = [0u8; 8];
    first.copy_from_slice(&d[0..8]);
    second.copy_from_slice(&d[8..16]);
    let h1 = u128::from(u64::from_be_bytes(first));
    let h2 = u128::from(u64::from_be_bytes(second) | 1);
    let m = u128::from(size.m);
    for i in 0..u128::from(size.k) {
        // Fits: h1 < 2^64, i < 2^5, h2 < 2^64, so the sum is < 2^70.
        out.push(((h1 + i * h2) % m) as u64);
    }
}

/// The signature written to `ready` when a filter is activated and compared
/// on every check: a filter built with other parameters answers "unknown".
pub fn signature(size: Sizing) -> String {
    format!(
        "sidecache-bloom/v{FORMAT_VERSION};{ALGORITHM};m={};k={}",
        size.m, size.k
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors. If this test fails, hashing changed: every bitmap in
    /// every shared Redis would silently disagree with this build. Restore
    /// the old scheme, or bump FORMAT_VERSION and regenerate the table on
    /// purpose.
    #[test]
    fn test_vectors() {
        type Vector = (
            &'static str,
            &'static str,
            &'static str,
            u64,
            u32,
            &'static [u64],
        );
        let cases: &[Vector] = &[
            (
                "app",
                "t1",
                "42",
                95851,
                7,
                &[50206, 48576, 46946, 45316, 43686, 42056, 40426],
            ),
            (
                "app",
                "t2",
                "42",
                95851,
                7,
                &[93053, 54484, 15915, 73197, 34628, 91910, 53341],
            ),
            ("app", "", "1", 1000, 3, &[259, 464, 669]),
            (
                "catalogue",
                "tenant-ä",
                "9007199254740993",
                1437759,
                10,
                &[
                    452264, 706433, 960602, 1214771, 31181, 285350, 539519, 793688, 1047857,
                    1302026,
                ],
            ),
            ("r", "a:b", "{x}", 8, 1, &[7]),
            (
                "app",
                "t1",
                "",
                4294967296,
                4,
                &[2422343517, 2230829800, 2039316083, 1847802366],
            ),
        ];
        for (route, scope, id, m, k, want) in cases {
            let got = positions(route, scope, id, Sizing { m: *m, k: *k });
            assert_eq!(&got[..], *want, "{route:?} {scope:?} {id:?} m={m} k={k}");
        }
    }

    #[test]
    fn positions_are_in_range_distinct_inputs_differ() {
        let size = Sizing::new(10_000, 0.01).unwrap();
        let a = positions("app", "t1", "42", size);
        assert_eq!(a.len(), 7);
        assert!(a.iter().all(|p| *p < size.m));
        // Same id, other tenant / other route: other bits.
        assert_ne!(a, positions("app", "t2", "42", size));
        assert_ne!(a, positions("other", "t1", "42", size));
        // The separator keeps ("a", "bc") and ("ab", "c") apart.
        assert_ne!(
            positions("r", "a", "bc", size),
            positions("r", "ab", "c", size)
        );
    }

    #[test]
    fn signature_names_algorithm_size_and_version() {
        let s = signature(Sizing { m: 95_851, k: 7 });
        assert_eq!(s, "sidecache-bloom/v1;sha256-dh;m=95851;k=7");
        assert_ne!(s, signature(Sizing { m: 95_852, k: 7 }));
        assert_ne!(s, signature(Sizing { m: 95_851, k: 6 }));
    }
}
