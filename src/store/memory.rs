//! PLACEHOLDER (helper B replaces).
