//! A Bloom bitmap of the embedded store ([`super::bloom`]): a byte
//! vector with the bit order of Redis (offset 0 is the most significant bit
//! of byte 0), mutable in place so a `SETBIT` does not copy it.

use tokio::time::Instant;

/// A bitmap value; `expires` is `None` for the active (persistent) bitmap.
pub(super) struct Bitmap {
    pub(super) bytes: Vec<u8>,
    pub(super) expires: Option<Instant>,
}

impl Bitmap {
    pub(super) fn len_bits(&self) -> u64 {
        self.bytes.len() as u64 * 8
    }

    pub(super) fn get(&self, offset: u64) -> bool {
        let Ok(byte) = usize::try_from(offset / 8) else {
            return false;
        };
        self.bytes
            .get(byte)
            .is_some_and(|b| b & (0x80 >> (offset % 8)) != 0)
    }

    pub(super) fn set(&mut self, offset: u64) {
        // Offsets come from positions mod m, and m is capped (config::bloom_sizing).
        let byte = usize::try_from(offset / 8).unwrap_or(usize::MAX);
        if byte >= self.bytes.len() {
            self.bytes.resize(byte.saturating_add(1), 0);
        }
        self.bytes[byte] |= 0x80 >> (offset % 8);
    }
}
