//! Where the databases' waiters are woken from; the loop is core's
//! [`wait_for_grant`](distlock_core::wait::wait_for_grant).

#[cfg(feature = "postgres")]
pub(crate) use postgres::Listened;

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use distlock_core::wait::{Signal, Signalled, Wakeup, Wakeups};
    use distlock_core::Result;

    use crate::postgres::{Listener, Listening, Pg};

    /// Woken by PostgreSQL's notifications. The LISTEN connection is
    /// started (or joined) only once an attempt is refused, so an
    /// uncontended acquire costs one statement.
    pub(crate) struct Listened<'a> {
        pg: &'a Pg,
        listening: Option<Arc<Listening>>,
        signalled: Signalled,
        /// Where the listening connection lingers, even if dropped outside
        /// a runtime.
        spawner: distlock_core::completion::Spawner,
    }

    impl<'a> Listened<'a> {
        pub(crate) fn new(pg: &'a Pg, signal: Signal) -> Self {
            Self {
                pg,
                listening: None,
                signalled: Signalled::new(signal),
                spawner: distlock_core::completion::Spawner::here(),
            }
        }
    }

    /// How long the LISTEN connection outlives its last waiter: a client
    /// that waits again soon (a queue's waiters take turns) neither
    /// listens again nor asks once more after listening.
    const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

    impl Drop for Listened<'_> {
        fn drop(&mut self) {
            if let Some(l) = self.listening.take() {
                let ended = self.pg.lifetime.ended();
                self.spawner.spawn(async move {
                    distlock_core::completion::linger(LINGER, ended).await;
                    drop(l);
                });
            }
        }
    }

    impl Wakeups for Listened<'_> {
        fn arm(&mut self) -> Option<Wakeup> {
            self.listening.as_ref()?;
            self.signalled.arm()
        }

        async fn ready(&mut self) -> Result<bool> {
            self.listening = self.pg.listening(Listener::Waiters);
            Ok(self.listening.is_some())
        }

        async fn prepare(&mut self) -> Result<()> {
            if self.listening.is_none() {
                self.listening = Some(self.pg.listen(Listener::Waiters).await?);
            }
            Ok(())
        }

        fn woken(&mut self) {
            self.signalled.woken();
        }

        fn answered(&mut self) {
            self.signalled.answered();
        }
    }
}
