#![doc = include_str!("../README.md")]

mod backend;
mod client;
pub mod completion;
mod election;
mod error;
pub mod expiry;
mod fence;
mod guard;
mod holder;
pub mod input;
mod keeper;
mod lease;
mod memory;
mod multi;
mod name;
pub mod probe;
mod renewer;
mod slot;
mod token;
pub mod wait;

pub use backend::{
    AllAtOnce, Backend, Capabilities, Consistency, DynBackend, Fencing, Finding, Grant, HoldKind,
    Leader, LeaderStream, LockRequest, LockStatus, TrustedClock, Waiting, LEADER_POLL,
};
pub use client::{LockBuilder, LockClient, ANSWER_GRACE, DEFAULT_TTL, LONGEST_WAIT};
pub use election::{validate_election_value, Election, Leadership, MAX_VALUE_LEN};
pub use error::{tls_refusal, BoxError, Error, InputKind, LostReason, Result};
pub use fence::{FenceGate, ReadWriteGate, StaleToken};
pub use guard::LockGuard;
pub use holder::{
    default_holder_info, fit_holder_info, sort_records, split_stored_owner, stored_owner,
    validate_holder_info, validate_prefix, HoldRecord, MAX_HOLDER_INFO_LEN,
};
pub use memory::MemoryBackend;
pub use multi::{MultiGuard, MultiLockBuilder};
pub use name::{LockName, MAX_NAME_LEN};
pub use token::{FencingToken, Owner};

/// Re-exported so backend crates implement [`Backend`] with the same macro version.
pub use async_trait::async_trait;
