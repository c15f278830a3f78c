//! The conformance suite on MariaDB (the MySQL backend), on it over TLS,
//! plus its own edges.

mod sql_support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Backend, Error, LockClient, LockName, LockRequest};
use distlock_sql::sqlx::{self, Connection};
use distlock_sql::{SqlBackend, SqlConfig};
use integration_tests::harness::mariadb as my;
use integration_tests::harness::tls::TestCerts;
use integration_tests::harness::ServerKind;
use integration_tests::trial;
use libtest_mimic::Failed;
use sql_support::{Source, SqlFactory, Started};

fn main() {
    // A server that takes TCP clients only over TLS, reached by the name
    // its certificate holds and verified in full, as a password user.
    let tls = SqlFactory::new(
        "mysql::tls",
        Source::Start(Box::new(|| {
            let (process, certs) = my::spawn_tls().map_err(|e| e.to_string())?;
            let port = process.port;
            Ok(Started {
                url: tls_url("localhost", port, "VERIFY_IDENTITY", &certs.ca),
                port,
                certs: Some(certs),
                process,
            })
        })),
    );
    // The whole suite once more with waiters queueing, first come, first
    // served.
    let fifo = SqlFactory::new(
        "mysql::fifo_suite",
        Source::Start(Box::new(|| {
            let process = my::spawn().map_err(|e| e.to_string())?;
            let port = process.port;
            Ok(Started {
                url: format!("{}?fifo=true", ServerKind::MariaDb.url("127.0.0.1", port)),
                port,
                certs: None,
                process,
            })
        })),
    );
    sql_support::run_suite(
        "mysql",
        Source::Server(ServerKind::MariaDb),
        move |f, rt| {
            let mut trials = integration_tests::trials(tls.clone(), rt);
            trials.extend(integration_tests::trials(fifo.clone(), rt));
            trials.extend(sql_support::fifo_mixed("mysql::fifo_mixed", f, rt));
            trials.extend([
            trial(
                rt,
                "mysql::a_wait_on_a_server_that_stops_answering_ends_by_its_deadline",
                stalled_wait(f.clone()),
            ),
            trial(
                rt,
                "mysql::tls_demanded_of_a_server_without_it_is_misconfigured",
                {
                    let f = f.clone();
                    async move {
                        sql_support::tls_demanded_of_a_plain_server(&f.url()?, "ssl-mode=REQUIRED")
                            .await
                    }
                },
            ),
            trial(
                rt,
                "mysql::fifo::grants_in_arrival_order_waking_only_the_head",
                fifo_order(sql_support::queued_row(false, "fifo/order"), 1),
            ),
            trial(
                rt,
                "mysql::fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(sql_support::queued_row(false, "fifo/cancel")),
            ),
            trial(
                rt,
                "mysql::fifo::two_databases_on_one_server_keep_their_queues_apart",
                fifo_two_databases(),
            ),
            trial(
                rt,
                "mysql::fifo::election::grants_in_arrival_order_waking_only_the_head",
                fifo_order(sql_support::queued_row(true, "fifo/order"), 1),
            ),
            trial(
                rt,
                "mysql::fifo::election::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(sql_support::queued_row(true, "fifo/cancel")),
            ),
            trial(
                rt,
                "mysql::fifo::election::an_eviction_wakes_the_queued_head",
                fifo_evict(),
            ),
            trial(
                rt,
                "mysql::fifo::shared::the_last_readers_release_wakes_a_queued_writer",
                fifo_last_reader(),
            ),
            trial(
                rt,
                "mysql::fifo::shared::grants_in_arrival_order_waking_only_the_head",
                fifo_order_shared(),
            ),
            trial(
                rt,
                "mysql::fifo::shared::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(sql_support::queued_shared("fifo/cancel")),
            ),
            trial(
                rt,
                "mysql::fifo::shared::readers_never_pass_a_queued_writer",
                fifo_readers(),
            ),
            trial(
                rt,
                "mysql::fifo::shared::a_writer_that_leaves_lets_the_readers_behind_it_in",
                fifo_writer_leaves(),
            ),
            trial(
                rt,
                "mysql::fifo::semaphore::grants_in_arrival_order_waking_only_the_head",
                fifo_order(sql_support::queued_semaphore_row("fifo/order"), 3),
            ),
            trial(
                rt,
                "mysql::fifo::semaphore::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                fifo_cancel(sql_support::queued_semaphore_row("fifo/cancel")),
            ),
            trial(
                rt,
                "mysql::fifo::semaphore::permits_freed_at_once_each_reach_a_waiter",
                fifo_freed_at_once(),
            ),
            trial(
                rt,
                "mysql::fifo::semaphore::a_cut_off_waiter_holds_up_the_queue_only_until_the_server_drops_it",
                fifo_cut(sql_support::queued_semaphore_row("fifo/cut")),
            ),
            trial(
                rt,
                "mysql::fifo::a_cut_off_waiter_holds_up_the_queue_only_until_the_server_drops_it",
                fifo_cut(sql_support::queued_row(false, "fifo/cut")),
            ),
            trial(
                rt,
                "mysql::the_longest_table_name_serves_every_kind",
                sql_support::the_longest_table_name_serves_every_kind(f.clone()),
            ),
            trial(
                rt,
                "mysql::current_procedures_are_left_in_place",
                current_procedures_are_left_in_place(f.clone()),
            ),
            trial(
                rt,
                "mysql::lock_names_are_case_sensitive",
                case_sensitive(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_lock_wait_timeout_is_unavailable",
                lock_wait_timeout(),
            ),
            trial(
                rt,
                "mysql::a_connection_limit_is_unavailable",
                connection_limit(),
            ),
            trial(
                rt,
                "mysql::tls::verify_identity_by_the_certificates_name_is_encrypted",
                tls_is_encrypted(tls.clone()),
            ),
            trial(
                rt,
                "mysql::tls::a_wrong_ca_is_a_typed_error_without_the_password",
                tls_wrong_ca(tls.clone()),
            ),
            trial(
                rt,
                "mysql::tls::verify_identity_by_an_address_the_certificate_lacks_is_a_typed_error",
                tls_wrong_host(tls.clone()),
            ),
            trial(
                rt,
                "mysql::tls::verify_ca_checks_the_ca_and_the_host_name",
                tls_verify_ca(tls.clone()),
            ),
            trial(
                rt,
                "mysql::tls::the_server_refuses_plaintext",
                tls_plaintext_refused(tls.clone()),
            ),
            trial(
                rt,
                "mysql::a_wrong_password_or_user_is_misconfigured_not_retryable",
                wrong_credentials(tls.clone()),
            ),
            trial(
                rt,
                "mysql::a_role_with_only_the_listed_rights_serves_every_kind",
                restricted_user(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing",
                shared_renewal_after_freed(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_limit_distlock_did_not_write_is_misconfigured",
                foreign_limit(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_renewal_committing_at_expiry_keeps_its_permit",
                renewal_at_expiry(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_renewal_given_up_mid_transaction_leaves_its_connection_clean",
                renewal_given_up(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_holder_cut_off_inside_a_renewals_transaction_holds_its_rows_no_longer",
                renewal_cut_off(f.clone()),
            ),
            trial(
                rt,
                "mysql::fifo::semaphore::a_queued_waiter_learns_of_a_changed_limit",
                fifo_limit_changed(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_stale_grant_routine_is_replaced",
                stale_grant_routine(f.clone()),
            ),
            trial(
                rt,
                "mysql::a_connection_time_zone_moves_no_lease",
                time_zones(f.clone()),
            ),
        ]);
            trials
        },
    )
}

/// Clients whose connections keep different time zones (`timezone=` in the
/// URL) judge every lease alike: none of them takes a live one, of any kind.
async fn time_zones(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (_, base) = f.own_table("tz")?;
    let mut clients = Vec::new();
    for zone in ["%2B00:00", "%2B05:00", "-05:00"] {
        let b = SqlBackend::connect(&format!("{base}&timezone={zone}")).await?;
        clients.push((zone, LockClient::new(b)));
    }
    let ttl = Duration::from_secs(60);
    for (held_in, holder) in &clients {
        let lock = holder.lock("tz/lock").ttl(ttl).acquire().await?;
        let permits = holder.semaphore("tz/sem", 1).ttl(ttl).acquire().await?;
        let leader = holder.election("tz/elect").ttl(ttl).campaign("v").await?;
        for (asked_in, other) in &clients {
            if asked_in == held_in {
                continue;
            }
            if other.lock("tz/lock").try_acquire().await?.is_some()
                || other.semaphore("tz/sem", 1).try_acquire().await?.is_some()
                || other
                    .election("tz/elect")
                    .try_campaign("w")
                    .await?
                    .is_some()
            {
                return Err(format!(
                    "a client in {asked_in} took a live hold of a client in {held_in}"
                )
                .into());
            }
        }
        lock.release().await?;
        permits.release().await?;
        leader.resign().await?;
    }
    Ok(())
}

/// `Jobs` and `jobs` are two locks, as on every other backend.
/// Every procedure a client creates with its tables (with `fifo`, three) is
/// left in place by the next client that starts: its stored body is this
/// version's. Replacing one drops it first, and a concurrent `CALL` would
/// fail while it is missing.
async fn current_procedures_are_left_in_place(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("procs")?;
    let url = format!("{url}&fifo=true");
    let admin = f.admin_pool::<sqlx::MySql>().await?;
    let created = || async {
        sqlx::query_as::<_, (String, String)>(&format!(
            "SELECT ROUTINE_NAME, CAST(CREATED AS CHAR) FROM information_schema.ROUTINES
              WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE '{table}\\_%'
              ORDER BY ROUTINE_NAME"
        ))
        .fetch_all(&admin)
        .await
        .map_err(|e| Failed::from(e.to_string()))
    };
    SqlBackend::connect(&url).await?;
    let before = created().await?;
    if before.len() != 3 {
        return Err(format!("expected three procedures, found {before:?}").into());
    }
    // CREATED has whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    SqlBackend::connect(&url).await?;
    let after = created().await?;
    if after != before {
        return Err(format!("procedures were made again: {before:?} became {after:?}").into());
    }
    Ok(())
}

async fn case_sensitive(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let c = LockClient::new(f.connect(SqlConfig::default()).await?);
    let upper = c
        .lock("Case/Lock")
        .try_acquire()
        .await?
        .ok_or("Case/Lock not granted")?;
    if c.lock("case/lock").try_acquire().await?.is_none() {
        return Err("case/lock was taken as the same lock as Case/Lock".into());
    }
    upper.release().await?;
    Ok(())
}

/// The URL of a [`my::spawn_tls`] server at `host`.
/// The rights the guarantees list: `SELECT`, `INSERT`, `UPDATE` and
/// `DELETE` on the tables, `EXECUTE` on the procedures named after the
/// table. The user has no password.
async fn restricted_user(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let admin = f.admin_pool::<sqlx::MySql>().await?;
    let make_user = |table: String, user: String, rights: bool| {
        let admin = admin.clone();
        async move {
            let mut sql = vec![format!("CREATE USER '{user}'@'%'")];
            if rights {
                for t in ["", "_sems", "_permits", "_shared", "_writers"] {
                    sql.push(format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON {table}{t} TO '{user}'@'%'"
                    ));
                }
                let procedures: Vec<String> = sqlx::query_scalar(
                    "SELECT ROUTINE_NAME FROM information_schema.ROUTINES
                      WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE CONCAT(?, '\\_%')",
                )
                .bind(&table)
                .fetch_all(&admin)
                .await
                .map_err(|e| Failed::from(e.to_string()))?;
                if procedures.is_empty() {
                    return Err(format!("no procedures named after {table}").into());
                }
                for p in procedures {
                    sql.push(format!("GRANT EXECUTE ON PROCEDURE {p} TO '{user}'@'%'"));
                }
            }
            for statement in sql {
                sqlx::raw_sql(&statement)
                    .execute(&admin)
                    .await
                    .map_err(|e| Failed::from(format!("{statement}: {e}")))?;
            }
            Ok(())
        }
    };
    let url = f.url()?;
    sql_support::a_role_with_only_the_listed_rights_serves_every_kind(
        &f,
        make_user,
        |user, params| {
            format!(
                "{}?{params}",
                url.replacen("mysql://root@", &format!("mysql://{user}@"), 1)
            )
        },
    )
    .await
}

/// See [`sql_support::wrong_credentials_are_misconfigured`].
async fn wrong_credentials(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let ca = certs.ca.display().to_string();
    sql_support::wrong_credentials_are_misconfigured(my::TLS_USER, my::TLS_PASSWORD, |user, pw| {
        format!(
            "mysql://{user}:{pw}@localhost:{port}/{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}",
            my::DATABASE
        )
    })
    .await
}

fn tls_url(host: &str, port: u16, ssl_mode: &str, ca: &Path) -> String {
    format!(
        "mysql://{}:{}@{host}:{port}/{}?ssl-mode={ssl_mode}&ssl-ca={}",
        my::TLS_USER,
        my::TLS_PASSWORD,
        my::DATABASE,
        ca.display()
    )
}

fn tls_certs(f: &SqlFactory) -> Result<(u16, &TestCerts), Failed> {
    let s = f.started()?;
    Ok((s.port, s.certs.as_ref().ok_or("no certificates")?))
}

/// A lock is taken and released over VERIFY_IDENTITY TLS, and the
/// connection is encrypted (`Ssl_cipher` of the session). The server
/// refuses plaintext TCP clients besides.
async fn tls_is_encrypted(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let client = LockClient::new(f.connect(SqlConfig::default()).await?);
    let g = client.lock("tls/encrypted").acquire().await?;
    let pool = sqlx::MySqlPool::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
    if cipher.is_empty() {
        return Err("the session has no TLS cipher".into());
    }
    if !g.release().await? {
        return Err("release over TLS reported the lock as not held".into());
    }
    Ok(())
}

/// A CA that did not sign the server's certificate.
async fn tls_wrong_ca(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, _) = tls_certs(&f)?;
    let other = sql_support::unrelated_ca().await?;
    let url = tls_url("localhost", port, "VERIFY_IDENTITY", &other);
    let text =
        sql_support::certificate_is_rejected(&url, my::TLS_PASSWORD, "the CA is another").await?;
    if !text.contains("UnknownIssuer") {
        return Err(format!("the message does not say the issuer is unknown: {text}").into());
    }
    Ok(())
}

/// The certificate names `localhost` only: VERIFY_IDENTITY by address fails.
async fn tls_wrong_host(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let url = tls_url("127.0.0.1", port, "VERIFY_IDENTITY", &certs.ca);
    let text = sql_support::certificate_is_rejected(
        &url,
        my::TLS_PASSWORD,
        "the host is not in the certificate",
    )
    .await?;
    if !text.contains("not valid for name") {
        return Err(format!("the message does not name the host mismatch: {text}").into());
    }
    Ok(())
}

/// VERIFY_CA checks the CA: the right one connects, another is the typed
/// error. sqlx 0.8 (with rustls 0.23) checks the host name under VERIFY_CA
/// as well, so by an address the certificate lacks it is refused as under
/// VERIFY_IDENTITY: stricter than MySQL's client, never laxer; the README
/// says so.
async fn tls_verify_ca(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let url = tls_url("localhost", port, "VERIFY_CA", &certs.ca);
    let client = LockClient::new(SqlBackend::connect(&url).await?);
    let g = client
        .lock("tls/verify-ca")
        .try_acquire()
        .await?
        .ok_or("VERIFY_CA: lock not granted")?;
    g.release().await?;
    let other = sql_support::unrelated_ca().await?;
    let wrong_ca = tls_url("localhost", port, "VERIFY_CA", &other);
    sql_support::certificate_is_rejected(&wrong_ca, my::TLS_PASSWORD, "VERIFY_CA, another CA")
        .await?;
    let by_address = tls_url("127.0.0.1", port, "VERIFY_CA", &certs.ca);
    sql_support::certificate_is_rejected(&by_address, my::TLS_PASSWORD, "VERIFY_CA by address")
        .await?;
    Ok(())
}

/// The server takes no plaintext TCP client, so the TLS cases above do
/// test TLS: ssl-mode=DISABLED is refused, and not as retryable.
async fn tls_plaintext_refused(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, _) = tls_certs(&f)?;
    let url = format!(
        "mysql://{}:{}@localhost:{port}/{}?ssl-mode=DISABLED",
        my::TLS_USER,
        my::TLS_PASSWORD,
        my::DATABASE
    );
    match SqlBackend::connect(&url).await {
        Ok(_) => Err("a plaintext client connected".into()),
        Err(e) if e.is_retryable() => {
            Err(format!("plaintext: a refusal counted as retryable: {e:?}").into())
        }
        Err(e) => {
            if format!("{e:?}").contains(my::TLS_PASSWORD) {
                return Err(format!("the error shows the password: {e:?}").into());
            }
            // The user is created REQUIRE SSL: the server says only
            // "access denied", and the error names that cause too.
            match &e {
                Error::Misconfigured { message, .. } if message.contains("REQUIRE SSL") => Ok(()),
                other => Err(format!("plaintext: {other:?}").into()),
            }
        }
    }
}

/// See [`sql_support::renewal_committing_at_expiry_keeps_its_permit`]; the
/// renewal is the backend's statement, the wait is seen in InnoDB's list of
/// transactions.
async fn renewal_at_expiry(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("renew")?;
    let admin: sqlx::MySqlPool = f.admin_pool().await?;
    let renew = format!(
        "UPDATE {table}_permits SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND
          WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
    );
    let pool = admin.clone();
    sql_support::renewal_committing_at_expiry_keeps_its_permit(
        &url,
        move |name, owner, updated, commit| {
            tokio::spawn(async move {
                let mut tx = pool.begin().await?;
                let done = sqlx::query(&renew)
                    .bind(name)
                    .bind(owner)
                    .execute(&mut *tx)
                    .await?;
                let _ = updated.send(done.rows_affected());
                let _ = commit.await;
                tx.commit().await
            })
        },
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'",
            )
            .fetch_one(&admin)
            .await?;
            Ok(n > 0)
        },
    )
    .await
}

/// See [`sql_support::a_stale_grant_routine_is_replaced`]: the stale
/// procedure answers that the semaphore exists and grants nothing.
async fn stale_grant_routine(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("stale")?;
    let admin: sqlx::MySqlPool = f.admin_pool().await?;
    let stale = format!(
        "CREATE PROCEDURE {table}_permit(IN p_name VARCHAR(255), IN p_owner CHAR(36),
            IN p_ttl_us BIGINT, IN p_limit INT UNSIGNED, IN p_holder TEXT)
         BEGIN SELECT 1, NULL, NULL; END"
    );
    let drop = format!("DROP PROCEDURE {table}_permit");
    sql_support::a_stale_grant_routine_is_replaced(&url, || async move {
        sqlx::raw_sql(&drop).execute(&admin).await?;
        sqlx::raw_sql(&stale).execute(&admin).await.map(|_| ())
    })
    .await
}

/// A statement that waits for a lock's row longer than
/// `innodb_lock_wait_timeout` (error 1205, SQLSTATE HY000) is `Unavailable`:
/// the transaction holding the row ends, and the next try goes through. On a
/// server of its own, whose global wait it lowers to 1 s.
async fn lock_wait_timeout() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let admin = sqlx::MySqlPool::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let sql = |statement: &'static str| {
        let admin = admin.clone();
        async move {
            sqlx::raw_sql(statement)
                .execute(&admin)
                .await
                .map(|_| ())
                .map_err(|e| Failed::from(format!("{statement}: {e}")))
        }
    };
    sql("SET GLOBAL innodb_lock_wait_timeout = 1").await?;
    let result = async {
        // Connected after the change: its connections wait 1 s.
        let backend = SqlBackend::connect(&url).await?;
        let req = LockRequest::new(LockName::new("wait/row")?, Duration::from_secs(60));
        // The row exists from now on.
        backend
            .try_acquire(&req)
            .await?
            .ok_or("the free lock was refused")?;
        backend.release(&req).await?;
        let mut tx = admin.begin().await.map_err(|e| e.to_string())?;
        sqlx::query("SELECT name FROM distlock_locks WHERE name = 'wait/row' FOR UPDATE")
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| format!("locking the row: {e}"))?;
        let start = Instant::now();
        let waited = backend.try_acquire(&req).await;
        let took = start.elapsed();
        tx.rollback().await.map_err(|e| e.to_string())?;
        match waited {
            Err(e @ distlock_core::Error::Unavailable { .. }) if e.is_retryable() => {
                eprintln!("after {took:?}: {e}");
            }
            other => {
                return Err(format!(
                    "a timed-out row wait: expected Unavailable, got {other:?} after {took:?}"
                )
                .into())
            }
        }
        backend
            .try_acquire(&req)
            .await?
            .ok_or("the lock was refused once the row was free")?;
        Ok::<_, Failed>(())
    }
    .await;
    sql("SET GLOBAL innodb_lock_wait_timeout = DEFAULT").await?;
    result
}

/// A user at its limit of connections (`MAX_USER_CONNECTIONS 1`, with one
/// open) and a server at `max_connections` (error 1040) refuse a client's
/// connect as `Unavailable`: a connection that closes lets the next try in.
/// On a server of its own, whose limit it lowers.
async fn connection_limit() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let admin = sqlx::MySqlPool::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let user = "one_conn";
    sqlx::raw_sql(&format!(
        "CREATE USER '{user}'@'%' WITH MAX_USER_CONNECTIONS 1;
         GRANT ALL ON {}.* TO '{user}'@'%'",
        my::DATABASE
    ))
    .execute(&admin)
    .await
    .map_err(|e| e.to_string())?;
    let user_url = url.replacen("mysql://root@", &format!("mysql://{user}@"), 1);
    let refused = |what: &'static str| {
        let user_url = user_url.clone();
        async move {
            match SqlBackend::connect(&user_url).await {
                Err(e @ distlock_core::Error::Unavailable { .. }) if e.is_retryable() => {
                    eprintln!("{what}: {e}");
                    Ok(())
                }
                other => Err(Failed::from(format!(
                    "{what}: expected Unavailable, got {other:?}"
                ))),
            }
        }
    };
    let held = sqlx::MySqlConnection::connect(&user_url)
        .await
        .map_err(|e| e.to_string())?;
    refused("the user's one connection open").await?;
    held.close().await.map_err(|e| e.to_string())?;
    // The server counts the closed connection out soon after.
    let start = Instant::now();
    loop {
        match sqlx::MySqlConnection::connect(&user_url).await {
            Ok(c) => {
                c.close().await.map_err(|e| e.to_string())?;
                break;
            }
            Err(e) if start.elapsed() > Duration::from_secs(5) => {
                return Err(format!("the user's connection closed, still refused: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    // MariaDB's max_connections is at least 10: the administrator opens
    // that many, and the limit is set to the connections open, which
    // leaves none for a user without administrative rights.
    let connected = || async {
        sqlx::query_as::<_, (String, String)>("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
            .fetch_one(&admin)
            .await
            .map_err(|e| Failed::from(e.to_string()))?
            .1
            .parse::<u32>()
            .map_err(|e| Failed::from(e.to_string()))
    };
    let mut open = Vec::new();
    while connected().await? < 10 {
        open.push(
            sqlx::MySqlConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    sqlx::raw_sql(&format!(
        "SET GLOBAL max_connections = {}",
        connected().await?
    ))
    .execute(&admin)
    .await
    .map_err(|e| e.to_string())?;
    let result = refused("the server's connections all taken").await;
    sqlx::raw_sql("SET GLOBAL max_connections = DEFAULT")
        .execute(&admin)
        .await
        .map_err(|e| e.to_string())?;
    drop(open);
    result
}

/// A server of its own, so that only a case's statements are counted, or
/// for a case that changes the server's settings.
async fn fifo_server() -> Result<(integration_tests::harness::ServerProcess, String), Failed> {
    let process = tokio::task::spawn_blocking(my::spawn)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = ServerKind::MariaDb.url("127.0.0.1", process.port);
    Ok((process, url))
}

/// Two databases on one server, each with the default lock table: a
/// waiter queued on `jobs` in one does not keep `jobs` in the other from
/// being granted at once (the server's user locks, which hold the queues,
/// belong to the whole server).
async fn fifo_two_databases() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let mut create = my::client(server.port).map_err(|e| e.to_string())?;
    create.args(["-e", "CREATE DATABASE distlock_other"]);
    integration_tests::harness::process::run_client(create)?;
    let (base, _) = url.rsplit_once('/').ok_or("the URL names no database")?;
    let first = LockClient::new(SqlBackend::connect(&format!("{url}?fifo=true")).await?);
    let queued = LockClient::new(SqlBackend::connect(&format!("{url}?fifo=true")).await?);
    let other =
        LockClient::new(SqlBackend::connect(&format!("{base}/distlock_other?fifo=true")).await?);
    let held = first.lock("jobs").acquire().await?;
    let waiter = tokio::spawn(async move {
        let g = queued
            .lock("jobs")
            .wait(Duration::from_secs(30))
            .acquire()
            .await?;
        g.release().await
    });
    let head = format!(
        "SELECT IS_USED_LOCK(CONCAT('distlock-q-', MD5('{}/distlock_locks/jobs'))) IS NOT NULL",
        my::DATABASE
    );
    let start = Instant::now();
    while mariadb_number(server.port, &head)? == 0 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("the waiter did not queue within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let granted = other.lock("jobs").try_acquire().await?;
    let granted = granted.ok_or("a free lock in another database was refused")?;
    granted.release().await?;
    held.release().await?;
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .map_err(|_| "the queued waiter was not granted within 10 s")?
        .map_err(|e| e.to_string())??;
    Ok(())
}

/// One number from the `mariadb` client at `port`.
fn mariadb_number(port: u16, sql: &str) -> Result<u64, Failed> {
    let mut c = my::client(port).map_err(|e| e.to_string())?;
    c.args(["-e", sql]);
    let out = integration_tests::harness::process::run_client(c)?;
    out.trim()
        .parse()
        .map_err(|_| format!("{sql} answered {out:?}").into())
}

/// The waiters in `name`'s queue: the connections blocked in the queue's
/// `GET_LOCK`, and its head.
fn fifo_queued(port: u16, name: &str) -> integration_tests::fifo::Count {
    let sql = format!(
        "SELECT (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock')
              + (IS_USED_LOCK(CONCAT('distlock-q-', MD5('{db}/distlock_locks/{name}'))) IS NOT NULL)",
        db = my::DATABASE
    );
    Arc::new(move || mariadb_number(port, &sql))
}

/// Twenty waiters' grants come in arrival order, and while they hand the
/// lock on only the releasers and the head send anything (the statements
/// clients execute, and `KILL`s): per handoff one release, the
/// `KILL QUERY` that ends the head's sleep, the head's grant and the new
/// head's sleep: four. A release that runs before the server has seen the releaser's own
/// queue connection close finds that one still heading the queue: its
/// `KILL` wakes nobody and the new head's sleep sees the free row instead
/// (three), and the last release may send one such `KILL` more. A `KILL`
/// that lands as the next head's `GET_LOCK` returns makes it ask once more
/// (one more). Measured: 79 to 82 for 20 handoffs; the bound allows one
/// such extra request per handoff (load makes the races more frequent),
/// while waking every waiter at each release would add about n²/2 (210).
/// Queue connections here are kept a minute, so no sleep ends by itself
/// while the test counts. On an election the waiters campaign, queueing
/// the same way; on a semaphore they queue the same way for its `permits`
/// permits, each of the holder's releases but the last adding one release
/// and its `KILL`.
async fn fifo_order(
    target: (integration_tests::fifo::Queued, String),
    permits: u64,
) -> Result<(), Failed> {
    let n = 20;
    fifo_order_counted(target, n, 3 * n..=5 * n + 2 * permits).await
}

/// Twenty readers queued behind a writer: the writer's release wakes the
/// head, and each reader, granted, gives its place up to the next, which
/// joins the readers at once. Per reader: the head's sleep, the grant's two
/// statements and the release's three (six), and a `KILL` from each
/// release that finds the row free (the readers before it gone) while a
/// reader heads the queue. Measured: 136 to 139 for 20 readers.
async fn fifo_order_shared() -> Result<(), Failed> {
    let n = 20;
    fifo_order_counted(sql_support::queued_shared("fifo/order"), n, 6 * n..=8 * n).await
}

async fn fifo_order_counted(
    (what, row): (integration_tests::fifo::Queued, String),
    n: u64,
    expected: std::ops::RangeInclusive<u64>,
) -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let port = server.port;
    let requests: integration_tests::fifo::Count = Arc::new(move || {
        mariadb_number(
            port,
            "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS
              WHERE VARIABLE_NAME IN ('COM_STMT_EXECUTE', 'COM_KILL')",
        )
    });
    integration_tests::fifo::grants_in_arrival_order(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        what,
        n as usize,
        fifo_queued(port, &row),
        requests,
        expected,
    )
    .await
}

async fn fifo_cancel((what, row): (integration_tests::fifo::Queued, String)) -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let lease = Duration::from_secs(60);
    integration_tests::fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis()),
        what,
        lease,
        fifo_queued(server.port, &row),
    )
    .await
}

async fn fifo_freed_at_once() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let lease = Duration::from_secs(60);
    let (what, row) = sql_support::queued_semaphore_row("fifo/at-once");
    integration_tests::fifo::permits_freed_at_once_each_reach_a_waiter(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis()),
        what,
        lease,
        fifo_queued(server.port, &row),
    )
    .await
}

async fn fifo_readers() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let name = "fifo/readers";
    integration_tests::fifo::readers_never_pass_a_queued_writer(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        name,
        fifo_queued(server.port, name),
    )
    .await
}

async fn fifo_writer_leaves() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let name = "fifo/leaves";
    integration_tests::fifo::a_writer_that_leaves_lets_the_readers_behind_it_in(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        name,
        fifo_queued(server.port, name),
    )
    .await
}

async fn fifo_last_reader() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    sql_support::the_last_readers_release_wakes_a_queued_writer(&url, |row| {
        fifo_queued(server.port, row)
    })
    .await
}

async fn fifo_evict() -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    sql_support::an_eviction_wakes_the_queued_head(&url, |row| fifo_queued(server.port, row)).await
}

/// The cut-off waiter's pool and queue connection run through a proxy that
/// then drops everything; the server drops a silent queue connection after
/// 3 s (the default queue lease).
async fn fifo_cut((what, row): (integration_tests::fifo::Queued, String)) -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let proxy =
        integration_tests::harness::proxy::Proxy::start(server.port).map_err(|e| e.to_string())?;
    let proxied = format!(
        "{}?fifo=true",
        ServerKind::MariaDb.url("127.0.0.1", proxy.port)
    );
    integration_tests::fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true"),
        &proxied,
        std::slice::from_ref(&proxy),
        what,
        SqlConfig::default().queue_lease,
        fifo_queued(server.port, &row),
    )
    .await
}

/// A client on a pool of one connection, through a proxy to `f`'s server
/// that the test can slow down or silence.
async fn proxied_pool_of_one(
    f: &SqlFactory,
) -> Result<(integration_tests::harness::proxy::Proxy, LockClient), Failed> {
    let url = f.url()?;
    let (_, port) = integration_tests::harness::host_port(&url).ok_or("no port in the URL")?;
    let proxy = integration_tests::harness::proxy::Proxy::start(port).map_err(|e| e.to_string())?;
    let proxied =
        f.url_with("pool_size=1")?
            .replacen(&format!(":{port}"), &format!(":{}", proxy.port), 1);
    let client = LockClient::new(SqlBackend::connect(&proxied).await?);
    Ok((proxy, client))
}

/// A renewal its caller gives up at the lease's deadline while its
/// transaction is on the wire (every request through a proxy that delays
/// it 1.5 s, on a pool of one connection): the rest of it runs, so the
/// connection does not go back to the pool inside a transaction the
/// driver does not know of, and the grants made on it next commit.
async fn renewal_given_up(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (proxy, client) = proxied_pool_of_one(&f).await?;
    let ns = integration_tests::namespace();
    let g = client
        .lock(format!("{ns}/cut-renewal"))
        .ttl(Duration::from_secs(3))
        .acquire()
        .await?;
    // The renewal at a third of the TTL outlasts the lease.
    proxy.set_request_delay(Duration::from_millis(1500));
    let lost = tokio::time::timeout(Duration::from_secs(10), g.lost()).await;
    proxy.set_request_delay(Duration::ZERO);
    if lost.is_err() {
        return Err("a renewal delayed past the lease's deadline did not lose it".into());
    }
    drop(g);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let other = f.connect(SqlConfig::default()).await?;
    let mut held = Vec::new();
    for i in 0..4 {
        let name = format!("{ns}/after-cut-renewal{i}");
        let Some(taken) = client.lock(&name).try_acquire().await? else {
            return Err(format!("{name} was refused").into());
        };
        let seen = other.inspect(&LockName::new(&name)?).await?;
        held.push(taken);
        if !seen.held {
            return Err(format!(
                "{name}, granted on the connection whose renewal was given up, is not held for another client: its grant never committed"
            )
            .into());
        }
    }
    for g in held {
        g.release().await?;
    }
    Ok(())
}

/// A holder of two locks cut off (a partition) while the transaction that
/// renews both is open on the server: the server ends that transaction
/// after its idle limit (5 s), so another client takes the locks soon
/// after their lease, not when the server drops the silent connection
/// (`wait_timeout`, hours).
async fn renewal_cut_off(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (proxy, client) = proxied_pool_of_one(&f).await?;
    let ns = integration_tests::namespace();
    let names = [format!("{ns}/cut-a"), format!("{ns}/cut-b")];
    let held = client
        .lock_all(&names)
        .ttl(Duration::from_secs(3))
        .acquire()
        .await?;
    let admin = f.admin_pool::<sqlx::MySql>().await?;
    // Each answer to the next renewal crosses the proxy slowly; once its
    // transaction holds rows, the link goes silent.
    proxy.set_reply_delay(Duration::from_millis(150));
    // The renewal's transaction holds the row when another session cannot
    // lock it without waiting.
    let start = std::time::Instant::now();
    loop {
        let mut probe = admin.begin().await?;
        let locked = sqlx::query("SELECT 1 FROM distlock_locks WHERE name = ? FOR UPDATE NOWAIT")
            .bind(&names[0])
            .fetch_optional(&mut *probe)
            .await
            .is_err();
        probe.rollback().await?;
        if locked {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err("no renewal's transaction was seen holding rows".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.set_blackhole(true);
    let other = LockClient::new(f.connect(SqlConfig::default()).await?);
    let taken = other
        .lock(&names[0])
        .wait(Duration::from_secs(30))
        .acquire()
        .await;
    let waited = start.elapsed();
    proxy.set_blackhole(false);
    drop(held);
    match taken {
        Ok(g) if waited < Duration::from_secs(20) => {
            g.release().await?;
            Ok(())
        }
        Ok(_) => Err(format!("taken only {waited:?} after the cut").into()),
        Err(e) => Err(format!("the cut-off holder's rows stayed locked: {e}").into()),
    }
}

/// A semaphore's waiter at the head of the queue (`fifo=true`) sleeps
/// while every permit is held; another client lowering the limit wakes it
/// within one sleep (`queue_lease_ms / 3`), not when the earliest permit
/// ends (a minute here): `LimitMismatch`.
async fn fifo_limit_changed(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let url = f.url_with("fifo=true")?;
    let holder = LockClient::new(SqlBackend::connect(&url).await?);
    let waiter = LockClient::new(SqlBackend::connect(&url).await?);
    let name = format!("{}/fifo-limit-lowered", integration_tests::namespace());
    let ttl = Duration::from_secs(60);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(holder.semaphore(&name, 3).ttl(ttl).acquire().await?);
    }
    let queued = name.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .semaphore(&queued, 3)
            .ttl(ttl)
            .wait(Duration::from_secs(120))
            .acquire()
            .await
            .map(|g| g.token())
    });
    // The waiter heads the queue and sleeps.
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.set_semaphore_limit(&name, 1).await?;
    let answer = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .map_err(|_| "the queued waiter still waited 15 s after the limit was lowered")?
        .map_err(|e| e.to_string())?;
    for g in held {
        g.release().await?;
    }
    match answer {
        Err(distlock_core::Error::LimitMismatch { .. }) => Ok(()),
        other => Err(format!("the queued waiter, its limit lowered, got {other:?}").into()),
    }
}

/// See [`integration_tests::stall::a_wait_ends_by_its_deadline`].
async fn stalled_wait(f: Arc<SqlFactory>) -> Result<(), Failed> {
    integration_tests::stall::a_wait_ends_by_its_deadline(f.url()?, |url| async move {
        SqlBackend::connect(&url).await
    })
    .await
}

/// See [`sql_support::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing`].
async fn shared_renewal_after_freed(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let admin: sqlx::MySqlPool = f.admin_pool().await?;
    sql_support::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing(
        f,
        |table, name| async move {
            let done = sqlx::query(&format!("UPDATE {table} SET owner = NULL WHERE name = ?"))
                .bind(name)
                .execute(&admin)
                .await?;
            Ok(done.rows_affected())
        },
    )
    .await
}

/// See [`sql_support::a_limit_distlock_did_not_write_is_misconfigured`].
async fn foreign_limit(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let admin: sqlx::MySqlPool = f.admin_pool().await?;
    sql_support::a_limit_distlock_did_not_write_is_misconfigured(f, |table, name, set| {
        let admin = admin.clone();
        async move {
            let value = set.unwrap_or(0);
            let done = sqlx::query(&format!(
                "UPDATE {table} SET permits = {value} WHERE name = ?"
            ))
            .bind(name)
            .execute(&admin)
            .await?;
            Ok(done.rows_affected())
        }
    })
    .await
}
