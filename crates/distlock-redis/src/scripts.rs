//! The Lua scripts and the key layout of locks, semaphores and elections. Public so
//! that the Redlock backend runs the same protocol on each of its nodes
//! (locks with fencing; locks without it use a plain `SET NX PX` on the
//! same key, see
//! [`RedisBackend::attempt_unfenced`](crate::RedisBackend::attempt_unfenced)),
//! and the benchmark can send them without distlock around them.

use distlock_core::LockName;
use redis::Script;

/// The value of a lock key while shared holds hold the name: never an
/// owner, so no exclusive request (distlock's or a classic client's
/// `SET NX`) is granted and no compare-and-delete removes it.
pub const SHARED_HOLDS: &str = "distlock:shared";

/// The keys and channel of one lock (a read-write lock's too).
///
/// The lock key is exactly `prefix + name` (the prefix is empty by default),
/// so any client speaking the classic `SET name value NX PX` /
/// compare-and-delete protocol on the same key excludes and is excluded by
/// distlock. Auxiliary names wrap the lock key in a hash tag, so in Redis
/// Cluster everything for one lock lives in the lock key's slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// The lock key.
    pub lock: String,
    /// The fencing counter, never deleted.
    pub fence: String,
    /// The pub/sub channel a release is announced on.
    pub channel: String,
    /// The shared holds: a sorted set of owners scored by expiry (ms,
    /// server clock), expiring itself with its longest hold.
    pub readers: String,
    /// The writer marks: exclusive requests waiting behind shared holds, a
    /// sorted set of owners scored by when each mark lapses.
    pub writers: String,
    /// The wait queue of exclusive requests: a sorted set of owners scored
    /// by arrival (microseconds, server clock); the head alone may take a
    /// free lock.
    pub queue: String,
    /// When each queue entry ends unless its waiter renews it: a sorted set
    /// of owners scored by that time (ms, server clock).
    pub queue_ends: String,
    /// The queue's entries of shared requests (the same scores as in
    /// `queue`), with `fifo`: the others are exclusive.
    pub queue_shared: String,
}

impl Keys {
    /// The keys for `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let lock = Self::lock_of(prefix, name);
        Self {
            fence: Self::fence_of(&lock),
            channel: Self::channel_of(&lock),
            readers: Self::readers_of(&lock),
            writers: Self::writers_of(&lock),
            queue: Self::queue_of(&lock),
            queue_ends: Self::queue_ends_of(&lock),
            queue_shared: Self::queue_shared_of(&lock),
            lock,
        }
    }

    /// The lock key alone.
    pub fn lock_of(prefix: &str, name: &LockName) -> String {
        let mut lock = String::with_capacity(prefix.len() + name.as_str().len());
        lock.push_str(prefix);
        lock.push_str(name.as_str());
        lock
    }

    /// The fencing counter of a lock key.
    pub fn fence_of(lock: &str) -> String {
        format!("{{{lock}}}:fence")
    }

    /// The release channel of a lock key.
    pub fn channel_of(lock: &str) -> String {
        format!("{{{lock}}}:released")
    }

    /// The shared holds of a lock key.
    pub fn readers_of(lock: &str) -> String {
        format!("{{{lock}}}:readers")
    }

    /// The channel on which the queue head among `client`'s waiters is
    /// told its turn has come (see `announce.lua`).
    pub fn queue_channel_of(lock: &str, client: &str) -> String {
        format!("{{{lock}}}:released:{client}")
    }

    /// The writer marks of a lock key.
    pub fn writers_of(lock: &str) -> String {
        format!("{{{lock}}}:writers")
    }

    /// The wait queue of a lock key.
    pub fn queue_of(lock: &str) -> String {
        format!("{{{lock}}}:queue")
    }

    /// The shared requests among the wait queue's entries of a lock key.
    pub fn queue_shared_of(lock: &str) -> String {
        format!("{{{lock}}}:queue:shared")
    }

    /// The ends of the wait queue's entries of a lock key.
    pub fn queue_ends_of(lock: &str) -> String {
        format!("{{{lock}}}:queue:ends")
    }
}

/// The keys and channel of one semaphore (the permits of
/// [`HoldKind::Permits`](distlock_core::HoldKind::Permits)).
///
/// Every name carries the lock key of the same name as its hash tag, so in
/// Redis Cluster a script sees all of one semaphore's keys in one slot. No
/// name equals a lock's: a lock key never starts with a brace, and the lock's
/// own auxiliary names end in `:fence` and `:released`. A lock and a
/// semaphore of one name therefore never contend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreKeys {
    /// The permits: a sorted set of owners scored by expiry (ms, server
    /// clock), expiring itself with its longest permit.
    pub permits: String,
    /// The stored limit, never deleted.
    pub limit: String,
    /// The fencing counter, never deleted.
    pub fence: String,
    /// The pub/sub channel a freed permit or a changed limit is announced on.
    pub channel: String,
    /// The wait queue (with `fifo`): a sorted set of entries (a client id, a
    /// space, and the owner) scored by arrival (microseconds, server clock).
    pub queue: String,
    /// When each queue entry ends unless its waiter renews it: a sorted set
    /// of entries scored by that time (ms, server clock).
    pub queue_ends: String,
}

impl SemaphoreKeys {
    /// The keys for the semaphore `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let permits = Self::permits_of(prefix, name);
        Self {
            limit: Self::limit_of(&permits),
            fence: Self::fence_of(&permits),
            channel: Self::channel_of(&permits),
            queue: Self::queue_of(&permits),
            queue_ends: Self::queue_ends_of(&permits),
            permits,
        }
    }

    /// The permits key alone; each other name of the semaphore is this key
    /// and a suffix, built by the functions below from it (an acquire or a
    /// release names only the keys it touches).
    pub fn permits_of(prefix: &str, name: &LockName) -> String {
        const SUFFIX: &str = "}:semaphore";
        let name = name.as_str();
        let mut permits = String::with_capacity(1 + prefix.len() + name.len() + SUFFIX.len());
        permits.push('{');
        permits.push_str(prefix);
        permits.push_str(name);
        permits.push_str(SUFFIX);
        permits
    }

    /// The stored limit of a permits key.
    pub fn limit_of(permits: &str) -> String {
        beside(permits, ":limit")
    }

    /// The fencing counter of a permits key.
    pub fn fence_of(permits: &str) -> String {
        beside(permits, ":fence")
    }

    /// The release channel of a permits key.
    pub fn channel_of(permits: &str) -> String {
        beside(permits, ":released")
    }

    /// The wait queue of a permits key.
    pub fn queue_of(permits: &str) -> String {
        beside(permits, ":queue")
    }

    /// The ends of the wait queue's entries of a permits key.
    pub fn queue_ends_of(permits: &str) -> String {
        beside(permits, ":queue:ends")
    }

    /// The channel on which `client`'s queued waiters are told their turn
    /// has come (see `wait_queue.lua`).
    pub fn queue_channel(&self, client: &str) -> String {
        format!("{}:{client}", self.channel)
    }
}

/// `key` followed by `suffix`, in one allocation of the exact size.
fn beside(key: &str, suffix: &str) -> String {
    let mut out = String::with_capacity(key.len() + suffix.len());
    out.push_str(key);
    out.push_str(suffix);
    out
}

/// The keys and channel of one election (the leadership of
/// [`HoldKind::Leader`](distlock_core::HoldKind::Leader)).
///
/// Every name carries the lock key of the same name as its hash tag, as
/// [`SemaphoreKeys`] do, so in Redis Cluster a script sees all of one
/// election's keys in one slot, and a user allowed the keys and channels
/// of a prefix (`~{app:*`, `&{app:*`) may run its elections. No name equals
/// a lock's or a semaphore's, so an election, a lock and a semaphore of one
/// name never contend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionKeys {
    /// The leader: a hash with the fields `owner`, `value` and `token`,
    /// expiring as a whole with the leadership's lease (server clock).
    pub leader: String,
    /// The fencing counter, never deleted.
    pub fence: String,
    /// The pub/sub channel a resignation, an eviction or a proclaimed value
    /// is announced on.
    pub channel: String,
    /// The campaigners' wait queue (with `fifo`), as a semaphore's
    /// ([`SemaphoreKeys::queue`]).
    pub queue: String,
    /// When each queue entry ends unless its campaigner renews it.
    pub queue_ends: String,
}

impl ElectionKeys {
    /// The keys for the election `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let tag = Keys::lock_of(prefix, name);
        Self {
            leader: format!("{{{tag}}}:election"),
            fence: format!("{{{tag}}}:election:fence"),
            channel: format!("{{{tag}}}:election:released"),
            queue: format!("{{{tag}}}:election:queue"),
            queue_ends: format!("{{{tag}}}:election:queue:ends"),
        }
    }

    /// The channel on which `client`'s queued campaigners are told their
    /// turn has come (see `wait_queue.lua`).
    pub fn queue_channel(&self, client: &str) -> String {
        format!("{}:{client}", self.channel)
    }
}

/// The scripts, loaded once per process. `invoke_async` sends EVALSHA and,
/// when the server answers NOSCRIPT (for example after a restart or a
/// failover), sends the script with SCRIPT LOAD and EVALSHA again.
#[derive(Debug)]
pub struct Scripts {
    /// `acquire.lua`: SET NX PX, then INCR the fence; or PTTL of the
    /// holder, and a writer's mark if shared holds refused a waiting caller.
    /// With a wait queue, only its head may take a free lock, and a
    /// refused waiting caller joins the queue or renews its entry.
    pub acquire: Script,
    /// `acquire_all.lua`: `acquire.lua` for several locks, all or nothing
    /// (one server only: the keys of different names live in different
    /// Cluster slots).
    pub acquire_all: Script,
    /// `extend.lua`: PEXPIRE if the owner matches.
    pub extend: Script,
    /// `extend_many.lua`: `extend.lua` over many keys in one call (not in
    /// Redis Cluster, where the keys may live in different slots).
    pub extend_many: Script,
    /// `release.lua`: DEL and PUBLISH (to the queue's head, if there is a
    /// queue) if the owner matches; else ZREM the owner's writer mark and
    /// queue entry.
    pub release: Script,
    /// `shared_acquire.lua`: grant a shared hold (ZADD, the lock key set to
    /// [`SHARED_HOLDS`], INCR the fence) unless the lock is held
    /// exclusively or a writer's mark is live.
    pub shared_acquire: Script,
    /// `shared_extend.lua`: move each live shared hold's expiry, and the
    /// lock key's with the furthest.
    pub shared_extend: Script,
    /// `shared_release.lua`: ZREM the owner's shared hold; the last one
    /// deletes the lock key and PUBLISHes.
    pub shared_release: Script,
    /// `evict.lua`: DEL the lock key and its shared holds whoever holds
    /// them, and tell the waiters as a release does.
    pub evict: Script,
    /// `inspect.lua`: the lock key's PTTL and value, the fence, and the
    /// owners of the live shared holds and writer marks.
    pub inspect: Script,
    /// `list.lua`: every hold of one name (the lock key's value, the live
    /// shared holds and permits with their lease left, the leader hash),
    /// for `list`.
    pub list: Script,
    /// `raise.lua`: raise the fencing counter to at least a value.
    pub raise: Script,
    /// `permit_acquire.lua`: drop expired permits, check or store the
    /// limit, then grant (INCR the fence, ZADD) or answer when the earliest
    /// permit expires.
    pub permit_acquire: Script,
    /// `permit_extend.lua`: move the expiry of each live permit of the
    /// owner; many semaphores in one call where they share a node.
    pub permit_extend: Script,
    /// `permit_release.lua`: ZREM the owner's permit, PUBLISH if it was
    /// live (with a wait queue, also to the waiter the permit is for).
    pub permit_release: Script,
    /// `permit_leave.lua`: ZREM a wait's queue entry; if it was within the
    /// free permits' reach, tell the entry that moves up into it.
    pub permit_leave: Script,
    /// `permit_limit.lua`: SET the limit, answer the old one, PUBLISH (with
    /// a wait queue, also to the waiters the new limit brings within reach).
    pub permit_limit: Script,
    /// `permit_inspect.lua`: the stored limit and the live permits' owners.
    pub permit_inspect: Script,
    /// `election_acquire.lua`: if nobody leads, INCR the fence, HSET
    /// owner, value and token with the lease as the hash's expiry and
    /// PUBLISH the grant to the election's observers; the same owner renews
    /// and gets its token again; else the leader's PTTL.
    pub election_acquire: Script,
    /// `election_extend.lua`: PEXPIRE each leader hash whose owner matches.
    pub election_extend: Script,
    /// `election_release.lua`: DEL and PUBLISH if the owner matches (with
    /// a wait queue, also to its head).
    pub election_release: Script,
    /// `election_leave.lua`: ZREM a campaign's queue entry; if it headed
    /// the queue of a free election, tell the new head.
    pub election_leave: Script,
    /// `election_proclaim.lua`: HSET the value and PUBLISH if the owner
    /// matches.
    pub election_proclaim: Script,
    /// `election_leader.lua`: the leader hash's PTTL, value, token, owner
    /// and whether Redlock's write-back settled its token.
    pub election_leader: Script,
    /// `election_settle.lua`: raise the election's fencing counter to a
    /// token and, if the owner leads, store that token in the leader hash
    /// (Redlock's fencing write-back).
    pub election_settle: Script,
    /// `election_evict.lua`: DEL the leader hash whoever leads, and PUBLISH
    /// (to the wait queue's head too, if there is one).
    pub election_evict: Script,
}

impl Scripts {
    /// The process-wide scripts.
    pub fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire: Script::new(include_str!("scripts/acquire.lua")),
            acquire_all: Script::new(include_str!("scripts/acquire_all.lua")),
            extend: Script::new(include_str!("scripts/extend.lua")),
            extend_many: Script::new(include_str!("scripts/extend_many.lua")),
            release: Script::new(concat!(
                include_str!("scripts/announce.lua"),
                include_str!("scripts/release.lua")
            )),
            shared_acquire: Script::new(include_str!("scripts/shared_acquire.lua")),
            shared_extend: Script::new(include_str!("scripts/shared_extend.lua")),
            shared_release: Script::new(concat!(
                include_str!("scripts/announce.lua"),
                include_str!("scripts/shared_release.lua")
            )),
            evict: Script::new(concat!(
                include_str!("scripts/announce.lua"),
                include_str!("scripts/evict.lua")
            )),
            inspect: Script::new(include_str!("scripts/inspect.lua")),
            list: Script::new(include_str!("scripts/list.lua")),
            raise: Script::new(include_str!("scripts/raise.lua")),
            permit_acquire: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/permit_acquire.lua")
            )),
            permit_extend: Script::new(include_str!("scripts/permit_extend.lua")),
            permit_release: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/permit_release.lua")
            )),
            permit_leave: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/permit_leave.lua")
            )),
            permit_limit: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/permit_limit.lua")
            )),
            permit_inspect: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/permit_inspect.lua")
            )),
            election_acquire: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/election_acquire.lua")
            )),
            election_extend: Script::new(include_str!("scripts/election_extend.lua")),
            election_release: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/election_release.lua")
            )),
            election_leave: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/election_leave.lua")
            )),
            election_proclaim: Script::new(include_str!("scripts/election_proclaim.lua")),
            election_leader: Script::new(include_str!("scripts/election_leader.lua")),
            election_evict: Script::new(concat!(
                include_str!("scripts/wait_queue.lua"),
                include_str!("scripts/election_evict.lua")
            )),
            election_settle: Script::new(include_str!("scripts/election_settle.lua")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aux_keys_share_the_lock_keys_hash_slot() {
        let k = Keys::new("app:", &LockName::new("jobs/nightly").unwrap());
        assert_eq!(k.lock, "app:jobs/nightly");
        assert_eq!(k.fence, "{app:jobs/nightly}:fence");
        assert_eq!(k.channel, "{app:jobs/nightly}:released");
        assert_eq!(k.readers, "{app:jobs/nightly}:readers");
        assert_eq!(k.writers, "{app:jobs/nightly}:writers");
        // Redis Cluster hashes the lock key whole (names cannot contain
        // braces) and the others by their tag, which is the lock key; the
        // cluster tests would fail with CROSSSLOT otherwise.
    }

    #[test]
    fn every_script_that_knows_shared_holds_spells_their_value_alike() {
        let scripts = [
            include_str!("scripts/acquire.lua"),
            include_str!("scripts/release.lua"),
            include_str!("scripts/shared_acquire.lua"),
            include_str!("scripts/shared_extend.lua"),
            include_str!("scripts/shared_release.lua"),
        ];
        for s in scripts {
            let quoted = format!("'{SHARED_HOLDS}'");
            assert!(s.contains(&quoted), "{s}");
            // No other quoted value in the 'distlock:' space.
            assert_eq!(s.matches("'distlock:").count(), s.matches(&quoted).count());
        }
    }

    #[test]
    fn semaphore_keys_share_one_slot_and_differ_from_the_locks() {
        let name = LockName::new("pools/db").unwrap();
        let s = SemaphoreKeys::new("app:", &name);
        let l = Keys::new("app:", &name);
        let all = [&s.permits, &s.limit, &s.fence, &s.channel];
        for k in all {
            assert!(k.starts_with("{app:pools/db}:semaphore"), "{k}");
            assert!(
                ![&l.lock, &l.fence, &l.channel, &l.readers, &l.writers].contains(&k),
                "{k}"
            );
        }
        let distinct: std::collections::HashSet<_> = all.into_iter().collect();
        assert_eq!(distinct.len(), 4);
        // The stored layout, which every client of a semaphore shares.
        assert_eq!(
            [
                s.permits.as_str(),
                &s.limit,
                &s.fence,
                &s.channel,
                &s.queue,
                &s.queue_ends
            ],
            [
                "{app:pools/db}:semaphore",
                "{app:pools/db}:semaphore:limit",
                "{app:pools/db}:semaphore:fence",
                "{app:pools/db}:semaphore:released",
                "{app:pools/db}:semaphore:queue",
                "{app:pools/db}:semaphore:queue:ends"
            ]
        );
        assert_eq!(
            SemaphoreKeys::permits_of("app:", &name),
            s.permits,
            "an acquire names the same key"
        );
    }

    #[test]
    fn election_keys_share_one_slot_and_differ_from_the_locks_and_semaphores() {
        let name = LockName::new("services/api").unwrap();
        let e = ElectionKeys::new("app:", &name);
        let l = Keys::new("app:", &name);
        let s = SemaphoreKeys::new("app:", &name);
        let others = [
            &l.lock, &l.fence, &l.channel, &l.readers, &l.writers, &s.permits, &s.limit, &s.fence,
            &s.channel,
        ];
        let all = [&e.leader, &e.fence, &e.channel];
        for k in all {
            assert!(k.starts_with("{app:services/api}:election"), "{k}");
            assert!(!others.contains(&k), "{k}");
        }
        let distinct: std::collections::HashSet<_> = all.into_iter().collect();
        assert_eq!(distinct.len(), 3);
    }
}
