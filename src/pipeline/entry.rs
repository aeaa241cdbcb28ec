//! Entry format v2: one cached response as compact binary, so a hit decodes
//! without parsing text or copying the body (the body is a `Bytes` slice of
//! the value read from the store).
//!
//! Layout (integers big-endian, `str16` = u16 length + bytes):
//! ```text
//! "SCE2" | u8 flags (bit0 negative) | u16 status | u64 stored_at_ms
//! | u64 fresh_until_ms | u32 grace_ms | u32 stale_if_error_ms | str16 generation | str16 identity | str16 variant
//! | u16 header count | (str16 name | u32 len + value)*
//! | u32 body length | body
//! [ | u8 tag count | (str16 tag generation key | str16 tag generation)* ]  (flag bit1)
//! ```
//! The tag section (docs/architecture.md#entry-format) exists only with flag
//! bit 1, so an untagged entry is byte for byte what it was, and a binary from
//! before tags finds trailing bytes in a tagged one: corrupt, never served
//! unchecked. Anything that does not decode exactly (bad magic, short read,
//! trailing bytes, invalid header) is [`CorruptEntry`].
//!
//! v2 added the freshness and stale windows (grace, stale-if-error): the
//! store keeps an entry past its freshness, so the entry itself must say
//! when it expired and how long it may still answer. The key carries the
//! version (`e:v2:`), so v1 entries are simply never read (misses, not
//! corrupt entries) and expire on their own.
//!
//! The key's `e:v3:` (same bytes as v2) marks entries that are always
//! stamped with their route's generation (route-wide purges): an entry
//! written before that, without the stamp, would survive a purge, so it is
//! never read.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};

const MAGIC: &[u8; 4] = b"SCE2";
const FLAG_NEGATIVE: u8 = 1;
const FLAG_TAGGED: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub status: u16,
    pub negative: bool,
    /// Unix time in milliseconds when the response was fetched.
    pub stored_at_ms: u64,
    /// Unix ms until which the entry is fresh (a HIT); after it, expired.
    pub fresh_until_ms: u64,
    /// After expiry: how long it is served at once while a refresh runs.
    pub grace_ms: u32,
    /// After expiry: how long it answers instead of a failed refill.
    pub stale_if_error_ms: u32,
    /// The generation ticket the entry was published under.
    pub generation: Bytes,
    /// The object's identity and variant, as in the key (bytes: compared,
    /// never parsed).
    pub identity: Bytes,
    pub variant: Bytes,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// (tag generation key, the tag's generation when the fill began):
    /// served only while every one is still current.
    pub tags: Vec<(Bytes, Bytes)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt cache entry: {0}")]
pub(crate) struct CorruptEntry(pub &'static str);

impl Entry {
    pub(crate) fn encode(&self) -> Bytes {
        // Exactly what is written below: a buffer that had to grow would
        // keep up to twice the entry's size allocated for as long as the
        // entry is held (the embedded store and the near cache hold it).
        let mut out = BytesMut::with_capacity(self.encoded_len());
        out.put_slice(MAGIC);
        let mut flags = if self.negative { FLAG_NEGATIVE } else { 0 };
        if !self.tags.is_empty() {
            flags |= FLAG_TAGGED;
        }
        out.put_u8(flags);
        out.put_u16(self.status);
        out.put_u64(self.stored_at_ms);
        out.put_u64(self.fresh_until_ms);
        out.put_u32(self.grace_ms);
        out.put_u32(self.stale_if_error_ms);
        put_str16(&mut out, &self.generation);
        put_str16(&mut out, &self.identity);
        put_str16(&mut out, &self.variant);
        out.put_u16(u16::try_from(self.headers.len()).unwrap_or(u16::MAX));
        for (name, value) in self.headers.iter().take(u16::MAX as usize) {
            put_str16(&mut out, name.as_str().as_bytes());
            out.put_u32(value.len() as u32);
            out.put_slice(value.as_bytes());
        }
        // Validation keeps `fill.max_body` within u32, so this never truncates.
        debug_assert!(u32::try_from(self.body.len()).is_ok(), "body too long");
        out.put_u32(self.body.len() as u32);
        out.put_slice(&self.body);
        if !self.tags.is_empty() {
            out.put_u8(u8::try_from(self.tags.len()).unwrap_or(u8::MAX));
            for (key, generation) in self.tags.iter().take(u8::MAX as usize) {
                put_str16(&mut out, key);
                put_str16(&mut out, generation);
            }
        }
        debug_assert_eq!(out.len(), self.encoded_len(), "encoded_len is exact");
        out.freeze()
    }

    /// The length of [`Entry::encode`]'s output.
    fn encoded_len(&self) -> usize {
        let str16 = |b: &[u8]| 2 + b.len().min(u16::MAX as usize);
        let headers: usize = (self.headers.iter().take(u16::MAX as usize))
            .map(|(n, v)| str16(n.as_str().as_bytes()) + 4 + v.len())
            .sum();
        let tags: usize = match self.tags.is_empty() {
            true => 0,
            false => {
                1 + (self.tags.iter().take(u8::MAX as usize))
                    .map(|(k, g)| str16(k) + str16(g))
                    .sum::<usize>()
            }
        };
        // magic, flags, status, stored_at, fresh_until, grace, stale_if_error
        MAGIC.len()
            + 1
            + 2
            + 8
            + 8
            + 4
            + 4
            + str16(&self.generation)
            + str16(&self.identity)
            + str16(&self.variant)
            + 2
            + headers
            + 4
            + self.body.len()
            + tags
    }

    /// Past its freshness at `now_ms`: no longer a HIT.
    pub(crate) fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.fresh_until_ms
    }

    /// Expired, but within its grace window at `now_ms`.
    pub(crate) fn within_grace(&self, now_ms: u64) -> bool {
        self.expired(now_ms) && now_ms < self.fresh_until_ms.saturating_add(self.grace_ms.into())
    }

    /// Expired, but within its stale-if-error window at `now_ms`.
    pub(crate) fn within_stale_if_error(&self, now_ms: u64) -> bool {
        self.expired(now_ms)
            && now_ms
                < self
                    .fresh_until_ms
                    .saturating_add(self.stale_if_error_ms.into())
    }

    /// Fields kept as `Bytes` (generation, identity, variant, header
    /// values, body, tags) are slices of `raw`, not copies; everything else
    /// is read through a borrowed cursor, so a hit pays a reference count
    /// only for what it keeps.
    pub(crate) fn decode(raw: &Bytes) -> Result<Entry, CorruptEntry> {
        let mut r = Reader { raw, at: 0 };
        if raw.len() < MAGIC.len() + 1 + 2 + 8 + 8 + 4 + 4 || &raw[..4] != MAGIC {
            return Err(CorruptEntry("bad magic or too short"));
        }
        r.at = MAGIC.len();
        let flags = r.array::<1>()?[0];
        let status = u16::from_be_bytes(r.array()?);
        let stored_at_ms = u64::from_be_bytes(r.array()?);
        let fresh_until_ms = u64::from_be_bytes(r.array()?);
        let grace_ms = u32::from_be_bytes(r.array()?);
        let stale_if_error_ms = u32::from_be_bytes(r.array()?);
        let generation = r.str16()?;
        let identity = r.str16()?;
        let variant = r.str16()?;
        let count = u16::from_be_bytes(r.array()?);
        let mut headers = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let len = usize::from(u16::from_be_bytes(r.array()?));
            let name = HeaderName::from_bytes(r.take(len)?)
                .map_err(|_| CorruptEntry("bad header name"))?;
            let len = u32::from_be_bytes(r.array()?) as usize;
            let value = r.slice(len)?;
            let value = HeaderValue::from_maybe_shared(value)
                .map_err(|_| CorruptEntry("bad header value"))?;
            headers.push((name, value));
        }
        let body_len = u32::from_be_bytes(r.array()?) as usize;
        let body = r.slice(body_len)?;
        let mut tags = Vec::new();
        if flags & FLAG_TAGGED != 0 {
            let count = r.array::<1>()?[0];
            if count == 0 {
                return Err(CorruptEntry("tagged without tags"));
            }
            tags.reserve(usize::from(count));
            for _ in 0..count {
                let key = r.str16()?;
                tags.push((key, r.str16()?));
            }
        }
        if r.at != raw.len() {
            return Err(CorruptEntry("trailing bytes"));
        }
        Ok(Entry {
            status,
            negative: flags & FLAG_NEGATIVE != 0,
            stored_at_ms,
            fresh_until_ms,
            grace_ms,
            stale_if_error_ms,
            generation,
            identity,
            variant,
            headers,
            body,
            tags,
        })
    }
}

fn put_str16(out: &mut BytesMut, s: &[u8]) {
    let len = s.len().min(u16::MAX as usize);
    out.put_u16(len as u16);
    out.put_slice(&s[..len]);
}

/// A cursor over an encoded entry.
struct Reader<'a> {
    raw: &'a Bytes,
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], CorruptEntry> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.raw.len())
            .ok_or(CorruptEntry("truncated"))?;
        let taken = &self.raw[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CorruptEntry> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// The next `len` bytes as a slice of the entry (shared, not copied).
    fn slice(&mut self, len: usize) -> Result<Bytes, CorruptEntry> {
        let start = self.at;
        self.take(len)?;
        Ok(self.raw.slice(start..self.at))
    }

    fn str16(&mut self) -> Result<Bytes, CorruptEntry> {
        let len = u16::from_be_bytes(self.array()?);
        self.slice(usize::from(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Entry {
        Entry {
            status: 200,
            negative: false,
            stored_at_ms: 1_700_000_000_123,
            fresh_until_ms: 1_700_000_060_123,
            grace_ms: 30_000,
            stale_if_error_ms: 600_000,
            generation: Bytes::from_static(b"1700000000.123456-abcd"),
            identity: "app:acme:42".into(),
            variant: "0123456789abcdef0123456789abcdef".into(),
            headers: vec![
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    HeaderName::from_static("x-thing"),
                    HeaderValue::from_static("a, b"),
                ),
            ],
            body: Bytes::from_static(b"{\"id\":42}"),
            tags: vec![],
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let raw = e.encode();
        assert_eq!(Entry::decode(&raw), Ok(e));
        let neg = Entry {
            negative: true,
            status: 404,
            body: Bytes::new(),
            headers: vec![],
            ..sample()
        };
        assert_eq!(Entry::decode(&neg.encode()), Ok(neg));
        let tagged = Entry {
            tags: vec![
                (
                    Bytes::from_static(b"sc:t:{a}:g"),
                    Bytes::from_static(b"1.000001-x"),
                ),
                (
                    Bytes::from_static(b"sc:t:{b}:g"),
                    Bytes::from_static(b"2.000002-y"),
                ),
            ],
            ..sample()
        };
        let raw = tagged.encode();
        assert_eq!(Entry::decode(&raw), Ok(tagged));
        // Untagged entries keep the v2 layout: no tag section at all.
        assert_eq!(
            sample().encode().len() + 1 + 2 * (2 + 10 + 2 + 10),
            raw.len()
        );
    }

    #[test]
    fn every_truncation_and_garbage_is_corrupt() {
        let raw = sample().encode();
        for len in 0..raw.len() {
            assert!(
                Entry::decode(&raw.slice(..len)).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
        let mut extra = raw.to_vec();
        extra.push(0);
        assert!(Entry::decode(&Bytes::from(extra)).is_err());
        assert!(Entry::decode(&Bytes::from_static(b"{\"json\":\"not an entry\"}")).is_err());
        let mut bad_header = raw.to_vec();
        // Corrupt the first header name's first byte into a space.
        let pos = raw
            .windows(12)
            .position(|w| w == b"content-type")
            .expect("header present");
        bad_header[pos] = b' ';
        assert!(Entry::decode(&Bytes::from(bad_header)).is_err());
    }
}
