//! The signals whose default action ends or stops distlock, for `run` and
//! `elect`, handled from before the wait until the command exits. SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM during the wait
//! cancel it, and while the command runs are forwarded to the command (in
//! a process group of its own, it gets no terminal's signals directly: a
//! closed terminal must not leave it running unprotected after distlock
//! went). SIGTSTP (Ctrl-Z) stops the command's group before distlock
//! stops itself, so the command never runs while nothing renews its lease;
//! see [`Signals::suspend`].

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::fail;

/// The longest distlock stays after a signal cancelled its wait, for the
/// cleanup that the cancellation started to reach the servers.
const CLEANUP_GRACE: Duration = Duration::from_secs(5);

/// The signals of the module's description, caught: while this lives none
/// ends or stops distlock by its default action.
#[derive(Debug)]
pub(crate) struct Signals {
    /// Each signal and its stream, in the order `recv` looks at them.
    caught: Vec<(Signal, tokio::signal::unix::Signal)>,
    /// SIGCONT: distlock was continued after [`Signals::suspend`].
    continued: tokio::signal::unix::Signal,
}

/// The signals that end distlock by default, caught and forwarded.
const FORWARDED: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
];

impl Signals {
    /// Catches them from now on; exit code 1 if it cannot.
    pub(crate) fn install() -> Result<Self, ExitCode> {
        let installed = (|| {
            let mut caught = Vec::new();
            for sig in FORWARDED.into_iter().chain([Signal::SIGTSTP]) {
                caught.push((sig, signal(SignalKind::from_raw(sig as i32))?));
            }
            Ok::<_, std::io::Error>(Self {
                caught,
                continued: signal(SignalKind::from_raw(Signal::SIGCONT as i32))?,
            })
        })();
        installed.map_err(|e| fail(1, format!("cannot install signal handlers: {e}")))
    }

    /// Stops distlock as Ctrl-Z would have (its SIGTSTP is caught, so it
    /// does not stop by itself), after `before` (stopping the command's
    /// group), and returns once it was continued (the shell's `fg` or
    /// `bg`, SIGCONT).
    pub(crate) async fn suspend(&mut self, before: impl FnOnce()) {
        before();
        // A SIGCONT from before this stop is not the one that ends it.
        while let Some(Some(())) = futures_util::FutureExt::now_or_never(self.continued.recv()) {}
        if nix::sys::signal::raise(Signal::SIGSTOP).is_err() {
            return;
        }
        // SIGSTOP takes effect before `raise` returns; the SIGCONT that
        // ended it is pending by now, or arrives at once.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.continued.recv()).await;
    }

    /// Runs `wait` (connecting and waiting for `what`) unless a signal
    /// comes first: then `wait` is dropped, and with it its client, which
    /// starts the cleanup that [`interrupted`] waits for before the exit
    /// code it answers. A wait that fails (it timed out, say) is followed
    /// by the same cleanup: a request still on its way when the wait gave
    /// up is released once it lands, if the process still runs.
    pub(crate) async fn unless_interrupted<T>(
        &mut self,
        what: &str,
        wait: impl std::future::Future<Output = Result<T, ExitCode>>,
    ) -> Result<T, ExitCode> {
        let mut wait = Box::pin(wait);
        let sig = loop {
            let sig = tokio::select! {
                done = &mut wait => {
                    if done.is_err() {
                        drop(wait);
                        self.cleanup_finished().await;
                    }
                    return done;
                }
                sig = self.recv() => sig,
            };
            if sig != Signal::SIGTSTP {
                break sig;
            }
            // Nothing runs under the lock yet: stop, and go on waiting.
            self.suspend(|| {}).await;
        };
        // Dropped first: that starts the cleanup `interrupted` waits for.
        drop(wait);
        Err(interrupted(sig, what, self).await)
    }

    /// Waits until the runtime has no task left (the cleanup of a wait
    /// that ended without a hold), for at most [`CLEANUP_GRACE`] or until
    /// another signal.
    async fn cleanup_finished(&mut self) {
        let metrics = tokio::runtime::Handle::current().metrics();
        let start = Instant::now();
        let settled = async {
            while metrics.num_alive_tasks() > 0 && start.elapsed() < CLEANUP_GRACE {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        // Another signal ends the wait for the cleanup; Ctrl-Z does not.
        let again = async {
            loop {
                let sig = self.recv().await;
                if sig != Signal::SIGTSTP {
                    return sig;
                }
            }
        };
        tokio::select! {
            () = settled => {}
            again = again => tracing::debug!(signal = %again, "not waiting for the cleanup any longer"),
        }
        let left = metrics.num_alive_tasks();
        if left > 0 {
            tracing::warn!(
                tasks = left,
                "the cleanup of the ended wait may not have finished; what it leaves on the server ends with its lease or session"
            );
        } else {
            tracing::debug!(took = ?start.elapsed(), "the cleanup of the ended wait finished");
        }
    }

    /// The next signal caught.
    pub(crate) async fn recv(&mut self) -> Signal {
        let next = self
            .caught
            .iter_mut()
            .map(|(sig, stream)| {
                let sig = *sig;
                Box::pin(async move {
                    stream.recv().await;
                    sig
                })
            })
            .collect::<Vec<_>>();
        futures_util::future::select_all(next).await.0
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
/// another signal. A subscription that lingers after its last waiter (on
/// Redis, Redlock and PostgreSQL) ends with the client, dropped by now.
pub(crate) async fn interrupted(sig: Signal, what: &str, signals: &mut Signals) -> ExitCode {
    signals.cleanup_finished().await;
    fail(
        u8::try_from(128 + sig as i32).unwrap_or(255),
        format!("{sig} while waiting for {what}; nothing is held"),
    )
}
