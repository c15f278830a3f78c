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

use std::sync::Arc;

/// The conformance trials for `factory` (see [`distlock_conformance::trials`])
/// and [`declares_every_kind`]'s.
pub fn trials(factory: Arc<dyn BackendFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    let mut all = distlock_conformance::trials(factory.clone(), rt);
    all.push(declares_every_kind(factory, rt));
    all
}

/// [`distlock_conformance::run_suite`] with [`declares_every_kind`]'s trial.
pub fn run_suite(
    factory: Arc<dyn BackendFactory>,
    extra: impl FnOnce(&tokio::runtime::Runtime) -> Vec<Trial>,
) -> ! {
    let check = factory.clone();
    distlock_conformance::run_suite(factory, move |rt| {
        let mut all = vec![declares_every_kind(check, rt)];
        all.extend(extra(rt));
        all
    })
}

/// `<backend>::declares_every_kind`: every backend of this repository
/// grants semaphores, shared holds and elections and renews. A case whose
/// kind its backend does not declare is reported ignored, so a declaration
/// dropped by mistake fails here instead of ignoring that kind's cases.
fn declares_every_kind(factory: Arc<dyn BackendFactory>, rt: &tokio::runtime::Runtime) -> Trial {
    let handle = rt.handle().clone();
    Trial::test(
        format!("{}::declares_every_kind", factory.name()),
        move || {
            let caps = handle.block_on(factory.client())?.capabilities();
            let missing: Vec<&str> = [
                ("semaphores", caps.semaphore),
                ("shared holds", caps.shared),
                ("elections", caps.elections),
                ("renewal", caps.extend),
            ]
            .into_iter()
            .filter(|(_, declared)| !declared)
            .map(|(what, _)| what)
            .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(Failed::from(format!(
                    "{} does not declare {missing:?}",
                    caps.backend
                )))
            }
        },
    )
}

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
