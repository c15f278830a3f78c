//! Where the databases' waiters are woken from; the loop is core's
//! [`wait_for_grant`](distlock_core::wait::wait_for_grant).

#[cfg(feature = "postgres")]
pub(crate) use postgres::Listened;

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use distlock_core::wait::{Signal, Signalled, Wakeup, Wakeups};
    use distlock_core::Result;

    use crate::postgres::{Listening, Pg};

    /// Woken by PostgreSQL's notifications. The LISTEN connection is
    /// started (or joined) only once an attempt is refused, so an
    /// uncontended acquire costs one statement.
    pub(crate) struct Listened<'a> {
        pg: &'a Pg,
        listening: Option<Arc<Listening>>,
        signalled: Signalled,
    }

    impl<'a> Listened<'a> {
        pub(crate) fn new(pg: &'a Pg, signal: Signal) -> Self {
            Self {
                pg,
                listening: None,
                signalled: Signalled::new(signal),
            }
        }
    }

    impl Wakeups for Listened<'_> {
        fn arm(&mut self) -> Option<Wakeup> {
            self.listening.as_ref()?;
            self.signalled.arm()
        }

        async fn prepare(&mut self) -> Result<()> {
            if self.listening.is_none() {
                self.listening = Some(self.pg.listen().await?);
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
