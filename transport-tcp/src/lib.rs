//! TCP transport.
