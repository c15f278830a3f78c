//! The Lua scripts and the key layout. Public so that the Redlock backend
//! runs the same protocol on each of its nodes (with fencing; without it,
//! a plain `SET NX PX` on the same key, see
//! [`RedisBackend::attempt_unfenced`](crate::RedisBackend::attempt_unfenced)),
//! and the benchmark can send them without distlock around them.

use distlock_core::LockName;
use redis::Script;

/// The keys and channel of one lock.
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
}

impl Keys {
    /// The keys for `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let lock = Self::lock_of(prefix, name);
        Self {
            fence: Self::fence_of(&lock),
            channel: Self::channel_of(&lock),
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
}

/// The scripts, loaded once per process. `invoke_async` sends EVALSHA and
/// falls back to EVAL (loading the script) when the server answers NOSCRIPT,
/// for example after a restart or a failover.
#[derive(Debug)]
pub struct Scripts {
    /// `acquire.lua`: SET NX PX, then INCR the fence; or PTTL of the holder.
    pub acquire: Script,
    /// `extend.lua`: PEXPIRE if the owner matches.
    pub extend: Script,
    /// `extend_many.lua`: `extend.lua` over many keys in one call (not in
    /// Redis Cluster, where the keys may live in different slots).
    pub extend_many: Script,
    /// `release.lua`: DEL and PUBLISH if the owner matches.
    pub release: Script,
    /// `raise.lua`: raise the fencing counter to at least a value.
    pub raise: Script,
}

impl Scripts {
    /// The process-wide scripts.
    pub fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire: Script::new(include_str!("scripts/acquire.lua")),
            extend: Script::new(include_str!("scripts/extend.lua")),
            extend_many: Script::new(include_str!("scripts/extend_many.lua")),
            release: Script::new(include_str!("scripts/release.lua")),
            raise: Script::new(include_str!("scripts/raise.lua")),
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
        // Redis Cluster hashes the lock key whole (names cannot contain
        // braces) and the others by their tag, which is the lock key; the
        // cluster tests would fail with CROSSSLOT otherwise.
    }
}
