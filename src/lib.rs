//! sncl: collective communication for supernode training clusters.
