//! `etag: auto` (docs/caching.md#conditional-requests-and-ranges): the strong
//! `ETag` stored with an entry whose origin sent none, derived from the body at
//! publish time so a HIT never hashes. An origin's own `ETag`, weak or strong,
//! is kept as it is: clients may also use it against the origin (`If-Match` on
//! a write).

use crate::config::EtagMode;
use http::header::{self, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

/// Bytes of the SHA-256 kept in a derived tag: 128 bits, 32 hex digits.
const TAG_BYTES: usize = 16;

/// The derived tag of `body`: `"` + the first 128 bits of its SHA-256 in
/// hex + `"`. Strong: equal bodies are byte-for-byte equal.
pub(crate) fn derive(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    let mut tag = String::with_capacity(2 + 2 * TAG_BYTES);
    tag.push('"');
    for b in &digest[..TAG_BYTES] {
        tag.push(char::from(HEX[usize::from(b >> 4)]));
        tag.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    tag.push('"');
    // Quotes and hex digits only: always a valid header value.
    HeaderValue::from_str(&tag).unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Adds the derived `ETag` to the headers of an entry about to be stored
/// when the route asks for it and the origin sent none.
pub(crate) fn ensure(mode: EtagMode, headers: &mut Vec<(HeaderName, HeaderValue)>, body: &[u8]) {
    if mode == EtagMode::Auto && !headers.iter().any(|(n, _)| n == header::ETAG) {
        headers.push((header::ETAG, derive(body)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_tags_are_strong_quoted_and_follow_the_body() {
        // SHA-256("") = e3b0c442 98fc1c14 9afbf4c8 996fb924 ...
        assert_eq!(derive(b""), "\"e3b0c44298fc1c149afbf4c8996fb924\"");
        let a = derive(b"{\"id\":1}");
        assert_eq!(a, derive(b"{\"id\":1}"));
        assert_ne!(a, derive(b"{\"id\":2}"));
        assert_eq!(a.len(), 34);
        let parsed: headers::ETag = a.to_str().expect("ascii").parse().expect("an entity-tag");
        assert!(!parsed.is_weak());
    }

    #[test]
    fn auto_adds_only_where_the_origin_sent_none() {
        let mut none = vec![];
        ensure(EtagMode::Auto, &mut none, b"x");
        assert_eq!(none, vec![(header::ETAG, derive(b"x"))]);

        let origin = (header::ETAG, HeaderValue::from_static("W/\"v7\""));
        let mut kept = vec![origin.clone()];
        ensure(EtagMode::Auto, &mut kept, b"x");
        assert_eq!(kept, vec![origin]);

        let mut off = vec![];
        ensure(EtagMode::Origin, &mut off, b"x");
        assert!(off.is_empty());
    }
}
