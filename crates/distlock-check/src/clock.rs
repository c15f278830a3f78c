//! One clock for every process: the kernel's `CLOCK_MONOTONIC`, which all
//! processes on a Linux machine share (unlike `std::time::Instant`, whose
//! values cannot leave the process).

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on the machine-wide monotonic clock.
pub fn mono_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}
