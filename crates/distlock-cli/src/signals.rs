//! SIGINT, SIGTERM, SIGHUP and SIGQUIT for `run` and `elect`, handled from
//! before the wait until the command exits: a signal during the wait
//! cancels it, one while the command runs is forwarded to the command (in
//! a process group of its own, it gets no terminal's signals directly: a
//! closed terminal must not leave it running unprotected after distlock
//! went).

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::fail;

/// The longest distlock stays after a signal cancelled its wait, for the
/// cleanup that the cancellation started to reach the servers.
const CLEANUP_GRACE: Duration = Duration::from_secs(5);

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught: while this lives none
/// ends distlock by its default action.
#[derive(Debug)]
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    /// Catches the four from now on; exit code 1 if it cannot.
    pub(crate) fn install() -> Result<Self, ExitCode> {
        let installed = (|| {
            Ok::<_, std::io::Error>(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
                hangup: signal(SignalKind::hangup())?,
                quit: signal(SignalKind::quit())?,
            })
        })();
        installed.map_err(|e| fail(1, format!("cannot install signal handlers: {e}")))
    }

    /// Runs `wait` (connecting and waiting for `what`) unless a signal
    /// comes first: then `wait` is dropped, and with it its client, which
    /// starts the cleanup that [`interrupted`] waits for before the exit
    /// code it answers.
    pub(crate) async fn unless_interrupted<T>(
        &mut self,
        what: &str,
        wait: impl std::future::Future<Output = Result<T, ExitCode>>,
    ) -> Result<T, ExitCode> {
        let sig = tokio::select! {
            done = wait => return done,
            sig = self.recv() => sig,
        };
        Err(interrupted(sig, what, self).await)
    }

    /// The next signal caught.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

/// Ends distlock after `sig` cancelled the wait for `what`, whose futures
/// (and the client) are dropped by now: exit code 128 + the signal's number,
/// as a shell reports a command the signal killed.
///
/// Dropping a wait leaves its cleanup (core's release of a request that was
/// queued or perhaps granted, a backend leaving its wait queue) to tasks of
/// the runtime, and the runtime drops every task when `main` returns:
/// without this pause the waiter's entry stays on the server until its
/// lease or session ends, and holds up the waiters queued behind it. So it
/// waits until no task is left, for at most [`CLEANUP_GRACE`] or until
/// another signal. A subscription that lingers after its last waiter (2 s
/// on Redis, Redlock and PostgreSQL) is a task too, and keeps distlock that
/// long.
pub(crate) async fn interrupted(sig: Signal, what: &str, signals: &mut Signals) -> ExitCode {
    let metrics = tokio::runtime::Handle::current().metrics();
    let start = Instant::now();
    let settled = async {
        while metrics.num_alive_tasks() > 0 && start.elapsed() < CLEANUP_GRACE {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        () = settled => {}
        again = signals.recv() => tracing::debug!(signal = %again, "not waiting for the cleanup any longer"),
    }
    let left = metrics.num_alive_tasks();
    if left > 0 {
        tracing::warn!(
            tasks = left,
            "the cleanup of the cancelled wait may not have finished; what it leaves on the server ends with its lease or session"
        );
    } else {
        tracing::debug!(took = ?start.elapsed(), "the cleanup of the cancelled wait finished");
    }
    fail(
        u8::try_from(128 + sig as i32).unwrap_or(255),
        format!("{sig} while waiting for {what}; nothing is held"),
    )
}
