//! PLACEHOLDER (helper A replaces): hop-by-hop headers, X-Forwarded-*, framing checks.

use http::HeaderMap;
use std::net::SocketAddr;

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(_h: &mut HeaderMap) {
    todo!()
}

/// Appends the peer to `X-Forwarded-For` and sets `X-Forwarded-Proto`.
pub fn append_forwarded(_h: &mut HeaderMap, _peer: SocketAddr, _proto: &str) {
    todo!()
}

/// `Err(reason)` for ambiguous framing: CL + TE, or differing CLs.
pub fn check_framing(_h: &HeaderMap) -> Result<(), String> {
    todo!()
}
