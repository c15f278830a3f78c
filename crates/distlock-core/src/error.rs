//! The one public error type.

use std::fmt;
use std::time::Duration;

use crate::name::LockName;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which piece of input was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputKind {
    /// A lock name (see [`LockName`]).
    LockName,
    /// A TTL, wait or hold duration.
    Duration,
    /// A backend URL.
    Url,
    /// Any other configuration value.
    Config,
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputKind::LockName => "name",
            InputKind::Duration => "duration",
            InputKind::Url => "backend URL",
            InputKind::Config => "configuration",
        })
    }
}

/// Why a lock may no longer be held.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend answered a renewal with "not yours any more": the lease
    /// expired and may have been granted to someone else, or an operator
    /// removed it.
    RenewalRejected,
    /// Renewals kept failing (the error is the last one) until the local
    /// deadline passed.
    RenewalFailed(String),
    /// Renewal was off and the local deadline passed.
    DeadlinePassed,
    /// Renewal was on, but the local deadline passed before a renewal due
    /// earlier ran: the process or its runtime stalled (a paused process, a
    /// thread blocked in a task).
    Stalled,
    /// The configured maximum hold time was reached.
    MaxHoldReached,
    /// The session or lease behind the lock ended (an etcd lease, a
    /// ZooKeeper session).
    SessionLost(String),
    /// Another lock taken with this one (a multi-lock) may be lost, so this
    /// one was released with it.
    WithOther(LockName),
    /// The release that ended the hold found it no longer ours: the lease
    /// expired or was taken away after the last renewal, so the work done
    /// under it (by `run`) may not have been protected to the end.
    ReleaseRejected,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::RenewalRejected => {
                f.write_str("the backend rejected a renewal (the lease had expired or was taken)")
            }
            LostReason::RenewalFailed(e) => {
                write!(
                    f,
                    "renewals failed until the lease deadline passed; last error: {e}"
                )
            }
            LostReason::DeadlinePassed => f.write_str("the lease deadline passed without renewal"),
            LostReason::Stalled => f.write_str(
                "the lease deadline passed before its due renewal ran (the process or its runtime stalled)",
            ),
            LostReason::MaxHoldReached => f.write_str("the maximum hold time was reached"),
            LostReason::SessionLost(why) => write!(f, "the backend session ended: {why}"),
            LostReason::WithOther(name) => write!(
                f,
                "`{name}`, taken with it, may be lost, so it was released too"
            ),
            LostReason::ReleaseRejected => f.write_str(
                "the release found the lock no longer held (it expired or was taken after the last renewal)",
            ),
        }
    }
}

/// Every error distlock returns.
///
/// The variants are semantic, so callers can branch on what happened rather
/// than on which backend said it. Messages end with what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait ran out before what it waited for (the lock, a permit of
    /// the semaphore or the election's leadership) was granted: others
    /// kept it, or the backend answered too late or not at all.
    #[error("gave up on `{name}` after waiting {waited:?}: not granted in time (others kept it, or the backend did not answer in time); wait longer, or find out who holds it and whether the backend answers")]
    WaitTimeout {
        /// The lock.
        name: LockName,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock may no longer be held; stop touching the protected resource.
    #[error("lock `{name}` may no longer be held: {reason}; stop using the protected resource and acquire again")]
    LeaseLost {
        /// The lock.
        name: LockName,
        /// Why.
        reason: LostReason,
    },

    /// The backend could not be reached or is not serving; retrying later may work.
    #[error("{backend} unavailable: {message}; retrying later may succeed")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// What went wrong, with the address involved.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// A quorum backend could not get a majority of its nodes.
    #[error("{backend}: quorum not reached, {granted} of {total} nodes granted and {needed} were needed ({unreachable} unreachable); {hint}")]
    QuorumNotReached {
        /// Which backend.
        backend: &'static str,
        /// Nodes that granted the request.
        granted: usize,
        /// Nodes that could not be reached in time.
        unreachable: usize,
        /// Majority size.
        needed: usize,
        /// Number of nodes.
        total: usize,
        /// What to do next.
        hint: &'static str,
    },

    /// Input was rejected before anything was sent.
    #[error("invalid {kind}: {message}")]
    InvalidInput {
        /// Which input.
        kind: InputKind,
        /// What is wrong and what is accepted.
        message: String,
    },

    /// The backend answered, and refused how it was asked: wrong
    /// credentials, a database that does not exist, a path that cannot hold
    /// the lock table. Retrying the same configuration cannot succeed.
    #[error("{backend} refused the configuration: {message}")]
    Misconfigured {
        /// Which backend.
        backend: &'static str,
        /// What was refused and what to change.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// A semaphore was asked for with another limit than the one stored
    /// with it. Nothing was acquired; change the limit deliberately with
    /// `set_limit`, or ask for the stored one.
    #[error("semaphore `{name}` has the stored limit {stored}, and this request asked for {requested}; ask for {stored}, or change the limit with set_limit")]
    LimitMismatch {
        /// The semaphore.
        name: LockName,
        /// The limit the request asked for.
        requested: u32,
        /// The limit stored with the semaphore.
        stored: u32,
    },

    /// A holder that holds a read-write lock shared asked for it
    /// exclusively. Refused: two readers upgrading at once would each wait
    /// for the other forever. Release the shared hold, then acquire
    /// exclusively. Nothing was acquired; the shared hold is still held.
    #[error("holder `{holder}` holds lock `{name}` shared and asked for it exclusively; an upgrade can deadlock, so release the shared hold first")]
    UpgradeRefused {
        /// The lock.
        name: LockName,
        /// The holder that asked.
        holder: String,
    },

    /// The backend cannot do this.
    #[error("{backend} does not support {operation}")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
    },

    /// Any other backend failure, with its source.
    #[error("{backend} error: {source}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether trying the same operation again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::WaitTimeout { .. } | Error::Unavailable { .. } | Error::QuorumNotReached { .. }
        )
    }

    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(kind: InputKind, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            kind,
            message: message.into(),
        }
    }

    /// A copy of a stored [`Error::InvalidInput`] (a builder keeps its
    /// name's error until acquired, and may be asked more than once); any
    /// other error, which a name check never makes, is kept as its text.
    pub(crate) fn input_again(&self) -> Self {
        match self {
            Error::InvalidInput { kind, message } => Error::invalid(*kind, message.clone()),
            other => Error::invalid(InputKind::LockName, other.to_string()),
        }
    }

    /// Shorthand for [`Error::Backend`].
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::Misconfigured`].
    pub fn misconfigured(
        backend: &'static str,
        message: impl Into<String>,
        source: Option<BoxError>,
    ) -> Self {
        Error::Misconfigured {
            backend,
            message: message.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Unavailable`].
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: Option<BoxError>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source,
        }
    }
}

/// What a TLS handshake refused, if `e` (or an error it wraps) says a
/// certificate check failed: an unknown CA, a certificate for another host
/// name, an expired certificate. Such a failure repeats on every retry, so
/// backends report it as [`Error::Misconfigured`] rather than
/// [`Error::Unavailable`].
///
/// Client libraries wrap the TLS library's error in their own (often inside
/// an `std::io::Error`, whose `source` skips it, or only as text), so this
/// reads the text of every error in the chain for rustls's wording: a
/// refused or unparsable certificate, an alert from the server (it refused
/// ours), TLS spoken to a plain port.
pub fn tls_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    const MARKS: &[&str] = &[
        "certificate",
        "unknownissuer",
        "received fatal alert",
        "peer is incompatible",
        "received corrupt message",
    ];
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        let lower = text.to_ascii_lowercase();
        if MARKS.iter().any(|m| lower.contains(m)) {
            return Some(text);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(std::io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("transport error")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_certificate_failure_anywhere_in_the_chain_is_a_tls_refusal() {
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let e = Wrapper(inner);
        assert_eq!(
            tls_refusal(&e).as_deref(),
            Some("invalid peer certificate: UnknownIssuer")
        );
        let refused = Wrapper(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_refusal(&refused), None);
    }
}
