//! Server harness.
