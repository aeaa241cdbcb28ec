//! What a store backend is: [`Store`], the union of the capabilities a
//! backend implements, each a trait of its own file ([`ObjectStore`],
//! [`FeedStore`], [`TagStore`], [`BloomStore`]), and what the guard needs
//! to know of the backend itself.
//!
//! Adding a backend: a folder beside `redis/` and `memory/` whose type
//! implements [`ObjectStore`] and [`FeedStore`] (required), [`TagStore`] and
//! [`BloomStore`] (optional: their defaults fail every call) and [`Store`],
//! and an arm of [`super::open`]'s `match` that builds it.

use super::bloom::BloomStore;
use super::feeds::FeedStore;
use super::object::ObjectStore;
use super::slot_map::SlotMap;
use super::tags::TagStore;
use std::sync::Arc;

/// A store backend: every capability, and what the guard needs to know
/// of the backend itself. Object-safe: [`super::GuardedStore`] holds an
/// `Arc<dyn Store>`.
pub trait Store: ObjectStore + FeedStore + TagStore + BloomStore + Send + Sync + 'static {
    /// Backend name for logs: `redis`, `redis-cluster`, `memory`.
    fn kind(&self) -> &'static str;

    /// Redis Cluster: which master serves which slot, kept current by the
    /// backend; the guard keeps one breaker per master with it.
    fn slot_map(&self) -> Option<Arc<SlotMap>> {
        None
    }
}
