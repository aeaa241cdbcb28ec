//! The upstream side: streaming pass-through (`forward`), hop-by-hop and
//! framing rules (`headers`), the pooled upstream client (`client`), and
//! the per-request upstream time for the access log (`timing`), and request
//! bodies held before they go upstream (`upload`).
//! Used by the client-facing server (everything that is not a cache read)
//! and by the read pipeline (fills, bypass).

pub(crate) mod client;
pub(crate) mod forward;
pub(crate) mod headers;
pub(crate) mod timing;
pub(crate) mod upload;
