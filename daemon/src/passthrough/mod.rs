//! The passthrough filesystem: serves a host directory.
