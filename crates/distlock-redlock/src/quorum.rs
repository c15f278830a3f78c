//! How many nodes must agree: a majority for a lock, more for a semaphore.

use std::collections::HashMap;
use std::hash::Hash;

/// How many of `nodes` nodes must grant a hold that admits `holders` holders
/// at once (1 for a lock).
///
/// Each node grants at most `holders` permits, so `nodes * holders` grants
/// exist in all. If `holders + 1` holders each had `q` grants, they would
/// need `(holders + 1) * q` of them; that exceeds the supply exactly when
/// `q > nodes * holders / (holders + 1)`. The smallest such `q` makes a
/// holder too many impossible; for a lock it is the usual majority. It is
/// also more than half the nodes, so two grants always share a node (what
/// fencing needs).
pub(crate) fn grant_quorum(nodes: usize, holders: u32) -> usize {
    let (m, n) = (nodes as u128, u128::from(holders.max(1)));
    usize::try_from(m * n / (n + 1) + 1).unwrap_or(nodes)
}

/// The value most nodes report (ties: any of them).
pub(crate) fn most_common<T: Copy + Eq + Hash>(values: impl IntoIterator<Item = T>) -> Option<T> {
    let mut counts: HashMap<T, usize> = HashMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_needs_a_majority() {
        for (nodes, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            assert_eq!(grant_quorum(nodes, 1), q, "{nodes} nodes");
        }
    }

    #[test]
    fn a_semaphore_needs_more_nodes_than_its_holders_could_share() {
        // Five nodes: 2 permits need 4 nodes, 4 permits or more need all 5.
        let five: Vec<usize> = (1..=6).map(|n| grant_quorum(5, n)).collect();
        assert_eq!(five, [3, 4, 4, 5, 5, 5]);
        assert_eq!(grant_quorum(5, u32::MAX), 5);
        assert_eq!(grant_quorum(1, 100), 1);
        // The counting argument itself, for every small case.
        for nodes in 1..=9usize {
            for holders in 1..=12u32 {
                let q = grant_quorum(nodes, holders);
                let supply = nodes * holders as usize;
                assert!(q <= nodes, "{nodes} nodes, {holders} permits");
                assert!(
                    (holders as usize + 1) * q > supply,
                    "{holders}+1 holders fit"
                );
                assert!(
                    (holders as usize + 1) * (q - 1) <= supply || q == 1,
                    "{q} is not the smallest quorum for {holders} permits on {nodes} nodes"
                );
                assert!(
                    2 * q > nodes,
                    "two grants of {holders} permits may share no node"
                );
            }
        }
    }
}
