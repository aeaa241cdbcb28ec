//! PLACEHOLDER (helper A replaces): the client-facing server.
