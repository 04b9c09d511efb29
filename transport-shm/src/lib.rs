//! Host shared-memory transport.
