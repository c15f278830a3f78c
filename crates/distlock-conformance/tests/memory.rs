//! The conformance suite on the in-memory reference backend, through this
//! crate's public API alone, as a third-party backend's test file would
//! use it. Besides proving the reference, `memory::suite_catches_*` trials
//! run cases against deliberately broken backends to show the suite can
//! fail.

use std::sync::Arc;

use distlock_conformance::{async_trait, run_suite, BackendFactory, Failed};
use distlock_core::{DynBackend, LockName, MemoryBackend};

#[derive(Default)]
struct Memory(MemoryBackend);

#[async_trait]
impl BackendFactory for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    async fn client(&self) -> distlock_core::Result<DynBackend> {
        Ok(Arc::new(self.0.clone()))
    }
    async fn evict(&self, name: &LockName) -> Result<(), Failed> {
        self.0.evict(name);
        Ok(())
    }
}

fn main() {
    run_suite(
        Arc::new(Memory::default()),
        distlock_conformance::self_check::trials,
    )
}
