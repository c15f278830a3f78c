//! Per-name local state: the gate that coalesces a client's tasks, and the
//! holds reentrant acquires nest into.
//!
//! Above the keeper and the lease, below the guard and the client: a
//! [`Hold`] is a lease plus what a user's nested guards share (holder,
//! nest count, the slot it lives in).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{HoldKind, LockRequest};
use crate::error::{Error, Result};
use crate::keeper::Keeper;
use crate::lease::{lock, Lease, Renewal};
use crate::name::LockName;
use crate::token::FencingToken;

/// A name's holds on one object share a slot ([`HoldKind::object`]): a
/// lock and a semaphore of the same name are separate objects, and so are
/// their slots; a lock's exclusive and shared holds share its slot, and a
/// semaphore's permits share one slot whatever limit each request names
/// (a holder's permit is nested into after the limit changed, not taken
/// twice).
pub(crate) type SlotKey = (LockName, HoldKind);

/// The key of the slot for `name` and the object of `kind`.
fn slot_key(name: &LockName, kind: HoldKind) -> SlotKey {
    let object = match kind.object() {
        HoldKind::Permits { .. } => HoldKind::Permits { limit: 0 },
        other => other,
    };
    (name.clone(), object)
}

/// A lock slot's local permits: an exclusive hold takes them all, a shared
/// hold one, so the gate is a local read-write lock. Tokio's semaphore
/// serves waiters in arrival order, so a waiting exclusive request holds
/// back later shared ones here too.
const LOCK_GATE: u32 = 1 << 16;

/// How many of its slot's local permits a hold of `kind` takes.
pub(crate) fn local_share(kind: HoldKind) -> u32 {
    match kind {
        HoldKind::Exclusive | HoldKind::Leader => LOCK_GATE,
        _ => 1,
    }
}

/// A client's slots, by name and kind.
pub(crate) type SlotTable = Mutex<HashMap<SlotKey, Arc<Slot>>>;

/// Local state for one name and object inside one client.
pub(crate) struct Slot {
    /// Local permits ([`local_share`] of them per hold: N for a semaphore
    /// of N, one each; a lock's exclusive hold takes all): whoever has its
    /// share may talk to the backend about this name (and keeps it for the
    /// whole hold), so other local tasks wait here instead of adding load
    /// on the server, and one client never puts more waiters on the server
    /// than there are holds it could get. Tokio's semaphore is FIFO, so
    /// local waiters are served in arrival order.
    pub(crate) gate: Arc<Semaphore>,
    /// How many local permits the gate has in all (held and free): a
    /// semaphore's gate follows its limit ([`Slot::widen_gate`],
    /// [`Slot::fit_gate`]).
    gate_size: Mutex<u32>,
    /// The holds of this slot, for reentrant acquires; ended ones are
    /// skipped and pruned.
    held: Mutex<Vec<Weak<Hold>>>,
    /// The holders with an acquire under way here (past the nesting check,
    /// not yet holding): a second acquire of the same holder waits for the
    /// first to end, then nests in its hold or, if it got none, takes its
    /// place. Without it two acquires of one holder started together would
    /// take two permits of a semaphore, or two shared holds.
    claims: Mutex<Vec<String>>,
    /// Told when a hold is added or a claim ends.
    pub(crate) changed: Notify,
}

/// A holder's acquire under way in a slot ([`Slot::claim`]); dropped once
/// its hold is in the slot or the acquire ended without one.
pub(crate) struct Claim {
    slot: Arc<Slot>,
    holder: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = lock(&self.slot.claims);
        if let Some(i) = claims.iter().position(|h| *h == self.holder) {
            claims.swap_remove(i);
        }
        drop(claims);
        self.slot.changed.notify_waiters();
    }
}

/// A reference to a [`Slot`] that removes the slot from its table when the
/// last user is gone.
pub(crate) struct SlotRef {
    table: Arc<SlotTable>,
    key: SlotKey,
    /// `None` only inside `drop`.
    slot: Option<Arc<Slot>>,
}

impl SlotRef {
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        self.slot
            .as_ref()
            .expect("a slot reference holds its slot until dropped")
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut slots = lock(&self.table);
        // Let go under the table's mutex, where new references are made: of
        // two last references dropped at once, the second sees the table's
        // alone.
        drop(self.slot.take());
        if slots
            .get(&self.key)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

/// The slot for `name` and the object of `kind`, made on first use.
pub(crate) fn slot_ref(table: &Arc<SlotTable>, name: &LockName, kind: HoldKind) -> SlotRef {
    let key = slot_key(name, kind);
    let permits = match kind.object() {
        HoldKind::Permits { limit } => limit,
        _ => LOCK_GATE,
    };
    let slot = lock(table)
        .entry(key.clone())
        .or_insert_with(|| {
            Arc::new(Slot {
                gate: Arc::new(Semaphore::new(permits as usize)),
                gate_size: Mutex::new(permits),
                held: Mutex::new(Vec::new()),
                claims: Mutex::new(Vec::new()),
                changed: Notify::new(),
            })
        })
        .clone();
    SlotRef {
        table: table.clone(),
        key,
        slot: Some(slot),
    }
}

/// Fits the gate of the slot for `name` and the semaphore of `kind` to
/// `limit` ([`Slot::fit_gate`]), if some task of the client uses it; under
/// the table's lock, so no reference outlives the slot's last user.
pub(crate) fn fit_existing_gate(table: &SlotTable, name: &LockName, kind: HoldKind, limit: u32) {
    if let Some(slot) = lock(table).get(&slot_key(name, kind)) {
        slot.fit_gate(limit);
    }
}

impl Slot {
    /// Widens a semaphore's gate to `limit` local permits if it has fewer:
    /// a request that names a larger limit than the gate was made for is
    /// not held back by the gate. The server judges the limit; should it
    /// refuse this one, the gate shrinks again with the next grant.
    pub(crate) fn widen_gate(&self, limit: u32) {
        let mut size = lock(&self.gate_size);
        if limit > *size {
            self.gate.add_permits((limit - *size) as usize);
            *size = limit;
        }
    }

    /// Fits a semaphore's gate to `limit`, the limit the server has
    /// confirmed (it granted a permit of it, or set it): wider at once,
    /// narrower by as many of its free local permits as it can drop now
    /// (the rest with later grants, as permits held locally come back).
    pub(crate) fn fit_gate(&self, limit: u32) {
        let mut size = lock(&self.gate_size);
        if limit > *size {
            self.gate.add_permits((limit - *size) as usize);
            *size = limit;
        } else if limit < *size {
            let dropped = self.gate.forget_permits((*size - limit) as usize);
            *size -= dropped as u32;
        }
    }

    /// The live hold of `holder` in this slot, if any; one whose last guard
    /// is gone (its release is under way) does not count, nor one whose
    /// deadline has passed before the keeper could mark it lost (a task
    /// that blocked its thread past it).
    pub(crate) fn held_by(&self, holder: &str) -> Option<Arc<Hold>> {
        lock(&self.held)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|h| h.holder.as_deref() == Some(holder) && h.depth() > 0 && h.is_live())
    }

    fn add(&self, hold: &Arc<Hold>) {
        let mut held = lock(&self.held);
        held.retain(|h| h.upgrade().is_some_and(|h| h.lease.deadline().is_some()));
        held.push(Arc::downgrade(hold));
        drop(held);
        self.changed.notify_waiters();
    }

    /// Marks an acquire of `holder` under way here, unless one is already.
    pub(crate) fn claim(self: &Arc<Self>, holder: &str) -> Option<Claim> {
        let mut claims = lock(&self.claims);
        if claims.iter().any(|h| h == holder) {
            return None;
        }
        claims.push(holder.to_owned());
        Some(Claim {
            slot: self.clone(),
            holder: holder.to_owned(),
        })
    }
}

/// One backend-level acquisition, shared by all nested guards on it.
pub(crate) struct Hold {
    pub(crate) keeper: Arc<Keeper>,
    pub(crate) lease: Arc<Lease>,
    pub(crate) holder: Option<String>,
    nested: Mutex<usize>,
    /// The runtime it was acquired on: a guard dropped where none runs (a
    /// synchronous caller after `block_on` returned) releases there.
    pub(crate) runtime: crate::completion::Spawner,
    // Last: dropped after the lease, so the slot outlives its holds.
    _slot: SlotRef,
}

/// What an acquisition carries into [`Hold::start`].
pub(crate) struct Acquired {
    pub(crate) req: LockRequest,
    pub(crate) token: FencingToken,
    /// When the lease began at the earliest: the deadline counts from here.
    pub(crate) sent: Instant,
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<std::time::Duration>,
    pub(crate) holder: Option<String>,
}

impl Hold {
    /// Starts a hold for a grant: its lease, armed in the keeper, in its
    /// slot for reentrant acquires.
    pub(crate) fn start(
        keeper: Arc<Keeper>,
        slot: SlotRef,
        permit: OwnedSemaphorePermit,
        acquired: Acquired,
    ) -> Arc<Self> {
        let Acquired {
            req,
            token,
            sent,
            renew,
            max_hold,
            holder,
        } = acquired;
        let deadline = sent + keeper.caps.safe_validity(req.ttl);
        let renewal = Renewal::new(
            keeper.first_renewal(sent, req.ttl),
            renew && keeper.caps.extend,
        );
        let max_hold_until = max_hold.and_then(|m| sent.checked_add(m));
        let lease = Arc::new(Lease::new(
            req,
            token,
            deadline,
            renewal,
            max_hold_until,
            permit,
        ));
        let hold = Arc::new(Hold {
            keeper,
            lease,
            holder,
            nested: Mutex::new(1),
            runtime: crate::completion::Spawner::here(),
            _slot: slot,
        });
        hold._slot.slot().add(&hold);
        hold.keeper.start(&hold.lease);
        hold
    }

    /// A nested acquire by the same holder: one more level. `false` when
    /// its last guard went meanwhile (the release is under way), or it was
    /// lost or its deadline has passed since the holder's hold was found:
    /// the caller acquires anew, as if the hold had ended (it waits at the
    /// gate until the keeper marks it lost).
    pub(crate) fn nest(self: &Arc<Self>) -> bool {
        if !self.is_live() {
            return false;
        }
        let mut n = lock(&self.nested);
        if *n == 0 {
            return false;
        }
        *n += 1;
        tracing::debug!(lock = %self.lease.req.name, depth = *n, "nested acquire");
        true
    }

    /// Held, with its deadline still ahead.
    pub(crate) fn is_live(&self) -> bool {
        self.lease.deadline().is_some_and(|d| Instant::now() < d)
    }

    pub(crate) fn depth(&self) -> usize {
        *lock(&self.nested)
    }

    /// Drops one nesting level; true when it was the last.
    pub(crate) fn unnest(&self) -> bool {
        let mut n = lock(&self.nested);
        *n = n.saturating_sub(1);
        *n == 0
    }

    /// Ends the hold: stops its renewal, releases on the backend, lets the
    /// next local waiter in.
    pub(crate) async fn finish(&self) -> Result<bool> {
        let lease = &self.lease;
        // Past the lease's deadline the server has let it go whatever the
        // release answers: a release the network has not answered by then
        // no longer keeps the name from this client's other tasks. Its
        // answer (owner-checked: a late release is refused, not applied to
        // a later holder) is still awaited for one TTL more, so a release
        // that starts late, as from a holder paused past its deadline,
        // gets the server's word rather than a timeout.
        // A lease already lost, or released by a release cut short, has
        // its last deadline still: the wait is bounded all the same.
        let deadline = lease.last_deadline();
        lease.mark_released();
        let span =
            tracing::debug_span!("distlock.release", lock = %lease.req.name, token = %lease.token);
        let release = self.keeper.backend.release(&lease.req).instrument(span);
        let result = match deadline {
            Some(d) => {
                tokio::pin!(release);
                match tokio::time::timeout_at(d, &mut release).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        lease.free_permit();
                        tokio::time::timeout(lease.req.ttl, release)
                            .await
                            .unwrap_or_else(|_| {
                                Err(Error::unavailable(
                                    "distlock",
                                    format!(
                                        "the release of {} had no answer one TTL past the lease's deadline, where the lease ended anyway",
                                        lease.req.name
                                    ),
                                    None,
                                ))
                            })
                    }
                }
            }
            None => release.await,
        };
        match &result {
            Ok(true) => tracing::debug!(lock = %lease.req.name, token = %lease.token, "released"),
            Ok(false) => {
                tracing::info!(lock = %lease.req.name, token = %lease.token, "released, but the backend says it was no longer ours")
            }
            Err(e) => {
                tracing::warn!(lock = %lease.req.name, error = %e, "release failed; the lease will expire after its TTL")
            }
        }
        self.finish_local();
        result
    }

    /// Ends the hold on this side only (no live runtime to release in).
    pub(crate) fn finish_local(&self) {
        self.keeper.stop(&self.lease);
        self.lease.end();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    /// The last two references of a name dropped on two threads at once:
    /// the name's slot leaves the table, whichever goes second. A race, so
    /// it runs many times (a drop that lets go after the table's mutex
    /// leaves a slot behind in about 2 of 50,000 on two cores).
    #[test]
    fn the_last_two_references_dropped_at_once_leave_no_slot_behind() {
        let table: Arc<SlotTable> = Arc::default();
        let name = LockName::new("n").expect("a valid name");
        let both = Barrier::new(2);
        let mut left = 0;
        for _ in 0..100_000 {
            let a = slot_ref(&table, &name, HoldKind::Exclusive);
            let b = slot_ref(&table, &name, HoldKind::Exclusive);
            std::thread::scope(|s| {
                s.spawn(|| {
                    both.wait();
                    drop(a);
                });
                both.wait();
                drop(b);
            });
            let mut slots = lock(&table);
            if !slots.is_empty() {
                left += 1;
                slots.clear();
            }
        }
        assert_eq!(left, 0, "slots nobody references stayed in the table");
    }
}
