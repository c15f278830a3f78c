#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use distlock_core::*;

/// The repository README's example, compiled with the doctests.
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;

mod connect;
pub use connect::{connect, declared_backends, redact, SCHEMES};

/// The SQL unique-row backend (PostgreSQL, MySQL/MariaDB, SQLite).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use distlock_sql as sql;

/// The Redis backend (single server, Sentinel, Cluster).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use distlock_redis as redis;

/// The Redlock backend (a quorum over independent Redis nodes).
#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
pub use distlock_redlock as redlock;

/// The etcd backend.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use distlock_etcd as etcd;

/// The ZooKeeper backend.
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use distlock_zookeeper as zookeeper;
