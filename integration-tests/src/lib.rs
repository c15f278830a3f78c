//! distlock's own test harness: real servers started as local processes,
//! this repository's backend factories, and the fault suite. The
//! conformance cases and their runner live in `distlock-conformance`,
//! re-exported here.
//!
//! - [`harness`]: starts real servers (redis-server, etcd, ZooKeeper,
//!   PostgreSQL, MariaDB) as local processes on loopback ports, or connects to
//!   servers named by `DISTLOCK_TEST_*` environment variables, or (feature
//!   `containers`) runs them in Docker.
//! - [`factory`]: a [`BackendFactory`] for every backend on a harness server.
//! - [`faults`], [`queue`]: the fault suite's runs and the queue backends'
//!   own cases; [`stall`]: cases on a server that stops answering.
//!
//! A backend's test file is one factory and one call to [`run_suite`]; see
//! `crates/distlock-conformance/tests/memory.rs`.

pub use distlock_conformance::*;

pub mod factory;
pub mod faults;
pub mod fifo;
pub mod harness;
pub mod queue;
pub mod stall;

/// Runs `f`, which blocks (starting or stopping a server process), on
/// tokio's blocking pool, so that the test's runtime keeps serving the
/// clients meanwhile.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, libtest_mimic::Failed> + Send + 'static,
) -> Result<T, libtest_mimic::Failed> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| libtest_mimic::Failed::from(e.to_string()))?
}
