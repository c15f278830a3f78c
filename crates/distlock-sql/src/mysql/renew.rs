//! Renewal batches: the locks and permits of a batch renewed in one
//! transaction, one `UPDATE` per table over a derived table of the batch's
//! (name, owner, TTL) rows, then one read of which of them are live. A row
//! is live after the update exactly when it was live before it (so it was
//! renewed): the update holds its rows' locks until the commit.

use distlock_core::{HoldKind, LockRequest, Result};

use super::My;
use crate::election::row;
use crate::ttl_micros;

/// The batch as a derived table `r(name, owner, ttl)`, `n` rows of
/// parameters, in names and owners compared byte for byte as the tables'
/// columns are.
fn rows(n: usize) -> String {
    let row = "SELECT CONVERT(? USING ascii) COLLATE ascii_bin AS name, \
               CONVERT(? USING ascii) COLLATE ascii_bin AS owner, ? AS ttl";
    let mut sql = String::with_capacity(n * (row.len() + 11));
    for i in 0..n {
        if i > 0 {
            sql.push_str(" UNION ALL ");
        }
        sql.push_str(row);
    }
    sql
}

impl My {
    /// Each request's renewal, in order: whether its lock or permit was
    /// still held and now runs for its TTL from now. Shared holds are
    /// renewed apart (the caller sends none here).
    pub(crate) async fn extend_many(&self, reqs: &[LockRequest]) -> Result<Vec<bool>> {
        let map = |e| self.err.map(e);
        let (permits, locks): (Vec<_>, Vec<_>) = reqs
            .iter()
            .partition(|r| matches!(r.kind, HoldKind::Permits { .. }));
        let mut tx = self.pool.begin().await.map_err(map)?;
        let mut live = std::collections::HashSet::new();
        for (batch, table, is_permit) in [
            (&locks, &self.table, false),
            (&permits, &self.permit_table, true),
        ] {
            if batch.is_empty() {
                continue;
            }
            let r = rows(batch.len());
            let update = format!(
                "UPDATE {table} t JOIN ({r}) r ON t.name = r.name AND t.owner = r.owner
                    SET t.expires_at = UTC_TIMESTAMP(6) + INTERVAL r.ttl MICROSECOND
                  WHERE t.expires_at > UTC_TIMESTAMP(6)"
            );
            let read = format!(
                "SELECT t.name, t.owner FROM {table} t JOIN ({r}) r
                     ON t.name = r.name AND t.owner = r.owner
                  WHERE t.expires_at > UTC_TIMESTAMP(6)"
            );
            let mut q = sqlx::query(&update);
            for req in batch {
                q = q
                    .bind(row(req))
                    .bind(req.owner.to_string())
                    .bind(ttl_micros(req.ttl));
            }
            q.execute(&mut *tx).await.map_err(map)?;
            // ascii_bin columns come back as bytes.
            let mut q = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(&read);
            for req in batch {
                q = q
                    .bind(row(req))
                    .bind(req.owner.to_string())
                    .bind(ttl_micros(req.ttl));
            }
            for (name, owner) in q.fetch_all(&mut *tx).await.map_err(map)? {
                live.insert((is_permit, name, owner));
            }
        }
        tx.commit().await.map_err(map)?;
        Ok(reqs
            .iter()
            .map(|r| {
                let is_permit = matches!(r.kind, HoldKind::Permits { .. });
                live.contains(&(
                    is_permit,
                    row(r).as_bytes().to_vec(),
                    r.owner.to_string().into_bytes(),
                ))
            })
            .collect())
    }
}
