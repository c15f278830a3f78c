//! `list`: every live hold whose name starts with a prefix, read at one
//! revision.
//!
//! Three key ranges hold them: the lock names' own keys (locks, shared
//! holds and campaigns, all `<name>/...`), the semaphores' root and the
//! leaders' holder info root. Each is read in pages of [`PAGE`] keys, all
//! pages at the revision of the first, so the listing is one snapshot. A
//! key whose lease ended is gone from etcd already; a key that is only
//! queued is told apart by the grant rules each kind follows:
//!
//! - a lock's key `<name>/<lease hex>` holds when it has the lowest create
//!   revision under `<name>/` (Go's `Mutex`);
//! - a shared key `<name>/@r/<owner>` holds when no key under `<name>/`
//!   that is not shared was created before it;
//! - a campaign key `<name>/<lease hex>` leads when it is the first created
//!   key under `<name>/`, shared ones included (Go's `Election` waits for
//!   every older key under its prefix); it is a campaign, not a
//!   lock, when it has a holder info key, or (another client's, e.g.
//!   `etcdctl elect`) when its value is not an owner;
//! - a permit key holds when it is `held` and among the first `limit`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use distlock_core::{FencingToken, HoldKind, HoldRecord, LockName, Result};
use etcd_client::{GetOptions, KeyValue};
use futures_util::{StreamExt, TryStreamExt};

use crate::election::{is_campaigns_info, leader_info};
use crate::{is_shared, leader_info_key, lock_holder_info, own_key, semaphore, EtcdBackend};
use crate::{LEADER_INFO_ROOT, SHARED};

/// Keys per range request.
const PAGE: i64 = 1000;

/// How many lease TTLs are asked for at once.
const LEASE_READS_IN_FLIGHT: usize = 8;

/// The end of the range of keys starting with `prefix` (etcd's prefix end;
/// `\0` for the empty prefix: every key).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The ranges holding the keys of the lock names that start with
/// `prefix`. For the empty prefix, every key but those starting with `/`
/// (the semaphores' and leaders' roots, read apart): names start with
/// `-`, `.`, a digit, `:`, a letter or `_`.
fn name_ranges(prefix: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    if prefix.is_empty() {
        return vec![
            (b"-".to_vec(), b"/".to_vec()),
            (b"0".to_vec(), b"{".to_vec()),
        ];
    }
    vec![(prefix.as_bytes().to_vec(), prefix_end(prefix))]
}

/// Whether `value` starts with an owner as distlock writes it (36 lowercase
/// hex digits and dashes, 8-4-4-4-12), as a lock's value does.
pub(crate) fn looks_like_owner(value: &[u8]) -> bool {
    let Some(owner) = value.get(..36) else {
        return false;
    };
    (value.len() == 36 || value[36] == b' ')
        && owner.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(b),
        })
}

/// What a key under the lock names' ranges is.
enum NameKey<'a> {
    /// `<name>/<lease hex>` on that lease: a lock's or a campaign's.
    Lease(&'a str),
    /// `<name>/@r/<owner>`: a shared hold's.
    Shared(&'a str),
}

impl NameKey<'_> {
    fn of(kv: &KeyValue) -> Option<NameKey<'_>> {
        let key = std::str::from_utf8(kv.key()).ok()?;
        let (name, key) = match key.split_once(&format!("/{SHARED}")) {
            Some((name, owner)) if !owner.is_empty() && !owner.contains('/') => {
                (name, NameKey::Shared(name))
            }
            Some(_) => return None,
            None => {
                let (name, lease) = key.rsplit_once('/')?;
                if kv.lease() == 0 || lease != format!("{:x}", kv.lease()) {
                    return None;
                }
                (name, NameKey::Lease(name))
            }
        };
        LockName::new(name).is_ok().then_some(key)
    }
}

/// The locks, shared holds and leaderships held among `kvs` (the name
/// ranges' keys, sorted by key) whose names start with `prefix`, each with
/// its lease; `leaders` maps a campaign key to its holder info key.
fn held_by_name(
    kvs: &[KeyValue],
    prefix: &str,
    leaders: &HashMap<Vec<u8>, KeyValue>,
) -> Vec<(HoldRecord, i64)> {
    let names: BTreeSet<&str> = kvs
        .iter()
        .filter_map(NameKey::of)
        .map(|k| match k {
            NameKey::Lease(n) | NameKey::Shared(n) => n,
        })
        .filter(|n| n.starts_with(prefix))
        .collect();
    let mut held = Vec::new();
    for name in names {
        // The name's own keys under `<name>/`, not longer names' (see
        // `own_key`).
        let under = format!("{name}/");
        let start = kvs.partition_point(|kv| kv.key() < under.as_bytes());
        let end = kvs.partition_point(|kv| kv.key() < prefix_end(&under).as_slice());
        let keys: Vec<&KeyValue> = kvs[start..end]
            .iter()
            .filter(|kv| own_key(kv.key(), &under))
            .collect();
        let first_created = |of: &dyn Fn(&KeyValue) -> bool| {
            keys.iter()
                .filter(|kv| of(kv))
                .map(|kv| kv.create_revision())
                .min()
        };
        let first_any = first_created(&|_| true);
        let first_unshared = first_created(&|kv| !is_shared(kv.key(), &under));
        for kv in keys {
            let rev = kv.create_revision();
            let record = match NameKey::of(kv) {
                Some(NameKey::Shared(n)) if n == name && first_unshared.is_none_or(|f| f > rev) => {
                    HoldRecord::new(name, HoldKind::Shared)
                        .with_token(Some(FencingToken(kv.mod_revision() as u64)))
                        .with_holder_info(lock_holder_info(kv.value()))
                }
                Some(NameKey::Lease(n)) if n == name && first_any == Some(rev) => {
                    let info_key = leader_info_key(&String::from_utf8_lossy(kv.key()));
                    let info = leaders
                        .get(info_key.as_bytes())
                        .filter(|i| is_campaigns_info(i.mod_revision(), kv.create_revision()))
                        .map(KeyValue::value);
                    let campaign =
                        info.is_some() || !(kv.value().is_empty() || looks_like_owner(kv.value()));
                    if campaign {
                        HoldRecord::new(name, HoldKind::Leader)
                            .with_token(Some(FencingToken(rev as u64)))
                            .with_value(Some(String::from_utf8_lossy(kv.value()).into_owned()))
                            .with_holder_info(info.and_then(leader_info))
                    } else {
                        HoldRecord::new(name, HoldKind::Exclusive)
                            .with_token(Some(FencingToken(kv.mod_revision() as u64)))
                            .with_holder_info(lock_holder_info(kv.value()))
                    }
                }
                _ => continue,
            };
            held.push((record, kv.lease()));
        }
    }
    held
}

impl EtcdBackend {
    /// Every key in `[start, end)`, in key order, in pages at `*revision`
    /// (set from the first page's answer when 0).
    async fn read_range(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
        revision: &mut i64,
    ) -> Result<Vec<KeyValue>> {
        let mut kvs = Vec::new();
        let mut from = start;
        loop {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_revision(*revision);
            let mut resp = self
                .kv(|mut c| {
                    let (from, opts) = (from.clone(), opts.clone());
                    async move { c.get(from, Some(opts)).await }
                })
                .await?;
            if *revision == 0 {
                *revision = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let page = resp.take_kvs();
            match page.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => {
                    kvs.extend(page);
                    return Ok(kvs);
                }
            }
            kvs.extend(page);
        }
    }

    /// See [`Backend::list`](distlock_core::Backend::list) and the module
    /// documentation.
    pub(crate) async fn list_holds(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        let mut revision = 0;
        let mut names = Vec::new();
        for (start, end) in name_ranges(prefix) {
            names.extend(self.read_range(start, end, &mut revision).await?);
        }
        let root = |r: &str| format!("{r}{prefix}");
        let sems = root(semaphore::ROOT);
        let sems = self
            .read_range(sems.clone().into_bytes(), prefix_end(&sems), &mut revision)
            .await?;
        let infos = root(LEADER_INFO_ROOT);
        let leaders: HashMap<Vec<u8>, KeyValue> = self
            .read_range(
                infos.clone().into_bytes(),
                prefix_end(&infos),
                &mut revision,
            )
            .await?
            .into_iter()
            .map(|kv| (kv.key().to_vec(), kv))
            .collect();
        let mut held = held_by_name(&names, prefix, &leaders);
        held.extend(semaphore::held_permits(&sems, prefix));
        // Every hold is a distinct key written at its own revision: its
        // name and token tell it apart.
        let lease_of: HashMap<(String, Option<FencingToken>), i64> = held
            .iter()
            .map(|(r, lease)| ((r.name.clone(), r.token), *lease))
            .collect();
        let mut records: Vec<HoldRecord> = held.into_iter().map(|(r, _)| r).collect();
        // Cut to `limit` before asking for leases, so only the leases of
        // the records returned are read.
        distlock_core::sort_records(&mut records, limit);
        let leases: BTreeSet<i64> = records
            .iter()
            .filter_map(|r| lease_of.get(&(r.name.clone(), r.token)).copied())
            .collect();
        let remaining: HashMap<i64, i64> = futures_util::stream::iter(leases)
            .map(|lease| async move {
                let ttl = self
                    .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
                    .await?
                    .ttl();
                Ok::<_, distlock_core::Error>((lease, ttl))
            })
            .buffer_unordered(LEASE_READS_IN_FLIGHT)
            .try_collect()
            .await?;
        let records = records
            .into_iter()
            .filter_map(|record| {
                let lease = lease_of.get(&(record.name.clone(), record.token))?;
                // -1: the lease ended since the read, and its keys with it.
                let ttl = *remaining.get(lease)?;
                (ttl >= 0).then(|| record.with_remaining(Some(Duration::from_secs(ttl as u64))))
            })
            .collect();
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_bound_exactly_the_prefix() {
        assert_eq!(prefix_end("jobs/"), b"jobs0".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }

    #[test]
    fn the_empty_prefix_skips_the_roots_starting_with_a_slash() {
        let ranges = name_ranges("");
        let covered = |k: &[u8]| {
            ranges
                .iter()
                .any(|(s, e)| k >= s.as_slice() && k < e.as_slice())
        };
        for name in [
            "-a/1", ".x/1", "0/1", ":a/1", "A/1", "_/1", "z/1", "zzz/@r/x",
        ] {
            assert!(covered(name.as_bytes()), "{name}");
        }
        assert!(!covered(b"/distlock/leaders/a/1"));
        assert!(!covered(b"/distlock/semaphores/a/@limit"));
    }

    #[test]
    fn owners_are_recognised_with_or_without_holder_info() {
        let owner = distlock_core::Owner::random().to_string();
        assert!(looks_like_owner(owner.as_bytes()));
        assert!(looks_like_owner(format!("{owner} web-1 pid 7").as_bytes()));
        assert!(!looks_like_owner(b""));
        assert!(!looks_like_owner(b"my proposal"));
        assert!(!looks_like_owner(format!("{owner}x").as_bytes()));
    }
}
