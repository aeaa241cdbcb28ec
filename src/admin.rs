//! PLACEHOLDER (helper A replaces): admin listener.
