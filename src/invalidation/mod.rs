//! Invalidation: how caches learn of changes (SPEC §7).
//!
//! - [`event`]: the model every source shares (`{route, params, kind,
//!   revision?}`, validated against the live route table; invalid events
//!   are poison and get dead-lettered, never retried).
//! - [`apply`]: validates a batch against the current config and applies
//!   the valid events to the store in one call, with a per-event outcome.
//! - [`ddl`]: the SQL of `sidecache outbox-ddl`.
//! - [`outbox`]: the Postgres outbox worker (claim with `SKIP LOCKED`,
//!   apply, delete in the same transaction; LISTEN/NOTIFY wake-ups).
//! - [`stream`]: the Redis Stream consumer (consumer group, ack after apply,
//!   claim from dead consumers, dead-letter stream).
//!
//! Other sources: `POST /admin/invalidate` (admin) and write-through
//! (pipeline). Delivery is at least once everywhere: applying an event
//! twice is harmless because a generation is replaced, never incremented.

pub mod apply;
pub mod backoff;
pub mod ddl;
pub mod event;
pub mod outbox;
pub mod stream;

pub use apply::{Applier, ApplyOutcome, CreateHook, Source};
pub use event::{Event, EventKind, Poison, Validated};
