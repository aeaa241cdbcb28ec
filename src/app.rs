//! PLACEHOLDER (helper A replaces): wiring.
