//! Holder info on the SQL tables beyond the conformance suite: that the
//! statement granting a hold writes it, on tables created without the
//! column too, and what `list` answers where an election's row sorts apart
//! from its name.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Backend, HoldKind, HoldRecord, LockName, LockRequest};
use distlock_sql::SqlBackend;
use libtest_mimic::{Failed, Trial};

use super::election::{check, Raw};
use super::SqlFactory;

/// The holder-info trials every SQL backend runs.
pub(super) fn trials(f: &Arc<SqlFactory>, rt: &tokio::runtime::Runtime) -> Vec<Trial> {
    vec![integration_tests::trial(
        rt,
        format!(
            "{}::holder_info_is_written_by_the_granting_statement_and_listed_also_on_older_tables",
            f.name
        ),
        written_by_the_grant_and_listed(f.clone()),
    )]
}

fn req(name: &str, info: Option<&str>) -> Result<LockRequest, Failed> {
    Ok(
        LockRequest::new(LockName::new(name)?, Duration::from_secs(60))
            .with_holder_info(info.map(Arc::from)),
    )
}

/// Tables made as before holder info (the lock table without `value` and
/// `holder`, the permits table without `holder`, the shared holds' without
/// `token` and `holder`) get the columns when a client starts. Every
/// version of a hold's row that names its owner carries that hold's holder
/// info, for a first grant and for a freed row taken over (whose info is
/// overwritten, also by a request without any). `inspect`, `leader` and
/// `list` read it; `list` orders an election by its name although its row
/// (`h/a@election`) sorts after `h/a/b`, and cuts at the limit.
async fn written_by_the_grant_and_listed(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (t, url) = f.own_table("hold")?;
    let raw = Raw::connect(&url).await?;
    let old = raw.pick(
        "CREATE TABLE {t} (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,
                           expires_at TIMESTAMPTZ NOT NULL,
                           awaited BOOLEAN NOT NULL DEFAULT false);
         CREATE TABLE {t}_permits (name TEXT NOT NULL, owner TEXT NOT NULL,
                                   token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL,
                                   PRIMARY KEY (name, owner));
         CREATE TABLE {t}_shared (name TEXT NOT NULL, owner TEXT NOT NULL,
                                  expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (name, owner))",
        "CREATE TABLE {t} (
             name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
             owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL,
             token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB;
         CREATE TABLE {t}_permits (
             name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
             owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
             token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL,
             PRIMARY KEY (name, owner)) ENGINE=InnoDB;
         CREATE TABLE {t}_shared (
             name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
             owner CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
             expires_at DATETIME(6) NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB",
        "CREATE TABLE {t} (name TEXT PRIMARY KEY NOT NULL, owner TEXT,
                           token INTEGER NOT NULL, expires_at INTEGER NOT NULL);
         CREATE TABLE {t}_permits (name TEXT NOT NULL, owner TEXT NOT NULL,
                                   token INTEGER NOT NULL, expires_at INTEGER NOT NULL,
                                   PRIMARY KEY (name, owner));
         CREATE TABLE {t}_shared (name TEXT NOT NULL, owner TEXT NOT NULL,
                                  expires_at INTEGER NOT NULL, PRIMARY KEY (name, owner))",
    );
    raw.exec(&old.replace("{t}", &t)).await?;
    let b = SqlBackend::connect(&url).await?;
    // Row versions: triggers log them on PostgreSQL and SQLite; on MariaDB
    // system versioning keeps them (a trigger there would reset the token
    // a grant reports through `LAST_INSERT_ID`).
    let tables = [t.clone(), format!("{t}_permits"), format!("{t}_shared")];
    let log = match &raw {
        Raw::Pg(_) => {
            let mut sql = format!(
                "CREATE TABLE {t}_log (tbl TEXT, name TEXT, owner TEXT, holder TEXT);
                 CREATE FUNCTION {t}_logged() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN INSERT INTO {t}_log VALUES (TG_TABLE_NAME, NEW.name, NEW.owner, NEW.holder);
                   RETURN NEW; END $$;"
            );
            for table in &tables {
                sql += &format!(
                    "CREATE TRIGGER {table}_log AFTER INSERT OR UPDATE ON {table}
                       FOR EACH ROW EXECUTE FUNCTION {t}_logged();"
                );
            }
            sql
        }
        Raw::My(_) => tables
            .iter()
            .map(|table| format!("ALTER TABLE {table} ADD SYSTEM VERSIONING;"))
            .collect(),
        Raw::Lite(_) => {
            let mut sql =
                format!("CREATE TABLE {t}_log (tbl TEXT, name TEXT, owner TEXT, holder TEXT);");
            for table in &tables {
                for event in ["INSERT", "UPDATE"] {
                    sql += &format!(
                        "CREATE TRIGGER {table}_{event} AFTER {event} ON {table}
                           BEGIN INSERT INTO {t}_log
                                 VALUES ('{table}', NEW.name, NEW.owner, NEW.holder); END;"
                    );
                }
            }
            sql
        }
    };
    raw.exec(&log).await?;
    // The holder info of each version of `table`'s row `name` that names
    // `req`'s owner (at least one).
    let versions = |table: &str, name: &str, req: &LockRequest| {
        let sql = raw.pick(
            "SELECT holder FROM {t}_log WHERE tbl = '{table}' AND",
            "SELECT holder FROM {table} FOR SYSTEM_TIME ALL WHERE",
            "SELECT holder FROM {t}_log WHERE tbl = '{table}' AND",
        );
        let sql = format!(
            "{} name = '{name}' AND owner = '{}'",
            sql.replace("{t}", &t).replace("{table}", table),
            req.owner
        );
        let (raw, name) = (&raw, name.to_string());
        async move {
            let seen = raw.texts(&sql).await?;
            check(
                !seen.is_empty(),
                format!("no version of {name} names its owner"),
            )?;
            Ok::<_, Failed>(seen)
        }
    };
    let written_by = |seen: Vec<Option<String>>, req: &LockRequest, what: &str| {
        let want = req.holder_info.as_deref().map(str::to_string);
        check(
            seen.iter().all(|v| *v == want),
            format!("{what}: the row versions carry {seen:?}, not only {want:?}"),
        )
    };

    // A lock's grant on a new row, then on the row freed and taken over,
    // by a request with other holder info and by one with none.
    let first = req("h/a", Some("web-1 pid 7"))?;
    b.try_acquire(&first).await?.ok_or("h/a was refused")?;
    written_by(versions(&t, "h/a", &first).await?, &first, "first lock")?;
    b.release(&first).await?;
    let bare = req("h/a", None)?;
    b.try_acquire(&bare).await?.ok_or("freed h/a was refused")?;
    written_by(
        versions(&t, "h/a", &bare).await?,
        &bare,
        "lock without info",
    )?;
    check(
        b.inspect(&first.name).await?.holder_info.is_none(),
        "inspect reads the freed holder's info",
    )?;
    b.release(&bare).await?;
    let lock = req("h/a", Some("web-2 pid 8 (`jobs` 'run')"))?;
    let g_lock = b.try_acquire(&lock).await?.ok_or("h/a was refused")?;
    written_by(versions(&t, "h/a", &lock).await?, &lock, "second lock")?;
    let status = b.inspect(&lock.name).await?;
    check(
        status.holder_info.as_deref() == Some("web-2 pid 8 (`jobs` 'run')"),
        format!("inspect reads {status:?}"),
    )?;

    let leader = LockRequest::leader(lock.name.clone(), Duration::from_secs(60), "proposal")
        .with_holder_info(Some(Arc::from("leader-host")));
    let g_leader = b
        .try_acquire(&leader)
        .await?
        .ok_or("the campaign was refused")?;
    written_by(
        versions(&t, "h/a@election", &leader).await?,
        &leader,
        "leader",
    )?;
    let led = b.leader(&lock.name).await?.ok_or("nobody leads")?;
    check(
        led.holder_info.as_deref() == Some("leader-host"),
        format!("leader reads {led:?}"),
    )?;

    let inner = req("h/a/b", Some("inner"))?;
    let g_inner = b.try_acquire(&inner).await?.ok_or("h/a/b was refused")?;

    let mut shared = req("h/s", Some("reader"))?;
    shared.kind = HoldKind::Shared;
    let g_shared = b.try_acquire(&shared).await?.ok_or("h/s was refused")?;
    written_by(
        versions(&tables[2], "h/s", &shared).await?,
        &shared,
        "shared hold",
    )?;
    let status = b.inspect(&shared.name).await?;
    check(
        status.holder_info.is_none(),
        format!("inspect of a shared-held lock reads {status:?}"),
    )?;

    let permit = LockRequest::permit(LockName::new("h/p")?, Duration::from_secs(60), 3)
        .with_holder_info(Some(Arc::from("worker")));
    let g_permit = b.try_acquire(&permit).await?.ok_or("h/p was refused")?;
    written_by(
        versions(&tables[1], "h/p", &permit).await?,
        &permit,
        "permit",
    )?;

    // Outside the prefix: listed with "" only.
    let other = req("hx", Some("other"))?;
    b.try_acquire(&other).await?.ok_or("hx was refused")?;

    let info = |s: &str| Some(s.to_string());
    let want = [
        HoldRecord::new("h/a", HoldKind::Exclusive)
            .with_token(Some(g_lock.token))
            .with_holder_info(info("web-2 pid 8 (`jobs` 'run')")),
        HoldRecord::new("h/a", HoldKind::Leader)
            .with_token(Some(g_leader.token))
            .with_holder_info(info("leader-host"))
            .with_value(info("proposal")),
        HoldRecord::new("h/a/b", HoldKind::Exclusive)
            .with_token(Some(g_inner.token))
            .with_holder_info(info("inner")),
        HoldRecord::new("h/p", HoldKind::Permits { limit: 3 })
            .with_token(Some(g_permit.token))
            .with_holder_info(info("worker")),
        HoldRecord::new("h/s", HoldKind::Shared)
            .with_token(Some(g_shared.token))
            .with_holder_info(info("reader")),
    ];
    let listed = |prefix: &'static str, limit: usize| {
        let b = &b;
        async move {
            let got = b.list(prefix, limit).await?;
            for r in &got {
                check(
                    r.remaining.is_some_and(|d| {
                        d <= Duration::from_secs(60) && d > Duration::from_secs(30)
                    }),
                    format!("{r:?} has no remaining lease near its TTL"),
                )?;
            }
            Ok::<_, Failed>(
                got.into_iter()
                    .map(|r| r.with_remaining(None))
                    .collect::<Vec<_>>(),
            )
        }
    };
    let all = listed("h/", 100).await?;
    check(all == want, format!("list(\"h/\") answers {all:#?}"))?;
    for limit in 1..=want.len() {
        let got = listed("h", limit).await?;
        check(
            got.len() == limit && got[..] == want[..limit],
            format!("list(\"h\", {limit}) answers {got:#?}"),
        )?;
    }
    check(
        listed("", 100).await?.iter().any(|r| r.name == "hx"),
        "list(\"\") leaves out hx",
    )?;
    check(
        listed("h/a/", 100).await?.len() == 1,
        "list(\"h/a/\") answers more than h/a/b",
    )?;

    // Released holds are gone; the lock left held stays.
    for r in [&leader, &inner, &shared, &permit, &other] {
        check(
            b.release(r).await?,
            format!("{} was no longer held", r.name),
        )?;
    }
    let left = listed("", 100).await?;
    check(
        left == want[..1],
        format!("after the releases, list answers {left:#?}"),
    )?;
    b.release(&lock).await?;
    check(
        listed("", 100).await?.is_empty(),
        "a released lock is still listed",
    )?;
    Ok(())
}
