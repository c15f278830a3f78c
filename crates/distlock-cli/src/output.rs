//! Standard output, written by every command through one function so that
//! a reader that goes away (`distlock list | head -1`) ends the command
//! quietly instead of panicking as `println!` does; standard error likewise,
//! where a message that cannot be written is dropped.

use std::fmt::Display;
use std::io::Write;
use std::process::ExitCode;

use crate::fail;

/// Exit code when the reader of standard output went away: 128 + SIGPIPE,
/// what a shell reports for a program that SIGPIPE ended (Rust ignores
/// SIGPIPE, so the write fails instead).
pub(crate) const EXIT_PIPE_CLOSED: u8 = 141;

/// Writes `text` and a newline to standard output, flushed. When it cannot,
/// the exit code to end with: [`EXIT_PIPE_CLOSED`], without a message, if
/// the reader went away; 1, with a message, for any other failure.
pub(crate) fn line(text: impl Display) -> Result<(), ExitCode> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => ExitCode::from(EXIT_PIPE_CLOSED),
            _ => fail(1, format!("cannot write to standard output: {e}")),
        })
}

/// Writes `text` and a newline to standard error. A message nobody can read
/// any more is dropped: the exit code still tells what happened.
pub(crate) fn note(text: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Resolves when the reader of standard output goes away (a pipe whose
/// reading end closed: `distlock observe NAME | head -1` once `head` has
/// its line), so that a command that prints only now and then ends at once,
/// not at its next line. Never resolves while standard output is not a
/// pipe, or cannot be watched.
pub(crate) async fn reader_gone() {
    let (gone, watched) = tokio::sync::oneshot::channel::<()>();
    // A thread of its own, not a blocking task: it sleeps in `poll` for as
    // long as the reader lasts, and the process's exit ends it.
    std::thread::spawn(move || {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let stdout = std::io::stdout();
        loop {
            // No event asked for: `poll` reports only an error (the pipe's
            // reader closed) or a hang-up (the terminal went away).
            let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => {}
                Ok(_)
                    if fds[0]
                        .revents()
                        .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)) =>
                {
                    let _ = gone.send(());
                    return;
                }
                _ => return,
            }
        }
    });
    if watched.await.is_err() {
        std::future::pending::<()>().await;
    }
}
