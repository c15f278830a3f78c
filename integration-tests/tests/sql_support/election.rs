//! Elections on the SQL tables beyond the conformance suite: where the
//! leader's value lives, and that the grant itself writes it.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Backend, LockName, LockRequest};
use distlock_sql::{sqlx, SqlBackend};
use libtest_mimic::{Failed, Trial};

use super::SqlFactory;

/// The election trials every SQL backend runs.
pub(super) fn trials(f: &Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    vec![integration_tests::trial(
        rt,
        format!(
            "{}::an_election_value_is_written_by_the_granting_statement_also_on_an_older_table",
            f.name
        ),
        value_written_by_the_grant(f.clone()),
    )]
}

/// A raw connection to the factory's database, for statements by hand.
pub(super) enum Raw {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Raw {
    pub(super) async fn connect(url: &str) -> Result<Self, Failed> {
        let base = url.split('?').next().unwrap_or(url);
        let e = |e: sqlx::Error| Failed::from(e.to_string());
        Ok(if base.starts_with("postgres") {
            Raw::Pg(sqlx::PgPool::connect(base).await.map_err(e)?)
        } else if base.starts_with("mysql") || base.starts_with("mariadb") {
            Raw::My(sqlx::MySqlPool::connect(base).await.map_err(e)?)
        } else {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(base)
                .map_err(e)?
                .create_if_missing(true)
                .busy_timeout(Duration::from_secs(10));
            Raw::Lite(sqlx::SqlitePool::connect_with(options).await.map_err(e)?)
        })
    }

    /// Picks this database's variant of a statement.
    pub(super) fn pick<'a>(&self, pg: &'a str, my: &'a str, lite: &'a str) -> &'a str {
        match self {
            Raw::Pg(_) => pg,
            Raw::My(_) => my,
            Raw::Lite(_) => lite,
        }
    }

    pub(super) async fn exec(&self, sql: &str) -> Result<(), Failed> {
        let r = match self {
            Raw::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Raw::My(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Raw::Lite(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        };
        r.map_err(|e| format!("{sql}: {e}").into())
    }

    /// The first column of each row `sql` answers, as text.
    pub(super) async fn texts(&self, sql: &str) -> Result<Vec<Option<String>>, Failed> {
        let r = match self {
            Raw::Pg(p) => sqlx::query_scalar(sql).fetch_all(p).await,
            Raw::Lite(p) => sqlx::query_scalar(sql).fetch_all(p).await,
            // Binary collations come back as bytes.
            Raw::My(p) => sqlx::query_scalar::<_, Option<Vec<u8>>>(sql)
                .fetch_all(p)
                .await
                .map(|rows| {
                    rows.into_iter()
                        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                        .collect()
                }),
        };
        r.map_err(|e| format!("{sql}: {e}").into())
    }
}

pub(super) fn check(ok: bool, what: impl Into<String>) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

/// A lock table made as before elections (no `value` column, an old row
/// in it) gets the column when a client starts. Every version of the
/// election's row that names a campaigner as owner carries that
/// campaigner's value, for a first grant (a new row) and a later one (a
/// freed row taken over), so the value is written by the very statement
/// that grants, never after it. Triggers log the versions on PostgreSQL
/// and SQLite; on MariaDB the table's system versioning keeps them (a
/// trigger there would reset the token a grant reports through
/// `LAST_INSERT_ID`). `leader` and `proclaim` read and change that value,
/// and the lock of the same name is a row of its own, with no value.
async fn value_written_by_the_grant(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (t, url) = f.own_table("elect")?;
    let raw = Raw::connect(&url).await?;
    let old = raw.pick(
        "CREATE TABLE {t} (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,
                           expires_at TIMESTAMPTZ NOT NULL,
                           awaited BOOLEAN NOT NULL DEFAULT false);
         INSERT INTO {t} VALUES ('elect/old', NULL, 7, now(), false)",
        "CREATE TABLE {t} (
             name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
             owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL,
             token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB;
         INSERT INTO {t} VALUES ('elect/old', NULL, 7, UTC_TIMESTAMP(6))",
        "CREATE TABLE {t} (name TEXT PRIMARY KEY NOT NULL, owner TEXT,
                           token INTEGER NOT NULL, expires_at INTEGER NOT NULL);
         INSERT INTO {t} VALUES ('elect/old', NULL, 7, 0)",
    );
    raw.exec(&old.replace("{t}", &t)).await?;
    let b = SqlBackend::connect(&url).await?;
    let old_value = raw
        .texts(&format!("SELECT value FROM {t} WHERE name = 'elect/old'"))
        .await?;
    check(
        old_value == vec![None],
        format!("the older table's row reads {old_value:?} for its new value column"),
    )?;
    let log = raw.pick(
        "CREATE TABLE {t}_log (name TEXT, owner TEXT, value TEXT);
         CREATE FUNCTION {t}_logged() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {t}_log VALUES (NEW.name, NEW.owner, NEW.value); RETURN NEW; END $$;
         CREATE TRIGGER {t}_log AFTER INSERT OR UPDATE ON {t}
           FOR EACH ROW EXECUTE FUNCTION {t}_logged()",
        "ALTER TABLE {t} ADD SYSTEM VERSIONING",
        "CREATE TABLE {t}_log (name TEXT, owner TEXT, value TEXT);
         CREATE TRIGGER {t}_ins AFTER INSERT ON {t}
           BEGIN INSERT INTO {t}_log VALUES (NEW.name, NEW.owner, NEW.value); END;
         CREATE TRIGGER {t}_upd AFTER UPDATE ON {t}
           BEGIN INSERT INTO {t}_log VALUES (NEW.name, NEW.owner, NEW.value); END",
    );
    raw.exec(&log.replace("{t}", &t)).await?;

    let name = LockName::new("elect/raw")?;
    let row = "elect/raw@election";
    let ttl = Duration::from_secs(60);
    // The values each campaigner's row versions carry (at least one).
    let logged = |owner: String| {
        let (raw, t) = (&raw, &t);
        async move {
            let versions = raw.pick(
                "SELECT value FROM {t}_log",
                "SELECT value FROM {t} FOR SYSTEM_TIME ALL",
                "SELECT value FROM {t}_log",
            );
            let seen = raw
                .texts(&format!(
                    "{} WHERE name = '{row}' AND owner = '{owner}'",
                    versions.replace("{t}", t)
                ))
                .await?;
            check(
                !seen.is_empty(),
                format!("no version of the row names {owner}"),
            )?;
            Ok::<_, Failed>(seen)
        }
    };
    let first = LockRequest::leader(name.clone(), ttl, "first");
    let g1 = b
        .try_acquire(&first)
        .await?
        .ok_or("the first campaign was refused")?;
    let seen = logged(first.owner.to_string()).await?;
    check(
        seen.iter().all(|v| v.as_deref() == Some("first")),
        format!("the first leader's row versions carry {seen:?}, not only \"first\""),
    )?;
    check(
        b.release(&first).await?,
        "the first leader no longer led at its resignation",
    )?;
    let second = LockRequest::leader(name.clone(), ttl, "second");
    let g2 = b
        .try_acquire(&second)
        .await?
        .ok_or("a campaign after the resignation was refused")?;
    check(
        g2.token > g1.token,
        "the second leadership's token did not rise",
    )?;
    let seen = logged(second.owner.to_string()).await?;
    check(
        seen.iter().all(|v| v.as_deref() == Some("second")),
        format!("the second leader's row versions carry {seen:?}, not only \"second\""),
    )?;
    let leader = b.leader(&name).await?.ok_or("nobody leads")?;
    check(
        leader.value == "second" && leader.token == g2.token,
        format!("leader reads {leader:?}"),
    )?;
    check(
        leader.remaining.is_some_and(|r| r <= ttl && r > ttl / 2),
        format!("the leader's remaining lease is {:?}", leader.remaining),
    )?;

    check(
        b.proclaim(&second, "third").await?,
        "the leader could not proclaim",
    )?;
    check(
        !b.proclaim(&first, "stale").await?,
        "a resigned leader's proclamation was accepted",
    )?;
    let now = raw
        .texts(&format!("SELECT value FROM {t} WHERE name = '{row}'"))
        .await?;
    check(
        now == vec![Some("third".to_string())],
        format!("after proclaiming, the row holds {now:?}"),
    )?;

    // The lock of the same name is apart: granted beside the leader, its
    // row carries no value, and inspect reports the lock's token.
    let lock = LockRequest::new(name.clone(), ttl);
    let gl = b
        .try_acquire(&lock)
        .await?
        .ok_or("the lock of the election's name was refused")?;
    let lock_value = raw
        .texts(&format!("SELECT value FROM {t} WHERE name = 'elect/raw'"))
        .await?;
    check(
        lock_value == vec![None],
        format!("the lock's row carries the value {lock_value:?}"),
    )?;
    let status = b.inspect(&name).await?;
    check(
        status.token == Some(gl.token),
        format!("inspect of the lock reports {status:?}"),
    )?;
    b.release(&lock).await?;
    check(
        !b.inspect(&name).await?.held,
        "inspect of the lock reports the election's leader",
    )?;
    check(
        b.leader(&name).await?.is_some(),
        "releasing the lock ended the leadership",
    )?;

    // The older table's row still serves its lock, its token rising.
    let old = LockRequest::new(LockName::new("elect/old")?, ttl);
    let go = b
        .try_acquire(&old)
        .await?
        .ok_or("the older table's lock was refused")?;
    check(
        go.token.get() > 7,
        format!("token {} does not follow the row's 7", go.token.get()),
    )?;
    b.release(&old).await?;
    b.release(&second).await?;
    check(
        b.leader(&name).await?.is_none(),
        "a leader is reported after the last one resigned",
    )?;
    Ok(())
}
