//! The safety workload behind `distlock check` and distlock's fault suite.
//!
//! K lock clients run as separate OS processes (so that one can really be
//! paused with SIGSTOP). Each loops: acquire the lock, read-modify-write a
//! shared [fenced register](register), release. The register logs every
//! operation and every hold on one machine-wide monotonic clock, and the
//! [checker](report::check) reports overlapping holds, stale writes the
//! register accepted (with and without token checks), lost updates, tokens
//! out of grant order and the time to recover from a fault.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_check::CheckError> {
//! let mut w = distlock_check::Workload::new("sqlite:///tmp/locks.db", 4)?;
//! w.ttl = std::time::Duration::from_secs(1);
//! let report = distlock_check::run(&w, |faults| async move {
//!     // SIGSTOP a holder mid-write for three TTLs, then resume it.
//!     faults.pause_holder(0, faults.ttl() * 3).await
//! })
//! .await?;
//! println!("{report}");
//! assert_eq!(report.fenced.stale_accepted, 0);
//! # Ok(()) }
//! ```
//!
//! The binary that calls [`run`] must call [`worker_main_if_requested`]
//! first thing in `main`: workers are that same binary, re-executed.

mod clock;
pub mod register;
pub mod report;
mod run;
mod worker;

pub use clock::mono_ns;
pub use register::Instruction;
pub use report::{CellStats, Report};
pub use run::{run, CheckError, Faults, Workload};
pub use worker::{worker_main_if_requested, ENV_WORKER};
