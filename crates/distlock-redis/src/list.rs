//! `list`: the holds under a prefix. One `SCAN` of the keyspace finds the
//! names that have a lock key, shared holds, permits or a leader; each name
//! is then read whole by one `list.lua` call (all of a name's keys share a
//! Cluster slot), in name order, until enough records are in.

use std::collections::BTreeSet;
use std::time::Duration;

use distlock_core::{
    sort_records, split_stored_owner, FencingToken, HoldKind, HoldRecord, LockName, Result,
};
use futures_util::future::try_join_all;

use crate::scripts::{ElectionKeys, Keys, Scripts, SemaphoreKeys, SHARED_HOLDS};
use crate::RedisBackend;

/// Keys `SCAN` looks at per call: large enough that a big keyspace takes
/// few round trips, small enough that one call blocks the server briefly.
const SCAN_COUNT: usize = 1000;

/// Names `list` reads per batch of `list.lua` calls, sent at once on the
/// multiplexed connection: the listing stops after the batch in which the
/// limit is reached. Redlock reads its nodes in batches of the same size.
pub const LIST_BATCH: usize = 64;

/// The suffixes of the auxiliary keys that carry holds (the shared holds,
/// the permits, the leader), after the `{<prefix><name>}` hash tag.
const HOLD_SUFFIXES: [&str; 3] = [":readers", ":semaphore", ":election"];

/// One hold as one server stores it, with the stored owner that Redlock
/// counts nodes by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedHold {
    /// The stored owner: the owner and its holder info
    /// ([`distlock_core::stored_owner`]), or a foreign client's value as it
    /// stored it.
    pub owner: String,
    /// Whether Redlock's fencing write-back stored the grant's token here
    /// (leaderships only; see [`RedisBackend::settle_election`]).
    pub settled: bool,
    /// The hold as `list` reports it.
    pub record: HoldRecord,
}

/// `list.lua`'s answer for one name: the lock key's value, its PTTL, the
/// fencing counter, the live shared holds (owner, ms left), the stored
/// limit, the live permits (owner, ms left), the leader hash's PTTL and its
/// owner, value, token and settled fields.
type NameAnswer = (
    Option<String>,
    i64,
    i64,
    Vec<(String, i64)>,
    i64,
    Vec<(String, i64)>,
    i64,
    Vec<Option<String>>,
);

impl RedisBackend {
    /// Every live hold under `prefix`, at most `limit` of them: see
    /// [`hold_names`](Self::hold_names) and [`holds_of`](Self::holds_of).
    /// Names are read in order and the reading stops once `limit` records
    /// are in, so a small limit reads few names; the `SCAN` covers the
    /// whole keyspace whatever the limit.
    pub(crate) async fn list_holds(&self, prefix: &str, limit: usize) -> Result<Vec<HoldRecord>> {
        let names = self.hold_names(prefix).await?;
        let mut records = Vec::new();
        for batch in names.chunks(LIST_BATCH) {
            records.extend(self.holds_of(batch).await?.into_iter().map(|h| h.record));
            if records.len() >= limit {
                break;
            }
        }
        sort_records(&mut records, limit);
        Ok(records)
    }

    /// The names under `prefix` (a raw prefix of lock names) that have a
    /// lock key, shared holds, permits or a leader on this server, sorted:
    /// one `SCAN ... MATCH *<key prefix><prefix>* COUNT 1000` of the whole
    /// keyspace (on every master of a Cluster). A name found may hold
    /// nothing by the time it is read.
    pub async fn hold_names(&self, prefix: &str) -> Result<Vec<LockName>> {
        let key_prefix = &self.inner.config.prefix;
        let pattern = format!("*{}*", glob_escape(&format!("{key_prefix}{prefix}")));
        let keys = self
            .inner
            .conn
            .scan(&pattern, SCAN_COUNT)
            .await
            .map_err(|e| self.err(e))?;
        let names: BTreeSet<&str> = keys
            .iter()
            .filter_map(|k| name_of_key(key_prefix, k))
            .filter(|n| n.starts_with(prefix))
            .collect();
        Ok(names
            .into_iter()
            .filter_map(|n| LockName::new(n).ok())
            .collect())
    }

    /// The live holds of each of `names` on this server, by its clock: one
    /// `list.lua` call per name, all sent at once. The lock key is an
    /// exclusive hold unless it says `distlock:shared` (any string: a
    /// classic client's lock is listed too, its holder info `None`); each
    /// live member of the shared holds and of the permits is a hold; the
    /// leader hash is a leadership. Writer marks and counters are never
    /// holds.
    pub async fn holds_of(&self, names: &[LockName]) -> Result<Vec<ListedHold>> {
        let answers = try_join_all(names.iter().map(|name| self.read_name(name))).await?;
        Ok(answers.into_iter().flatten().collect())
    }

    async fn read_name(&self, name: &LockName) -> Result<Vec<ListedHold>> {
        let prefix = &self.inner.config.prefix;
        let (lock, semaphore, election) = (
            Keys::new(prefix, name),
            SemaphoreKeys::new(prefix, name),
            ElectionKeys::new(prefix, name),
        );
        let mut inv = Scripts::get().list.key(&lock.lock);
        inv.key(&lock.fence)
            .key(&lock.readers)
            .key(&semaphore.permits)
            .key(&semaphore.limit)
            .key(&election.leader);
        let answer: NameAnswer = self.run(&inv).await?;
        Ok(holds_of_answer(name, answer))
    }
}

/// The holds in one name's `list.lua` answer.
fn holds_of_answer(name: &LockName, answer: NameAnswer) -> Vec<ListedHold> {
    let (value, pttl, fence, shared, limit, permits, leader_pttl, leader) = answer;
    let ms = |left: i64| u64::try_from(left).ok().map(Duration::from_millis);
    let hold = |owner: String, kind: HoldKind, token: Option<FencingToken>, left: i64| {
        let info = split_stored_owner(&owner).1.map(str::to_string);
        let record = HoldRecord::new(name.as_str(), kind)
            .with_token(token)
            .with_remaining(ms(left))
            .with_holder_info(info);
        ListedHold {
            owner,
            settled: false,
            record,
        }
    };
    let mut out = Vec::new();
    if let Some(owner) = value.filter(|v| v != SHARED_HOLDS) {
        // While the name is held exclusively no other grant moves the
        // counter, so it holds this hold's token; a foreign client's lock
        // took none.
        let token =
            (fence > 0 && is_distlock_owner(&owner)).then(|| FencingToken(fence.unsigned_abs()));
        out.push(hold(owner, HoldKind::Exclusive, token, pttl));
    }
    for (owner, left) in shared {
        out.push(hold(owner, HoldKind::Shared, None, left));
    }
    let limit = u32::try_from(limit).unwrap_or(0);
    for (owner, left) in permits {
        out.push(hold(owner, HoldKind::Permits { limit }, None, left));
    }
    if leader_pttl != -2 {
        let field = |i: usize| leader.get(i).cloned().flatten();
        if let Some(owner) = field(0) {
            let token = field(2)
                .and_then(|t| t.parse::<u64>().ok())
                .map(FencingToken);
            let mut h = hold(owner, HoldKind::Leader, token, leader_pttl);
            h.record = h.record.with_value(field(1));
            h.settled = field(3).is_some_and(|s| s == "1");
            out.push(h);
        }
    }
    out
}

/// Whether a stored owner is distlock's: a 36-character owner (uuid text),
/// alone or followed by holder info.
fn is_distlock_owner(stored: &str) -> bool {
    let owner = split_stored_owner(stored).0;
    owner.len() == 36
        && owner.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The lock name a key holds holds under, for a lock key (`<key
/// prefix><name>`) and the shared holds, permits and leader keys
/// (`{<key prefix><name>}<suffix>`); `None` for any other key (counters,
/// writer marks, limits, other applications' keys).
fn name_of_key<'k>(key_prefix: &str, key: &'k str) -> Option<&'k str> {
    let name = match key.strip_prefix('{') {
        Some(tagged) => {
            let (tag, suffix) = tagged.split_once('}')?;
            if !HOLD_SUFFIXES.contains(&suffix) {
                return None;
            }
            tag.strip_prefix(key_prefix)?
        }
        None => key.strip_prefix(key_prefix)?,
    };
    LockName::new(name).is_ok().then_some(name)
}

/// `text` as a `SCAN` pattern matching exactly itself.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_that_carry_holds_name_a_lock() {
        let n = |k| name_of_key("app:", k);
        assert_eq!(n("app:jobs/a"), Some("jobs/a"));
        assert_eq!(n("{app:jobs/a}:readers"), Some("jobs/a"));
        assert_eq!(n("{app:jobs/a}:semaphore"), Some("jobs/a"));
        assert_eq!(n("{app:jobs/a}:election"), Some("jobs/a"));
        for internal in [
            "{app:jobs/a}:fence",
            "{app:jobs/a}:writers",
            "{app:jobs/a}:semaphore:limit",
            "{app:jobs/a}:semaphore:fence",
            "{app:jobs/a}:semaphore:queue",
            "{app:jobs/a}:semaphore:queue:ends",
            "{app:jobs/a}:election:fence",
            "other:jobs/a",
            "{other:jobs/a}:readers",
            "app:has space",
        ] {
            assert_eq!(n(internal), None, "{internal}");
        }
        assert_eq!(name_of_key("", "{x}:election"), Some("x"));
    }

    #[test]
    fn glob_specials_match_themselves() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("jobs/x-1"), "jobs/x-1");
    }

    #[test]
    fn only_uuid_owners_are_distlocks() {
        let owner = "0123abcd-0000-4000-8000-00000000cafe";
        assert!(is_distlock_owner(owner));
        assert!(is_distlock_owner(&format!("{owner} web-1 pid 7")));
        assert!(!is_distlock_owner("classic-owner"));
        assert!(!is_distlock_owner("4f0c4c36a1d611ee8c900242ac120002"));
    }

    #[test]
    fn an_answer_lists_each_live_hold_with_its_holder_info() {
        let owner = "0123abcd-0000-4000-8000-00000000cafe";
        let name = LockName::new("jobs/a").unwrap();
        let answer: NameAnswer = (
            Some(format!("{owner} web-1 pid 7")),
            900,
            4,
            vec![],
            3,
            vec![("classic".into(), 50)],
            -2,
            vec![],
        );
        let holds = holds_of_answer(&name, answer);
        assert_eq!(holds.len(), 2);
        assert_eq!(holds[0].record.kind, HoldKind::Exclusive);
        assert_eq!(holds[0].record.token, Some(FencingToken(4)));
        assert_eq!(holds[0].record.holder_info.as_deref(), Some("web-1 pid 7"));
        assert_eq!(holds[1].record.kind, HoldKind::Permits { limit: 3 });
        assert_eq!(holds[1].record.holder_info, None);
        let shared: NameAnswer = (
            Some(SHARED_HOLDS.into()),
            900,
            5,
            vec![(format!("{owner} r"), 800)],
            0,
            vec![],
            700,
            vec![
                Some(owner.into()),
                Some("10.0.0.1".into()),
                Some("6".into()),
                None,
            ],
        );
        let holds = holds_of_answer(&name, shared);
        let kinds: Vec<_> = holds.iter().map(|h| h.record.kind).collect();
        assert_eq!(kinds, [HoldKind::Shared, HoldKind::Leader]);
        assert_eq!(holds[1].record.value.as_deref(), Some("10.0.0.1"));
        assert_eq!(holds[1].record.token, Some(FencingToken(6)));
    }
}
