//! The Bloom filter (SPEC §6): per route and scope value, a bitmap in the
//! store that lets stage 4 of the read pipeline reject ids that certainly
//! do not exist, without ever rejecting a real object.
pub mod hash;
pub mod sizing;
