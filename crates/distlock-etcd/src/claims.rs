//! Keys of this backend's leases that a live lock or campaign request has
//! put, or is putting.
//!
//! Go's layout names a lock's key after its lease (`<name>/<lease hex>`),
//! and clones of one backend share their leases, so two requests of one
//! name from two `LockClient`s over one backend would share a key: each
//! would take the other's for its own or for a leftover. A request claims
//! its key here first; a second one waits for the claim (a try is refused),
//! so a key of this lease that a request finds without its claim is a
//! leftover indeed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use distlock_core::wait::WaitClock;
use distlock_core::{Owner, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How a request waits for a claim another request holds.
#[derive(Clone, Copy)]
pub(crate) enum Claiming<'a> {
    /// Not at all: the key is taken.
    Try,
    /// Until the other request is gone, or the wait's deadline.
    Wait(&'a WaitClock),
}

#[derive(Default)]
pub(crate) struct Claims(Mutex<State>);

#[derive(Default)]
struct State {
    /// One permit per claimed key, while anyone holds or awaits it.
    keys: HashMap<String, Arc<Semaphore>>,
    /// Each claiming request's key and permit.
    held: HashMap<Owner, (String, OwnedSemaphorePermit)>,
}

impl Claims {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `key` for `owner` (a request that claimed it already keeps
    /// its claim). `Ok(false)`: another request holds it and `how` is a try.
    pub(crate) async fn claim(&self, key: &str, owner: Owner, how: Claiming<'_>) -> Result<bool> {
        let gate = {
            let mut s = self.state();
            if s.held.contains_key(&owner) {
                return Ok(true);
            }
            let gate = s
                .keys
                .entry(key.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(1)))
                .clone();
            if let Ok(permit) = gate.clone().try_acquire_owned() {
                s.held.insert(owner, (key.to_string(), permit));
                return Ok(true);
            }
            gate
        };
        let awaiting = Awaiting {
            claims: self,
            key,
            gate: Some(gate),
        };
        let waited = match (how, &awaiting.gate) {
            (Claiming::Wait(clock), Some(gate)) => {
                let gate = gate.clone();
                clock
                    .within(async move {
                        // The gate is never closed.
                        Ok(gate.acquire_owned().await.ok())
                    })
                    .await
            }
            _ => Ok(None),
        };
        drop(awaiting);
        match waited? {
            Some(permit) => {
                self.state().held.insert(owner, (key.to_string(), permit));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Ends `owner`'s claim, if it has one.
    pub(crate) fn unclaim(&self, owner: &Owner) {
        let mut s = self.state();
        if let Some((key, permit)) = s.held.remove(owner) {
            drop(permit);
            prune(&mut s, &key);
        }
    }

    fn prune(&self, key: &str) {
        prune(&mut self.state(), key);
    }
}

/// A request's share of a key's gate while it looks at it or waits for
/// it; letting go forgets the gate if nobody else holds or awaits it, also
/// when the wait is dropped half-way.
struct Awaiting<'a> {
    claims: &'a Claims,
    key: &'a str,
    gate: Option<Arc<Semaphore>>,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        drop(self.gate.take());
        self.claims.prune(self.key);
    }
}

/// Forgets `key`'s gate once nobody holds or awaits it.
fn prune(s: &mut State, key: &str) {
    if s.keys.get(key).is_some_and(|g| Arc::strong_count(g) == 1) {
        s.keys.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        distlock_core::LockRequest::new(
            distlock_core::LockName::new("x").unwrap(),
            std::time::Duration::from_secs(1),
        )
        .owner
    }

    #[tokio::test]
    async fn a_claimed_key_is_refused_to_a_try_and_awaited_by_a_wait() {
        let claims = Arc::new(Claims::default());
        let (a, b) = (owner(), owner());
        assert!(claims.claim("k", a, Claiming::Try).await.unwrap());
        assert!(claims.claim("k", a, Claiming::Try).await.unwrap());
        assert!(!claims.claim("k", b, Claiming::Try).await.unwrap());
        let name = distlock_core::LockName::new("x").unwrap();
        let clock = WaitClock::start(&name, None);
        let waiter = {
            let claims = claims.clone();
            tokio::spawn(async move { claims.claim("k", b, Claiming::Wait(&clock)).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        claims.unclaim(&a);
        assert!(waiter.await.unwrap().unwrap());
        claims.unclaim(&b);
        assert!(claims.state().keys.is_empty() && claims.state().held.is_empty());
    }

    /// A wait dropped after the claim it waited for was given up, before
    /// it could take it, leaves no gate behind.
    #[tokio::test]
    async fn a_wait_dropped_after_the_key_was_given_up_leaves_no_gate() {
        let claims = Arc::new(Claims::default());
        let (a, b) = (owner(), owner());
        assert!(claims.claim("k", a, Claiming::Try).await.unwrap());
        let waiter = {
            let claims = claims.clone();
            tokio::spawn(async move {
                let name = distlock_core::LockName::new("x").unwrap();
                let clock = WaitClock::start(&name, None);
                claims.claim("k", b, Claiming::Wait(&clock)).await
            })
        };
        tokio::task::yield_now().await;
        claims.unclaim(&a);
        waiter.abort();
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
        assert!(claims.state().keys.is_empty() && claims.state().held.is_empty());
    }
}
