//! Forwarding: the client-facing hyper server (`server`), hop-by-hop and
//! framing rules (`headers`, plus the connection-level `framing` guard),
//! streaming pass-through (`forward`), the pooled upstream client (`client`)
//! and the shared body type (`body`).

pub mod body;
pub mod client;
pub mod forward;
pub mod framing;
pub mod headers;
pub mod server;
