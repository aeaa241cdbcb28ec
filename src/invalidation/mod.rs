//! Invalidation: how caches learn of changes. `event` is the model every
//! source shares (`{route, params, kind, revision?}`, validated against the
//! live route table; invalid events are poison and get dead-lettered).
//! Sources: `POST /admin/invalidate` (admin), and, as they land, the
//! Postgres outbox worker, the Redis Stream consumer and write-through.

pub mod event;

pub use event::{Event, EventKind, Poison, Validated};
