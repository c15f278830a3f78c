//! The conformance suite on PostgreSQL, plus its own edges: concurrent table
//! creation, a server restart, a killed connection, notified waiters,
//! notified election observers, and a LISTEN connection that lives only
//! while someone waits or observes.

mod sql_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Backend, Error, FencingToken, LockClient, LockName, LockRequest};
use distlock_sql::{sqlx, SqlBackend, SqlConfig};
use integration_tests::harness::postgres as pg;
use integration_tests::harness::tls::TestCerts;
use integration_tests::harness::{ServerKind, TestServer};
use integration_tests::trial;
use libtest_mimic::Failed;
use sql_support::{Source, SqlFactory, Started};

fn main() {
    // A server that takes TCP clients only over TLS and with a password,
    // reached by the name its certificate holds and verified in full.
    let tls = SqlFactory::new(
        "postgres::tls",
        Source::Start(Box::new(|| {
            let (process, certs) = pg::spawn_tls().map_err(|e| e.to_string())?;
            let port = process.port;
            Ok(Started {
                url: tls_url("localhost", port, "verify-full", &certs.ca),
                port,
                certs: Some(certs),
                process,
            })
        })),
    );
    // The whole suite once more with waiters queueing, first come, first
    // served.
    let fifo = SqlFactory::new(
        "postgres::fifo_suite",
        Source::Start(Box::new(|| {
            let process = pg::spawn().map_err(|e| e.to_string())?;
            let port = process.port;
            Ok(Started {
                url: format!("{}?fifo=true", ServerKind::Postgres.url("127.0.0.1", port)),
                port,
                certs: None,
                process,
            })
        })),
    );
    sql_support::run_suite(
        "postgres",
        Source::Server(ServerKind::Postgres),
        move |f, rt| {
            let mut trials = integration_tests::trials(tls.clone(), rt);
            trials.extend(integration_tests::trials(fifo.clone(), rt));
            trials.extend(sql_support::fifo_mixed("postgres::fifo_mixed", f, rt));
            trials.extend([
            trial(
                rt,
                "postgres::a_wait_on_a_server_that_stops_answering_ends_by_its_deadline",
                stalled_wait(f.clone()),
            ),
            trial(
                rt,
                "postgres::tls_demanded_of_a_server_without_it_is_misconfigured",
                {
                    let f = f.clone();
                    async move {
                        sql_support::tls_demanded_of_a_plain_server(&f.url()?, "sslmode=require")
                            .await
                    }
                },
            ),
            trial(
                rt,
                "postgres::the_longest_table_name_serves_every_kind",
                sql_support::the_longest_table_name_serves_every_kind(f.clone()),
            ),
            trial(
                rt,
                "postgres::tls::verify_full_by_the_certificates_name_is_encrypted",
                tls_is_encrypted(tls.clone()),
            ),
            trial(
                rt,
                "postgres::tls::a_wrong_ca_is_a_typed_error_without_the_password",
                tls_wrong_ca(tls.clone()),
            ),
            trial(
                rt,
                "postgres::tls::verify_full_by_an_address_the_certificate_lacks_is_a_typed_error",
                tls_wrong_host(tls.clone()),
            ),
            trial(
                rt,
                "postgres::tls::verify_ca_checks_the_ca_and_the_host_name",
                tls_verify_ca(tls.clone()),
            ),
            trial(
                rt,
                "postgres::tls::the_server_refuses_plaintext",
                tls_plaintext_refused(tls.clone()),
            ),
            trial(
                rt,
                "postgres::a_wrong_password_or_user_is_misconfigured_not_retryable",
                wrong_credentials(tls.clone()),
            ),
            trial(
                rt,
                "postgres::the_fencing_updates_in_the_docs_refuse_a_paused_holders_writes",
                fencing_updates(f.clone()),
            ),
            trial(
                rt,
                "postgres::a_role_at_its_connection_limit_is_unavailable",
                connection_limit(f.clone()),
            ),
            trial(
                rt,
                "postgres::a_read_only_server_is_unavailable",
                read_only(f.clone()),
            ),
            trial(
                rt,
                "postgres::a_row_lock_past_the_lock_timeout_is_unavailable",
                lock_timeout(f.clone()),
            ),
            trial(
                rt,
                "postgres::a_pool_too_small_for_a_listener_and_the_statements_is_invalid_input",
                pool_too_small(f.clone()),
            ),
            trial(
                rt,
                "postgres::waiters_woken_together_on_a_repeatable_read_database_all_get_the_lock",
                repeatable_read_default(f.clone()),
            ),
            trial(
                rt,
                "postgres::a_role_with_only_the_listed_rights_serves_every_kind",
                restricted_role(f.clone()),
            ),
        ]);
            trials.extend(vec![
                trial(
                    rt,
                    "postgres::fifo::grants_in_arrival_order_one_request_each",
                    fifo_order(sql_support::queued_row(false, "fifo/order"), 1),
                ),
                trial(
                    rt,
                    "postgres::fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                    fifo_cancel(sql_support::queued_row(false, "fifo/cancel")),
                ),
                trial(
                    rt,
                    "postgres::fifo::a_wait_dropped_before_its_first_answer_leaves_no_entry",
                    fifo_dropped_in_flight(sql_support::queued_row(false, "fifo/in-flight")),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::a_wait_dropped_before_its_first_answer_leaves_no_entry",
                    fifo_dropped_in_flight(sql_support::queued_shared("fifo/in-flight")),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::a_wait_dropped_before_its_first_answer_leaves_no_entry",
                    fifo_dropped_in_flight(sql_support::queued_semaphore_row("fifo/in-flight")),
                ),
                trial(
                    rt,
                    "postgres::fifo::election::a_wait_dropped_before_its_first_answer_leaves_no_entry",
                    fifo_dropped_in_flight(sql_support::queued_row(true, "fifo/in-flight")),
                ),
                trial(
                    rt,
                    "postgres::fifo::election::grants_in_arrival_order_one_request_each",
                    fifo_order(sql_support::queued_row(true, "fifo/order"), 1),
                ),
                trial(
                    rt,
                    "postgres::fifo::election::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                    fifo_cancel(sql_support::queued_row(true, "fifo/cancel")),
                ),
                trial(
                    rt,
                    "postgres::fifo::election::an_eviction_wakes_the_queued_head",
                    fifo_evict(),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::the_last_readers_release_wakes_a_queued_writer",
                    fifo_last_reader(),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::grants_in_arrival_order_one_request_each",
                    fifo_order(sql_support::queued_shared("fifo/order"), 1),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                    fifo_cancel(sql_support::queued_shared("fifo/cancel")),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::readers_never_pass_a_queued_writer",
                    fifo_readers(false),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::a_queue_table_without_the_shared_column_gains_it",
                    fifo_readers(true),
                ),
                trial(
                    rt,
                    "postgres::fifo::shared::a_writer_that_leaves_lets_the_readers_behind_it_in",
                    fifo_writer_leaves(),
                ),
                trial(
                    rt,
                    "postgres::fifo::a_lost_mark_neither_lets_a_try_pass_the_queue_nor_leaves_its_head_asleep",
                    fifo_lost_mark(),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::grants_in_arrival_order_one_request_each",
                    fifo_order(sql_support::queued_semaphore_row("fifo/order"), 3),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::permits_freed_at_once_each_reach_a_waiter",
                    fifo_freed_at_once(),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::a_changed_limit_reaches_queued_waiters_at_their_next_recheck",
                    fifo_changed_limit(),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::a_cancelled_or_timed_out_waiter_leaves_no_entry",
                    fifo_cancel(sql_support::queued_semaphore_row("fifo/cancel")),
                ),
                trial(
                    rt,
                    "postgres::fifo::semaphore::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses",
                    fifo_cut(sql_support::queued_semaphore_row("fifo/cut")),
                ),
                trial(
                    rt,
                    "postgres::fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses",
                    fifo_cut(sql_support::queued_row(false, "fifo/cut")),
                ),
                trial(
                    rt,
                    "postgres::tokens_keep_increasing_across_a_restart",
                    restart(),
                ),
                trial(
                    rt,
                    "postgres::terminated_connection_does_not_lose_the_lock",
                    terminated(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::waiter_is_notified_on_release",
                    notified(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_waiter_whose_listen_connection_ends_checks_again_at_once",
                    listener_lost(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_renewal_whose_reply_is_lost_holds_up_no_later_hold",
                    unanswered_renewal(),
                ),
                trial(
                    rt,
                    "postgres::clients_spelling_the_table_in_different_cases_wake_each_other",
                    notified_across_spellings(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::listens_only_while_a_task_waits",
                    listens_only_while_waiting(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_freed_permit_wakes_one_waiter_of_a_client_and_a_changed_limit_wakes_all",
                    freed_permit_wakes_one(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::readers_and_writers_are_notified",
                    rw_notified(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_shared_release_racing_a_grant_leaves_the_lock_shared",
                    shared_release_races_a_grant(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing",
                    shared_renewal_after_freed(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_limit_distlock_did_not_write_is_misconfigured",
                    foreign_limit(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_renewal_committing_at_expiry_keeps_its_permit",
                    renewal_at_expiry(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_stale_grant_routine_is_replaced",
                    stale_grant_routine(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_raced_shared_release_does_not_deadlock_with_a_renewal",
                    raced_release_and_renewal(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_release_notifies_only_while_someone_waits",
                    notifies_only_while_awaited(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::a_lock_table_without_the_awaited_column_gets_it",
                    old_lock_table(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::an_observer_is_notified_of_each_grant_proclamation_resignation_and_eviction",
                    observer_notified(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::an_observer_sees_the_end_of_an_expired_lease_without_a_notification",
                    observer_sees_expiry(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::an_observer_listens_until_it_is_dropped",
                    observer_stops_listening(f.clone()),
                ),
                trial(
                    rt,
                    "postgres::fifo::queued_waiters_listen_on_their_clients_channel_alone",
                    fifo_waiters_listen_apart(f.clone()),
                ),
            ]);
            trials
        },
    )
}

/// The URL of a [`pg::spawn_tls`] server at `host`.
fn tls_url(host: &str, port: u16, sslmode: &str, ca: &Path) -> String {
    format!(
        "postgres://postgres:{}@{host}:{port}/postgres?sslmode={sslmode}&sslrootcert={}",
        pg::TLS_PASSWORD,
        ca.display()
    )
}

fn tls_certs(f: &SqlFactory) -> Result<(u16, &TestCerts), Failed> {
    let s = f.started()?;
    Ok((s.port, s.certs.as_ref().ok_or("no certificates")?))
}

/// A lock is taken and released over verify-full TLS, and the connections
/// distlock opened are encrypted (`pg_stat_ssl`).
async fn tls_is_encrypted(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("tls_{}", &integration_tests::namespace()[12..]);
    let client = LockClient::new(
        SqlBackend::connect(&f.url_with(&format!("application_name={app}"))?).await?,
    );
    let g = client.lock("tls/encrypted").acquire().await?;
    let admin = sqlx::PgPool::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl)
           FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
          WHERE a.application_name = $1",
    )
    .bind(&app)
    .fetch_one(&admin)
    .await
    .map_err(|e| e.to_string())?;
    if connections == 0 || encrypted != connections {
        return Err(
            format!("{encrypted} of distlock's {connections} connections are encrypted").into(),
        );
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
    let url = tls_url("localhost", port, "verify-full", &other);
    let text =
        sql_support::certificate_is_rejected(&url, pg::TLS_PASSWORD, "the CA is another").await?;
    if !text.contains("UnknownIssuer") {
        return Err(format!("the message does not say the issuer is unknown: {text}").into());
    }
    Ok(())
}

/// The certificate names `localhost` only: verify-full by address fails.
async fn tls_wrong_host(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let url = tls_url("127.0.0.1", port, "verify-full", &certs.ca);
    let text = sql_support::certificate_is_rejected(
        &url,
        pg::TLS_PASSWORD,
        "the host is not in the certificate",
    )
    .await?;
    if !text.contains("not valid for name") {
        return Err(format!("the message does not name the host mismatch: {text}").into());
    }
    Ok(())
}

/// verify-ca checks the CA: the right one connects, another is the typed
/// error. sqlx 0.8 (with rustls 0.23) checks the host name under verify-ca
/// as well, so by an address the certificate lacks it is refused as under
/// verify-full: stricter than libpq, never laxer; the README says so.
async fn tls_verify_ca(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let url = tls_url("localhost", port, "verify-ca", &certs.ca);
    let client = LockClient::new(SqlBackend::connect(&url).await?);
    let g = client
        .lock("tls/verify-ca")
        .try_acquire()
        .await?
        .ok_or("verify-ca: lock not granted")?;
    g.release().await?;
    let other = sql_support::unrelated_ca().await?;
    let wrong_ca = tls_url("localhost", port, "verify-ca", &other);
    sql_support::certificate_is_rejected(&wrong_ca, pg::TLS_PASSWORD, "verify-ca, another CA")
        .await?;
    let by_address = tls_url("127.0.0.1", port, "verify-ca", &certs.ca);
    sql_support::certificate_is_rejected(&by_address, pg::TLS_PASSWORD, "verify-ca by address")
        .await?;
    Ok(())
}

/// The server takes no plaintext TCP client, so the TLS cases above do
/// test TLS: sslmode=disable is refused, as a configuration error that
/// says to use TLS (not to check the password).
async fn tls_plaintext_refused(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, _) = tls_certs(&f)?;
    let url = format!(
        "postgres://postgres:{}@localhost:{port}/postgres?sslmode=disable",
        pg::TLS_PASSWORD
    );
    match SqlBackend::connect(&url).await {
        Ok(_) => Err("a plaintext client connected".into()),
        Err(e @ distlock_core::Error::Misconfigured { .. }) => {
            if e.to_string().contains(pg::TLS_PASSWORD) {
                return Err(format!("the error shows the password: {e}").into());
            }
            if !e
                .to_string()
                .contains("only over TLS: use sslmode=verify-full")
            {
                return Err(format!("plaintext: the error does not say to use TLS: {e}").into());
            }
            Ok(())
        }
        Err(e) => Err(format!("plaintext: expected Misconfigured, got {e:?}").into()),
    }
}

/// `holder` holds `lock` while each of `clients` waits for it, then
/// releases it, waking them together; each waiter's answer (a grant is
/// released at once).
async fn woken_together(
    holder: &LockClient,
    lock: &'static str,
    clients: Vec<LockClient>,
) -> Result<Vec<Result<(), Error>>, Failed> {
    let g = holder.lock(lock).acquire().await?;
    let waiters: Vec<_> = clients
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                let g = c.lock(lock).wait(Duration::from_secs(30)).acquire().await?;
                g.release().await?;
                Ok::<_, Error>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    g.release().await?;
    let mut answers = Vec::new();
    for w in waiters {
        answers.push(w.await.map_err(|e| e.to_string())?);
    }
    Ok(answers)
}

/// On a database whose default isolation is REPEATABLE READ, waiters woken
/// by one release, whose statements meet on the lock's row, all get the
/// lock in turn: none fails with a serialization error.
async fn repeatable_read_default(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let admin = f.admin_pool::<sqlx::Postgres>().await?;
    let db = format!("rr_{}", &integration_tests::namespace()[12..]).to_lowercase();
    for sql in [
        format!("CREATE DATABASE {db}"),
        format!("ALTER DATABASE {db} SET default_transaction_isolation = 'repeatable read'"),
    ] {
        sqlx::query(&sql)
            .execute(&admin)
            .await
            .map_err(|e| e.to_string())?;
    }
    let url = f.url()?;
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (server, _) = base.rsplit_once('/').ok_or("a URL without a database")?;
    let url = format!("{server}/{db}?{query}");
    let holder = LockClient::new(SqlBackend::connect(&url).await?);
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(LockClient::new(SqlBackend::connect(&url).await?));
    }
    for answer in woken_together(&holder, "rr/x", clients).await? {
        answer?;
    }
    // Pools of the user's keep the database's default: a waiter that meets
    // another on the row may fail, but only with a retryable error.
    let mut clients = Vec::new();
    for _ in 0..6 {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        clients.push(LockClient::new(
            SqlBackend::postgres(pool, SqlConfig::default()).await?,
        ));
    }
    for answer in woken_together(&holder, "rr/y", clients).await? {
        match answer {
            Err(e) if !e.is_retryable() => {
                return Err(format!("a waiter on a pool of its own failed for good: {e}").into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// A waiter listens on a connection of the pool while it waits (with
/// `fifo`, observers on another), so a pool without one more for the
/// statements would make every contended wait time out: refused at once.
/// The smallest pool that is accepted serves a wait behind a holder.
async fn pool_too_small(f: Arc<SqlFactory>) -> Result<(), Failed> {
    for (params, too_small) in [
        ("pool_size=1", true),
        ("pool_size=2&fifo=true", true),
        ("pool_size=2", false),
        ("pool_size=3&fifo=true", false),
    ] {
        let url = f.url_with(params)?;
        match SqlBackend::connect(&url).await {
            Err(Error::InvalidInput { .. }) if too_small => {}
            Ok(b) if !too_small => {
                let (holder, waiter) = (
                    LockClient::new(SqlBackend::connect(&f.url()?).await?),
                    LockClient::new(b),
                );
                let name = format!("small-pool/{}", params.replace(['=', '&'], "-"));
                let g = holder.lock(&name).acquire().await?;
                let wait = {
                    let name = name.clone();
                    tokio::spawn(async move {
                        waiter
                            .lock(&name)
                            .wait(Duration::from_secs(20))
                            .acquire()
                            .await
                    })
                };
                tokio::time::sleep(Duration::from_millis(500)).await;
                g.release().await?;
                wait.await.map_err(|e| e.to_string())??.release().await?;
            }
            other => return Err(format!("{params}: {other:?}").into()),
        }
    }
    Ok(())
}

/// See [`sql_support::wrong_credentials_are_misconfigured`].
async fn wrong_credentials(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (port, certs) = tls_certs(&f)?;
    let ca = certs.ca.display().to_string();
    sql_support::wrong_credentials_are_misconfigured("postgres", pg::TLS_PASSWORD, |user, pw| {
        format!(
            "postgres://{user}:{pw}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
        )
    })
    .await
}

/// The rights the guarantees list: `SELECT`, `INSERT`, `UPDATE` and
/// `DELETE` on the tables, `USAGE` on the queue's sequence; `EXECUTE` on
/// the functions is PostgreSQL's default for every role. The server trusts
/// every local role, so a role needs no password here.
async fn restricted_role(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let admin = f.admin_pool::<sqlx::Postgres>().await?;
    let make_role = |table: String, role: String, rights: bool| {
        let admin = admin.clone();
        async move {
            let mut sql = format!("CREATE ROLE {role} LOGIN;");
            if rights {
                sql.push_str(&format!(
                    "GRANT SELECT, INSERT, UPDATE, DELETE
                        ON {table}, {table}_sems, {table}_permits, {table}_shared,
                           {table}_writers, {table}_queue
                        TO {role};
                     GRANT USAGE ON SEQUENCE {table}_queue_arrival_seq TO {role};"
                ));
            }
            sqlx::raw_sql(&sql)
                .execute(&admin)
                .await
                .map_err(|e| Failed::from(e.to_string()))?;
            Ok(())
        }
    };
    let url = f.url()?;
    sql_support::a_role_with_only_the_listed_rights_serves_every_kind(
        &f,
        make_role,
        |role, params| {
            format!(
                "{}?{params}",
                url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
            )
        },
    )
    .await
}

/// A role at its `CONNECTION LIMIT` (SQLSTATE 53300, too many
/// connections) is refused at connect as `Unavailable`: a connection that
/// closes lets the next try in.
/// docs/fencing.md's two conditional updates, as written there: a holder
/// paused past its TTL writes with its old token after a newer holder has
/// written, and no row changes; the newer holder may write again, and a
/// job is claimed once per token.
async fn fencing_updates(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, _) = f.own_table("fenced")?;
    let db: sqlx::PgPool = f.admin_pool().await?;
    let (accounts, jobs) = (format!("{table}_accounts"), format!("{table}_jobs"));
    for ddl in [
        format!("CREATE TABLE {accounts} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"),
        format!("ALTER TABLE {accounts} ADD COLUMN fence BIGINT NOT NULL DEFAULT 0"),
        format!("INSERT INTO {accounts} (id, balance) VALUES (1, 0)"),
        format!("CREATE TABLE {jobs} (id BIGINT PRIMARY KEY, state TEXT NOT NULL, fence BIGINT NOT NULL DEFAULT 0)"),
        format!("INSERT INTO {jobs} (id, state) VALUES (1, 'queued')"),
    ] {
        sqlx::query(&ddl).execute(&db).await?;
    }
    let write =
        format!("UPDATE {accounts} SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2");
    let claim =
        format!("UPDATE {jobs} SET state = 'running', fence = $1 WHERE id = $2 AND fence < $1");
    let wrote = |balance: i64, token: FencingToken| {
        let (db, write) = (db.clone(), write.clone());
        async move {
            Ok::<u64, Failed>(
                sqlx::query(&write)
                    .bind(balance)
                    .bind(token.0 as i64)
                    .bind(1_i64)
                    .execute(&db)
                    .await?
                    .rows_affected(),
            )
        }
    };
    let claimed = |token: FencingToken| {
        let (db, claim) = (db.clone(), claim.clone());
        async move {
            Ok::<u64, Failed>(
                sqlx::query(&claim)
                    .bind(token.0 as i64)
                    .bind(1_i64)
                    .execute(&db)
                    .await?
                    .rows_affected(),
            )
        }
    };
    let (a, b) = (
        LockClient::new(f.connect(SqlConfig::default()).await?),
        LockClient::new(f.connect(SqlConfig::default()).await?),
    );
    let (lock, ttl) = (format!("fenced/{table}"), Duration::from_millis(500));
    let old = a.lock(&lock).ttl(ttl).no_renew().acquire().await?;
    if wrote(10, old.token()).await? != 1 || wrote(11, old.token()).await? != 1 {
        return Err("the holder could not write twice with its token".into());
    }
    // Paused past its TTL: a newer holder takes over and writes.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let new = b
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    if new.token() <= old.token() {
        return Err(format!("token {} after {}", new.token(), old.token()).into());
    }
    if wrote(20, new.token()).await? != 1 || wrote(21, new.token()).await? != 1 {
        return Err("the newer holder could not write twice with its token".into());
    }
    if wrote(12, old.token()).await? != 0 {
        return Err("the paused holder's write with its old token changed the row".into());
    }
    let balance: i64 = sqlx::query_scalar(&format!("SELECT balance FROM {accounts} WHERE id = 1"))
        .fetch_one(&db)
        .await?;
    if balance != 21 {
        return Err(format!("balance {balance}, not the newer holder's 21").into());
    }
    if claimed(old.token()).await? != 1 {
        return Err("the first claim of the job was refused".into());
    }
    if claimed(old.token()).await? != 0 {
        return Err("a second claim with the same token was accepted".into());
    }
    if claimed(new.token()).await? != 1 || claimed(old.token()).await? != 0 {
        return Err(
            "the newer token's claim was refused, or the older one's accepted after it".into(),
        );
    }
    new.release().await?;
    let _ = old.release().await;
    Ok(())
}

async fn connection_limit(f: Arc<SqlFactory>) -> Result<(), Failed> {
    use sqlx::Connection;
    let admin = f.admin_pool::<sqlx::Postgres>().await?;
    let role = format!("one_conn_{}", &integration_tests::namespace()[12..]);
    sqlx::raw_sql(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 1"))
        .execute(&admin)
        .await
        .map_err(|e| e.to_string())?;
    let url = f
        .url()?
        .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let held = sqlx::PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let refused = SqlBackend::connect(&url).await;
    held.close().await.map_err(|e| e.to_string())?;
    sqlx::raw_sql(&format!("DROP ROLE {role}"))
        .execute(&admin)
        .await
        .map_err(|e| e.to_string())?;
    match refused {
        Err(e @ Error::Unavailable { .. }) if e.is_retryable() => {
            eprintln!("{e}");
            Ok(())
        }
        other => Err(format!("a role at its limit: expected Unavailable, got {other:?}").into()),
    }
}

/// A server that takes no writes (a hot standby, or a primary with
/// `default_transaction_read_only` during a switchover) refuses them with
/// SQLSTATE 25006: `Unavailable`, saying read-only, so that a wait goes on
/// until the URL reaches a server that takes them.
async fn read_only(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (_, url) = f.own_table("read_only")?;
    // Made writable first: the table exists before the server is read-only.
    SqlBackend::connect(&url).await?;
    let refused = async {
        let url = format!("{url}&options[default_transaction_read_only]=on");
        let client = LockClient::new(SqlBackend::connect(&url).await?);
        client.lock("ro/job").try_acquire().await.map(|_| ())
    }
    .await;
    match refused {
        Err(e @ Error::Unavailable { .. })
            if e.is_retryable() && e.to_string().contains("read-only") =>
        {
            Ok(())
        }
        other => Err(format!("a read-only server: expected Unavailable, got {other:?}").into()),
    }
}

/// A row another transaction keeps locked past the connection's
/// `lock_timeout` (SQLSTATE 55P03) is `Unavailable`: the statement was
/// rolled back, and the row may be free a moment later.
async fn lock_timeout(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("lock_timeout")?;
    let backend = SqlBackend::connect(&format!("{url}&options[lock_timeout]=300")).await?;
    let name = LockName::new("timeout/row")?;
    let holder = LockRequest::new(name.clone(), Duration::from_secs(60));
    backend
        .try_acquire(&holder)
        .await?
        .ok_or("the free lock was refused")?;
    let admin = f.admin_pool::<sqlx::Postgres>().await?;
    let mut tx = admin.begin().await.map_err(|e| e.to_string())?;
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE"))
        .bind(name.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| format!("locking the row: {e}"))?;
    let other = LockRequest::new(name, Duration::from_secs(60));
    let waited = backend.try_acquire(&other).await;
    tx.rollback().await.map_err(|e| e.to_string())?;
    backend.release(&holder).await?;
    match waited {
        Err(e @ Error::Unavailable { .. }) if e.is_retryable() => Ok(()),
        other => {
            Err(format!("a row lock past lock_timeout: expected Unavailable, got {other:?}").into())
        }
    }
}

/// Its own server, since it is stopped and started again.
async fn restart() -> Result<(), Failed> {
    let mut server =
        tokio::task::spawn_blocking(|| TestServer::start_private(ServerKind::Postgres))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    let url = server.url().to_string();
    // A lock's tokens and a semaphore's.
    let (mut tokens, mut permits) = (Vec::new(), Vec::new());
    {
        let client = LockClient::new(SqlBackend::connect(&url).await?);
        for _ in 0..2 {
            let g = client.lock("restart/tokens").acquire().await?;
            tokens.push(g.token());
            g.release().await?;
            let p = client.semaphore("restart/permits", 2).acquire().await?;
            permits.push(p.token());
            p.release().await?;
        }
    }
    server = tokio::task::spawn_blocking(move || {
        server
            .process_mut()
            .ok_or("no process")?
            .restart()
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(server)
    })
    .await
    .map_err(|e| e.to_string())??;
    let client = LockClient::new(SqlBackend::connect(&url).await?);
    let g = client.lock("restart/tokens").acquire().await?;
    tokens.push(g.token());
    g.release().await?;
    let p = client.semaphore("restart/permits", 2).acquire().await?;
    permits.push(p.token());
    p.release().await?;
    drop(server);
    let rising = |t: &[distlock_core::FencingToken]| t.windows(2).all(|w| w[0] < w[1]);
    if rising(&tokens) && rising(&permits) {
        Ok(())
    } else {
        Err(format!("tokens across the restart: lock {tokens:?}, semaphore {permits:?}").into())
    }
}

/// The lock lives in a row, not in a session: killing the holder's pooled
/// connections makes the next renewal use a fresh one, and the hold goes on.
async fn terminated(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("victim_{}", &integration_tests::namespace()[12..]);
    let victim = LockClient::new(
        SqlBackend::connect(&f.url_with(&format!("application_name={app}"))?).await?,
    );
    let other = LockClient::new(f.connect(SqlConfig::default()).await?);
    // Long enough for the renewal after the kill to connect afresh (TCP
    // and SCRAM) on a loaded machine before the deadline.
    let ttl = Duration::from_secs(2);
    let g = victim.lock("terminated/conn").ttl(ttl).acquire().await?;
    let admin = sqlx::PgPool::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_one(&admin)
    .await
    .map_err(|e| e.to_string())?;
    if killed < 1 {
        return Err("no connection was terminated: the fault did not fire".into());
    }
    tokio::time::sleep(ttl * 4).await;
    if !g.is_held() {
        return Err(format!(
            "lost after its connection was killed: {:?}",
            tokio::time::timeout(Duration::ZERO, g.lost()).await
        )
        .into());
    }
    if other.lock("terminated/conn").try_acquire().await?.is_some() {
        return Err("another client got the lock after the holder's connection was killed".into());
    }
    if !g.release().await? {
        return Err("release reported the lock as not held".into());
    }
    Ok(())
}

/// A waiter whose LISTEN connection the server ends checks again at once:
/// a release it may have missed meanwhile (here the row freed by hand,
/// which notifies nobody) reaches it without waiting for its fallback poll
/// (a minute) or the holder's lease (two).
async fn listener_lost(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("listener_{}", &integration_tests::namespace()[12..]);
    let mut config = SqlConfig::default();
    config.notify_fallback = Duration::from_secs(60);
    let waiter = LockClient::new(
        SqlBackend::connect_with(&f.url_with(&format!("application_name={app}"))?, config).await?,
    );
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    let name = format!("{}/listener-lost", integration_tests::namespace());
    let g = holder
        .lock(&name)
        .ttl(Duration::from_secs(120))
        .acquire()
        .await?;
    let waited = name.clone();
    let waiting = tokio::spawn(async move {
        let taken = waiter
            .lock(&waited)
            .wait(Duration::from_secs(100))
            .acquire()
            .await;
        (tokio::time::Instant::now(), taken)
    });
    let admin = sqlx::PgPool::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'";
    let start = tokio::time::Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(listening)
            .bind(&app)
            .fetch_one(&admin)
            .await
            .map_err(|e| e.to_string())?;
        if n > 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err("the waiter never listened".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query("UPDATE distlock_locks SET owner = NULL WHERE name = $1")
        .bind(&name)
        .execute(&admin)
        .await
        .map_err(|e| e.to_string())?;
    let freed = tokio::time::Instant::now();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .execute(&admin)
    .await
    .map_err(|e| e.to_string())?;
    let (granted, taken) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .map_err(|_| "the waiter was not granted 30 s after its LISTEN connection ended")?
        .map_err(|e| e.to_string())?;
    let taken = taken?;
    let after = granted.saturating_duration_since(freed);
    taken.release().await?;
    drop(g);
    if after > Duration::from_secs(5) {
        return Err(
            format!("the waiter was granted {after:?} after its LISTEN connection ended").into(),
        );
    }
    Ok(())
}

/// The waiter's fallback poll is a minute and the holder's TTL two, so only
/// NOTIFY can hand it the lock within the bound below.
async fn notified(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let mut config = SqlConfig::default();
    config.notify_fallback = Duration::from_secs(60);
    let waiter = LockClient::new(f.connect(config).await?);
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    sql_support::release_wakes_the_waiter(
        holder,
        waiter,
        "notified/release",
        Duration::from_millis(500),
        "waiter not woken by NOTIFY",
    )
    .await
}

/// Clients that spell the table's name in different cases use one table
/// (PostgreSQL folds unquoted names to lower case) and one notification
/// channel: each is woken by the other's release.
async fn notified_across_spellings(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let (upper, lower) = ("Mixed_Case_Locks", "mixed_case_locks");
    for (holder_table, waiter_table, lock, not_woken) in [
        (
            upper,
            lower,
            "notified/spelled-a",
            "a waiter spelling the table in lower case not woken",
        ),
        (
            lower,
            upper,
            "notified/spelled-b",
            "a waiter spelling the table in mixed case not woken",
        ),
    ] {
        let mut config = SqlConfig::default().with_table(waiter_table);
        config.notify_fallback = Duration::from_secs(60);
        let waiter = LockClient::new(f.connect(config).await?);
        let holder = LockClient::new(
            f.connect(SqlConfig::default().with_table(holder_table))
                .await?,
        );
        sql_support::release_wakes_the_waiter(
            holder,
            waiter,
            lock,
            Duration::from_millis(500),
            not_woken,
        )
        .await?;
    }
    Ok(())
}

/// A writer behind readers is woken by NOTIFY when the last reader
/// releases, and readers behind a writer's mark when the writer gives up.
async fn rw_notified(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let mut config = SqlConfig::default();
    config.notify_fallback = Duration::from_secs(60);
    let waiter = LockClient::new(f.connect(config).await?);
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    let giver = LockClient::new(f.connect(SqlConfig::default()).await?);
    sql_support::rw_waiters_are_woken(holder, giver, waiter, "notified/rw").await
}

/// The last statements of the application `app`'s listening connections
/// (in `pg_stat_activity` a listening connection's last statement is its
/// `LISTEN`).
async fn listening(admin: &sqlx::PgPool, app: &str) -> Result<Vec<String>, Failed> {
    sqlx::query_scalar::<_, String>(
        "SELECT query FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'",
    )
    .bind(app)
    .fetch_all(admin)
    .await
    .map_err(|e| Failed::from(e.to_string()))
}

/// Waits up to 10 s until `app` has `want` listening connections, and
/// returns their statements; fails with `why` and what it saw otherwise.
async fn until_listening(
    admin: &sqlx::PgPool,
    app: &str,
    want: usize,
    why: &str,
) -> Result<Vec<String>, Failed> {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = listening(admin, app).await?;
        if now.len() == want {
            return Ok(now);
        }
        if tokio::time::Instant::now() > end {
            return Err(format!("{why}: {now:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client opens its LISTEN connection only when one of its tasks finds the
/// lock held, and closes it when its last waiter stops waiting, so that a
/// release's NOTIFY signals only clients that wait. Counted in
/// `pg_stat_activity`: a listening connection's last statement is `LISTEN`.
async fn listens_only_while_waiting(f: std::sync::Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("listener_{}", &integration_tests::namespace()[12..]);
    let waiter = LockClient::new(
        SqlBackend::connect(&f.url_with(&format!("application_name={app}"))?).await?,
    );
    let holder = LockClient::new(f.connect(SqlConfig::default()).await?);
    let admin = sqlx::PgPool::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    let until = |want: usize, why: &'static str| until_listening(&admin, &app, want, why);
    let name = "listening/probe";
    let g = waiter.lock(name).acquire().await?;
    g.release().await?;
    let n = listening(&admin, &app).await?.len();
    if n != 0 {
        return Err(format!("an uncontended acquire opened {n} LISTEN connections").into());
    }
    let h = holder
        .lock(name)
        .ttl(Duration::from_secs(120))
        .acquire()
        .await?;
    // Three tasks wait, on two names: one listening connection for all.
    let others = ["listening/other", "listening/third"];
    let held_others = [
        holder
            .lock(others[0])
            .ttl(Duration::from_secs(120))
            .acquire()
            .await?,
        holder
            .lock(others[1])
            .ttl(Duration::from_secs(120))
            .acquire()
            .await?,
    ];
    let wait = |name: &'static str| {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock(name)
                .ttl(Duration::from_secs(120))
                .acquire()
                .await
        })
    };
    let w = wait(name);
    let waits = [wait(others[0]), wait(others[1])];
    until(1, "a waiting acquire did not LISTEN").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = listening(&admin, &app).await?.len();
    if n != 1 {
        return Err(
            format!("three waiting tasks of one backend hold {n} LISTEN connections").into(),
        );
    }
    h.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(15), w)
        .await
        .map_err(|_| Failed::from("waiter not woken by NOTIFY"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    for (held, w) in held_others.into_iter().zip(waits) {
        held.release().await?;
        tokio::time::timeout(Duration::from_secs(15), w)
            .await
            .map_err(|_| Failed::from("waiter not woken by NOTIFY"))?
            .map_err(|e| e.to_string())??
            .release()
            .await?;
    }
    until(
        0,
        "the LISTEN connection stayed open after its last waiter got the lock",
    )
    .await?;
    Ok(())
}

/// See [`sql_support::freed_permit_wakes_one`]; the count is a trigger on
/// the semaphore row, whose token every attempt on an existing semaphore
/// bumps, granted or not.
async fn freed_permit_wakes_one(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("wake")?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let mut config = SqlConfig::default();
    // Only a NOTIFY wakes a waiter within the test.
    config.notify_fallback = Duration::from_secs(60);
    let counter = [
        format!("CREATE TABLE {table}_attempts (n BIGINT NOT NULL)"),
        format!("INSERT INTO {table}_attempts VALUES (0)"),
        format!(
            "CREATE FUNCTION {table}_count() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN UPDATE {table}_attempts SET n = n + 1; RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER {table}_count AFTER UPDATE ON {table}_sems FOR EACH ROW
             WHEN (OLD.token <> NEW.token) EXECUTE FUNCTION {table}_count()"
        ),
    ];
    let count = format!("SELECT n FROM {table}_attempts");
    sql_support::freed_permit_wakes_one(
        &url,
        config,
        || async {
            for ddl in &counter {
                sqlx::query(ddl).execute(&admin).await?;
            }
            Ok(())
        },
        || async { sqlx::query_scalar(&count).fetch_one(&admin).await },
    )
    .await
}

/// A shared release takes its snapshot of the holds, then a second reader's
/// grant commits, then the release reaches the lock row: it must see that
/// the row changed and settle it under its row lock, leaving the lock
/// shared (the second reader holds), not free for a writer. The grant is
/// the backend's own statements run by hand in a transaction held open
/// until the release waits for its row lock.
async fn shared_release_races_a_grant(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("race")?;
    let backend = SqlBackend::connect(&url).await?;
    let client = LockClient::new(backend.clone());
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let name = "race/shared-release";
    let first = client
        .lock(name)
        .shared()
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    let mut grant = admin.begin().await.map_err(|e| e.to_string())?;
    for (sql, owner) in [
        (
            format!(
                "UPDATE {table} SET token = token + 1,
                        expires_at = greatest(expires_at, now() + interval '60 seconds')
                  WHERE name = $1 AND owner = 'shared'"
            ),
            None,
        ),
        (
            format!("INSERT INTO {table}_shared VALUES ($1, $2, now() + interval '60 seconds')"),
            Some("00000000-0000-4000-8000-00000000race"),
        ),
    ] {
        let q = sqlx::query(&sql).bind(name);
        let q = match owner {
            Some(o) => q.bind(o),
            None => q,
        };
        let done = q.execute(&mut *grant).await.map_err(|e| e.to_string())?;
        if done.rows_affected() != 1 {
            return Err(format!("the hand-run grant changed {} rows", done.rows_affected()).into());
        }
    }
    let release = tokio::spawn(async move { first.release().await });
    // The release is in: it waits for the row lock the open grant holds.
    let waiting = "SELECT count(*) FROM pg_stat_activity
                    WHERE wait_event_type = 'Lock' AND query LIKE '%seen AS%'";
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = sqlx::query_scalar(waiting)
            .fetch_one(&admin)
            .await
            .map_err(|e| e.to_string())?;
        if n > 0 {
            break;
        }
        if tokio::time::Instant::now() > until || release.is_finished() {
            return Err("the release never waited for the lock row held by the grant".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    grant.commit().await.map_err(|e| e.to_string())?;
    let held = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .map_err(|_| "the release did not finish")?
        .map_err(|e| e.to_string())??;
    if !held {
        return Err("the release reported its hold as not held".into());
    }
    let status = backend
        .inspect(&distlock_core::LockName::new(name)?)
        .await?;
    if status.shared != Some(1) {
        return Err(format!(
            "{:?} shared holds after the race, expected 1",
            status.shared
        )
        .into());
    }
    if client.lock(name).try_acquire().await?.is_some() {
        return Err("a writer took the lock while the racing reader held it".into());
    }
    Ok(())
}

/// See [`sql_support::renewal_committing_at_expiry_keeps_its_permit`]; the
/// renewal is the backend's statement, the wait is seen in
/// `pg_stat_activity`.
async fn renewal_at_expiry(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("renew")?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let renew = format!(
        "UPDATE {table}_permits SET expires_at = now() + interval '60 seconds'
          WHERE name = $1 AND owner = $2 AND expires_at > now()"
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
                "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND query LIKE '%\\_grant(%'",
            )
            .fetch_one(&admin)
            .await?;
            Ok(n > 0)
        },
    )
    .await
}

/// See [`sql_support::a_stale_grant_routine_is_replaced`]: the stale
/// function answers that the semaphore exists and grants nothing.
async fn stale_grant_routine(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("stale")?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let stale = format!(
        "CREATE OR REPLACE FUNCTION {table}_grant(
            p_name text, p_owner text, p_ttl_us bigint, p_limit bigint, p_holder text,
            OUT exists_with_limit boolean, OUT granted_token bigint,
            OUT earliest_left_us bigint)
         LANGUAGE plpgsql AS $$ BEGIN exists_with_limit := true; END $$"
    );
    sql_support::a_stale_grant_routine_is_replaced(&url, || async move {
        sqlx::query(&stale).execute(&admin).await.map(|_| ())
    })
    .await
}

/// Waits (up to 10 s) until a session waits for a row lock in a statement
/// containing `marker`.
async fn until_waiting(admin: &sqlx::PgPool, marker: &str) -> Result<(), Failed> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
        )
        .bind(marker)
        .fetch_one(admin)
        .await
        .map_err(|e| e.to_string())?;
        if n > 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > until {
            return Err(format!("no statement with {marker:?} waited for a lock").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shared release that raced a grant settles the lock row under its row
/// lock. Meanwhile another reader's renewal, committing as that reader's
/// hold ends, has locked its hold's row and next updates the lock row. The
/// settling must not wait for the renewal's row (which, waiting for the
/// lock row in turn, would be a deadlock, and the release's error); it
/// finishes while the renewal is still open.
async fn raced_release_and_renewal(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("deadlock")?;
    let backend = SqlBackend::connect(&url).await?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let name = distlock_core::LockName::new("race/release-renewal")?;
    let shared = |ttl| {
        let mut req = distlock_core::LockRequest::new(name.clone(), ttl);
        req.kind = distlock_core::HoldKind::Shared;
        req
    };
    let (ending, releasing) = (
        shared(Duration::from_millis(1500)),
        shared(Duration::from_secs(30)),
    );
    let began = tokio::time::Instant::now();
    for req in [&ending, &releasing] {
        backend
            .try_acquire(req)
            .await?
            .ok_or("a shared hold was refused")?;
    }
    let sql_err = |e: sqlx::Error| Failed::from(e.to_string());
    // The renewal of the ending hold, by hand: its hold's row first.
    let mut renewal = admin.begin().await.map_err(sql_err)?;
    let renewed = sqlx::query(&format!(
        "UPDATE {table}_shared SET expires_at = now() + interval '60 seconds'
          WHERE name = $1 AND owner = $2 AND expires_at > now()"
    ))
    .bind(name.as_str())
    .bind(ending.owner.to_string())
    .execute(&mut *renewal)
    .await
    .map_err(sql_err)?;
    if renewed.rows_affected() != 1 {
        return Err("the hand-run renewal found no live hold".into());
    }
    // A grant by hand holds the lock row, so that the release races it.
    let mut grant = admin.begin().await.map_err(sql_err)?;
    sqlx::query(&format!(
        "UPDATE {table} SET token = token + 1 WHERE name = $1"
    ))
    .bind(name.as_str())
    .execute(&mut *grant)
    .await
    .map_err(sql_err)?;
    let b = backend.clone();
    let release = tokio::spawn(async move { b.release(&releasing).await });
    until_waiting(&admin, "seen AS").await?;
    // The ending hold's committed end passes; then the grant commits and
    // the release, raced, settles the lock row.
    tokio::time::sleep_until(began + Duration::from_millis(1800)).await;
    grant.commit().await.map_err(sql_err)?;
    let settled = tokio::time::timeout(Duration::from_secs(3), release).await;
    // The renewal goes on to the lock row, and commits.
    sqlx::query(&format!(
        "UPDATE {table} SET expires_at = greatest(expires_at, now() + interval '60 seconds')
          WHERE name = $1 AND owner = 'shared'"
    ))
    .bind(name.as_str())
    .execute(&mut *renewal)
    .await
    .map_err(sql_err)?;
    renewal.commit().await.map_err(sql_err)?;
    let held = settled
        .map_err(|_| "the raced release waited for the renewal's hold row")?
        .map_err(|e| e.to_string())??;
    if !held {
        return Err("the release reported its hold as not held".into());
    }
    Ok(())
}

/// Whether a notification arrives on `listener` within `within`.
async fn notified_within(
    listener: &mut sqlx::postgres::PgListener,
    within: Duration,
) -> Result<bool, Failed> {
    match tokio::time::timeout(within, listener.recv()).await {
        Ok(n) => n.map(|_| true).map_err(|e| e.to_string().into()),
        Err(_) => Ok(false),
    }
}

/// A release sends `NOTIFY` only if a waiting attempt marked the lock row
/// as awaited since its last exclusive grant: an uncontended release sends
/// none, one with an exclusive or a shared waiter does, and an exclusive
/// grant clears the mark. (Every `NOTIFY` takes a lock that all notifying
/// commits of the database take turns on.)
async fn notifies_only_while_awaited(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("awaited")?;
    // Without the queue, whose notifications go to the head's client's
    // own channel (the `fifo` cases count those statements).
    let backend = SqlBackend::connect(&format!("{url}&fifo=false")).await?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let mut listener = sqlx::postgres::PgListener::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    listener
        .listen(&format!("distlock_{table}"))
        .await
        .map_err(|e| e.to_string())?;
    let name = distlock_core::LockName::new("notify/awaited")?;
    let quiet = Duration::from_millis(300);
    let exclusive = || distlock_core::LockRequest::new(name.clone(), Duration::from_secs(30));
    let alone = exclusive();
    backend.try_acquire(&alone).await?.ok_or("refused")?;
    backend.release(&alone).await?;
    if notified_within(&mut listener, quiet).await? {
        return Err("an uncontended release notified".into());
    }
    for waiter_kind in [
        distlock_core::HoldKind::Exclusive,
        distlock_core::HoldKind::Shared,
    ] {
        let holder = exclusive();
        backend.try_acquire(&holder).await?.ok_or("refused")?;
        let mut waiter = exclusive();
        waiter.kind = waiter_kind;
        let (b, w) = (backend.clone(), waiter.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let waiting = tokio::spawn(async move { b.acquire(&w, Some(deadline)).await });
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let awaited: bool =
                sqlx::query_scalar(&format!("SELECT awaited FROM {table} WHERE name = $1"))
                    .bind(name.as_str())
                    .fetch_one(&admin)
                    .await
                    .map_err(|e| e.to_string())?;
            if awaited {
                break;
            }
            if tokio::time::Instant::now() > until {
                return Err(format!("a {waiter_kind:?} waiter never marked the row").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        backend.release(&holder).await?;
        if !notified_within(&mut listener, Duration::from_secs(5)).await? {
            return Err(format!("a release with a {waiter_kind:?} waiter did not notify").into());
        }
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .map_err(|_| "the waiter was not granted")?
            .map_err(|e| e.to_string())??;
        backend.release(&waiter).await?;
        // An exclusive grant clears the mark; a shared one leaves it (a
        // writer refused by the readers would still wait), so the reader's
        // release, freeing the row, notifies (awaited in full, so that it
        // cannot land in the check after this one).
        if waiter_kind == distlock_core::HoldKind::Exclusive {
            if notified_within(&mut listener, quiet).await? {
                return Err("the release after the exclusive waiter's grant notified".into());
            }
        } else if !notified_within(&mut listener, Duration::from_secs(5)).await? {
            return Err(
                "the release of the shared waiter's hold, freeing the row, did not notify".into(),
            );
        }
        let next = exclusive();
        backend.try_acquire(&next).await?.ok_or("refused")?;
        backend.release(&next).await?;
        if notified_within(&mut listener, quiet).await? {
            return Err(format!(
                "an uncontended release after the {waiter_kind:?} waiter notified: the grant before it left the mark"
            )
            .into());
        }
    }
    Ok(())
}

/// A lock table created before the `awaited` column existed gets it when a
/// client starts, and locks work on it.
async fn old_lock_table(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("old")?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    sqlx::query(&format!(
        "CREATE TABLE {table} (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,
                               expires_at TIMESTAMPTZ NOT NULL)"
    ))
    .execute(&admin)
    .await
    .map_err(|e| e.to_string())?;
    sqlx::query(&format!(
        "INSERT INTO {table} VALUES ('old/held-before', NULL, 7, now())"
    ))
    .execute(&admin)
    .await
    .map_err(|e| e.to_string())?;
    let client = LockClient::new(SqlBackend::connect(&url).await?);
    let guard = client.lock("old/held-before").acquire().await?;
    if guard.token().get() <= 7 {
        return Err(format!("token {} does not follow the row's 7", guard.token().get()).into());
    }
    guard.release().await?;
    Ok(())
}

/// The observer's next leader value unlike `last`, within `within`.
async fn next_change(
    leaders: &mut distlock_core::LeaderStream,
    last: &Option<String>,
    within: Duration,
) -> Result<Option<String>, Failed> {
    use futures_util::StreamExt;
    let change = async {
        loop {
            let item = leaders.next().await.ok_or("the observer ended")?;
            let now = item?.map(|l| l.value);
            if &now != last {
                return Ok::<_, Failed>(now);
            }
        }
    };
    tokio::time::timeout(within, change)
        .await
        .map_err(|_| Failed::from(format!("no change from {last:?} within {within:?}")))?
}

/// A URL whose observers read the leader only once a minute unless
/// notified (or a lease ends).
fn quiet_observer_url(f: &SqlFactory) -> Result<String, Failed> {
    f.url_with("observe_recheck_ms=60000")
}

/// An observer whose safety net is a minute, with leases of 30 s, sees a
/// grant after it read nobody (`take`), a proclamation, a resignation, a
/// grant by a waiting campaign's attempt, and an eviction, each within
/// 5 s: only the statements' notifications can tell it in time.
async fn observer_notified(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let observer = SqlBackend::connect(&quiet_observer_url(&f)?).await?;
    let b = f.connect(SqlConfig::default()).await?;
    let election = distlock_core::LockName::new(format!(
        "observed/{}",
        &integration_tests::namespace()[12..]
    ))?;
    let bound = Duration::from_secs(5);
    let ttl = Duration::from_secs(30);
    let mut leaders = observer
        .observe_leader(&election)
        .await?
        .ok_or("PostgreSQL observes by notification")?;
    let first = next_change(&mut leaders, &Some("?".into()), bound).await?;
    if first.is_some() {
        return Err(format!("a leader before any campaign: {first:?}").into());
    }

    let a = distlock_core::LockRequest::leader(election.clone(), ttl, "a1");
    b.try_acquire(&a)
        .await?
        .ok_or("nobody led, yet a1 was refused")?;
    let seen = next_change(&mut leaders, &first, bound).await?;
    if seen.as_deref() != Some("a1") {
        return Err(format!("after the grant of a1 the observer saw {seen:?}").into());
    }

    if !b.proclaim(&a, "a2").await? {
        return Err("a1 could not proclaim".into());
    }
    let seen = next_change(&mut leaders, &seen, bound).await?;
    if seen.as_deref() != Some("a2") {
        return Err(format!("after the proclamation the observer saw {seen:?}").into());
    }

    if !b.release(&a).await? {
        return Err("a2 no longer led when it resigned".into());
    }
    let seen = next_change(&mut leaders, &seen, bound).await?;
    if seen.is_some() {
        return Err(format!("after the resignation the observer saw {seen:?}").into());
    }

    // A campaign's waiting attempt grants by another statement.
    let next = distlock_core::LockRequest::leader(election.clone(), ttl, "b1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    b.acquire(&next, Some(deadline)).await?;
    let seen = next_change(&mut leaders, &seen, bound).await?;
    if seen.as_deref() != Some("b1") {
        return Err(format!("after the waiting campaign's grant the observer saw {seen:?}").into());
    }

    if !b.evict(&election).await? {
        return Err("nothing to evict".into());
    }
    let seen = next_change(&mut leaders, &seen, bound).await?;
    if seen.is_some() {
        return Err(format!("after the eviction the observer saw {seen:?}").into());
    }
    Ok(())
}

/// A 300 ms leadership ends with no notification on the locks' channel
/// (its grant sends the only one), and an observer whose safety net is a
/// minute still sees nobody lead, woken by the lease's end.
async fn observer_sees_expiry(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let (table, url) = f.own_table("expiring")?;
    let observer = SqlBackend::connect(&format!("{url}&observe_recheck_ms=60000")).await?;
    let b = SqlBackend::connect(&url).await?;
    let election = distlock_core::LockName::new("observed/expiring")?;
    let mut raw = sqlx::postgres::PgListener::connect(&f.url()?)
        .await
        .map_err(|e| e.to_string())?;
    raw.listen(&format!("distlock_{table}"))
        .await
        .map_err(|e| e.to_string())?;
    let mut leaders = observer
        .observe_leader(&election)
        .await?
        .ok_or("PostgreSQL observes by notification")?;
    let bound = Duration::from_secs(5);
    let first = next_change(&mut leaders, &Some("?".into()), bound).await?;
    if first.is_some() {
        return Err(format!("a leader before any campaign: {first:?}").into());
    }
    let short =
        distlock_core::LockRequest::leader(election.clone(), Duration::from_millis(300), "short");
    b.try_acquire(&short).await?.ok_or("nobody led")?;
    let seen = next_change(&mut leaders, &first, bound).await?;
    if seen.as_deref() != Some("short") {
        return Err(format!("after the short grant the observer saw {seen:?}").into());
    }
    let seen = next_change(&mut leaders, &seen, bound).await?;
    if seen.is_some() {
        return Err(format!("after the lease ended the observer saw {seen:?}").into());
    }
    let granted = format!("={election}@election");
    loop {
        match tokio::time::timeout(Duration::from_millis(300), raw.recv()).await {
            Err(_) => break,
            Ok(n) => {
                let n = n.map_err(|e| e.to_string())?;
                if n.payload() != granted {
                    return Err(format!("an unexpected notification: {:?}", n.payload()).into());
                }
            }
        }
    }
    Ok(())
}

/// An observer holds the client's LISTEN connection (opened before its
/// first read) and closes it when dropped. `observe_recheck_ms` must be a
/// positive number.
async fn observer_stops_listening(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("observer_{}", &integration_tests::namespace()[12..]);
    let observer = SqlBackend::connect(&f.url_with(&format!("application_name={app}"))?).await?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let election = distlock_core::LockName::new("observed/dropped")?;
    let mut leaders = observer
        .observe_leader(&election)
        .await?
        .ok_or("PostgreSQL observes by notification")?;
    next_change(&mut leaders, &Some("?".into()), Duration::from_secs(5)).await?;
    let n = listening(&admin, &app).await?.len();
    if n != 1 {
        return Err(format!("an observer had {n} LISTEN connections, not 1").into());
    }
    drop(leaders);
    until_listening(
        &admin,
        &app,
        0,
        "LISTEN connections stayed open after the observer was dropped",
    )
    .await?;
    for bad in ["0", "soon"] {
        match SqlBackend::connect(&f.url_with(&format!("observe_recheck_ms={bad}"))?).await {
            Err(distlock_core::Error::InvalidInput { .. }) => {}
            other => {
                return Err(format!("observe_recheck_ms={bad}: {:?}", other.map(|_| ())).into())
            }
        }
    }
    Ok(())
}

/// With `fifo`, a client whose task waits in a queue listens on its own
/// channel alone: the locks' channel, where an election's observers are told
/// of each grant and resignation, wakes nothing in it. An observer of the
/// same client listens there, on a connection of its own, and is still told.
/// Seen in `pg_stat_activity`: a listening connection's last statement is
/// its `LISTEN`.
async fn fifo_waiters_listen_apart(f: Arc<SqlFactory>) -> Result<(), Failed> {
    let app = format!("fifo_listener_{}", &integration_tests::namespace()[12..]);
    let client = SqlBackend::connect(&f.url_with(&format!(
        "fifo=true&observe_recheck_ms=60000&application_name={app}"
    ))?)
    .await?;
    let waiter = LockClient::new(client.clone());
    let holder = SqlBackend::connect(&f.url_with("fifo=true")?).await?;
    let admin: sqlx::PgPool = f.admin_pool().await?;
    let until = |want: usize, why: &'static str| until_listening(&admin, &app, want, why);
    let ns = &integration_tests::namespace()[12..];
    let name = distlock_core::LockName::new(format!("fifo/listen/{ns}"))?;
    let ttl = Duration::from_secs(120);
    let held = distlock_core::LockRequest::new(name.clone(), ttl);
    holder
        .try_acquire(&held)
        .await?
        .ok_or("the lock was taken before the case")?;
    let w = {
        let (waiter, name) = (waiter.clone(), name.to_string());
        tokio::spawn(async move { waiter.lock(&name).ttl(ttl).acquire().await })
    };
    let only = until(1, "a queued waiter's client did not LISTEN once").await?;
    let queue_channel = "\"distlock_q_";
    if only[0].matches("LISTEN").count() != 1 || !only[0].contains(queue_channel) {
        return Err(format!(
            "a queued waiter's client listens on more than its own channel: {:?}",
            only[0]
        )
        .into());
    }

    let election = distlock_core::LockName::new(format!("fifo/observed/{ns}"))?;
    let mut leaders = client
        .observe_leader(&election)
        .await?
        .ok_or("PostgreSQL observes by notification")?;
    let first = next_change(&mut leaders, &Some("?".into()), Duration::from_secs(5)).await?;
    if first.is_some() {
        return Err(format!("a leader before any campaign: {first:?}").into());
    }
    let both = until(2, "an observer did not LISTEN apart from the queued waiter").await?;
    // The pool hands out its connections in any order: told apart by
    // their channels.
    let own = both.iter().filter(|q| q.contains(queue_channel)).count();
    let single = both.iter().all(|q| q.matches("LISTEN").count() == 1);
    if own != 1 || !single {
        return Err(format!(
            "not one connection on the client's own channel and one on the locks': {both:?}"
        )
        .into());
    }
    let campaign = distlock_core::LockRequest::leader(election.clone(), ttl, "v1");
    holder
        .try_acquire(&campaign)
        .await?
        .ok_or("nobody led, yet the campaign was refused")?;
    let seen = next_change(&mut leaders, &first, Duration::from_secs(5)).await?;
    if seen.as_deref() != Some("v1") {
        return Err(format!("after the grant the observer saw {seen:?}").into());
    }
    holder.release(&campaign).await?;
    let seen = next_change(&mut leaders, &seen, Duration::from_secs(5)).await?;
    if seen.is_some() {
        return Err(format!("after the resignation the observer saw {seen:?}").into());
    }

    holder.release(&held).await?;
    let got = tokio::time::timeout(Duration::from_secs(15), w)
        .await
        .map_err(|_| Failed::from("the queued waiter was not granted after the release"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    drop(leaders);
    until(
        0,
        "LISTEN connections stayed open after the waiter and the observer",
    )
    .await?;
    Ok(())
}

/// A server of its own, so that only a case's statements are counted.
async fn fifo_server() -> Result<(integration_tests::harness::ServerProcess, String), Failed> {
    let process = tokio::task::spawn_blocking(pg::spawn)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = ServerKind::Postgres.url("127.0.0.1", process.port);
    Ok((process, url))
}

/// A renewal whose reply the network loses waits for ever in the database
/// client (it has no read timeout); it is given up at its hold's deadline,
/// so the renewals of a hold taken after it go out and keep that hold.
async fn unanswered_renewal() -> Result<(), Failed> {
    let (server, _) = fifo_server().await?;
    let proxy =
        integration_tests::harness::proxy::Proxy::start(server.port).map_err(|e| e.to_string())?;
    let proxied = ServerKind::Postgres.url("127.0.0.1", proxy.port);
    let client = LockClient::new(SqlBackend::connect(&proxied).await?);
    let ttl = Duration::from_secs(3);
    let first = client.lock("unanswered/a").ttl(ttl).acquire().await?;
    // Its first renewal goes out a third of the TTL after the grant, or a
    // little earlier (renewals share a grid): lose that reply, and only
    // that one (nothing else is sent until then; the renewal's timer fires
    // before this sleep's even if the process stalls).
    proxy.set_drop_replies(true);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    proxy.set_drop_replies(false);
    let later = client.lock("unanswered/b").ttl(ttl).acquire().await?;
    tokio::time::sleep(ttl * 3).await;
    if first.is_held() {
        return Err("the hold whose renewal reply was lost is still held".into());
    }
    if !later.is_held() {
        return Err("a hold taken after an unanswered renewal was lost".into());
    }
    later.release().await?;
    drop(server);
    Ok(())
}

/// One value from `psql` at `url`.
fn psql_number(url: &str, sql: &str) -> Result<u64, Failed> {
    let mut c = pg::psql(url).map_err(|e| e.to_string())?;
    c.args(["-c", sql]);
    let out = integration_tests::harness::process::run_client(c)?;
    out.trim()
        .parse()
        .map_err(|_| format!("{sql} answered {out:?}").into())
}

/// The live entries of `name`'s wait queue.
fn fifo_queued(url: &str, name: &str) -> integration_tests::fifo::Count {
    let (url, sql) = (
        url.to_string(),
        format!(
            "SELECT count(*) FROM distlock_locks_queue WHERE name = '{name}' AND ends_at > now()"
        ),
    );
    Arc::new(move || psql_number(&url, &sql))
}

/// Twenty waiters' grants come in arrival order, one statement per grant
/// and per release (`pg_stat_statements`: the statements naming the lock
/// table, which name the semaphore's functions too), on `target` of
/// `permits` and its queue's row. Entries here last a minute, so no waiter
/// renews its entry while the test counts. Not counted: the two statements
/// a shared release adds when a concurrent release changed the lock row
/// under it (its row lock and the settling update): releasers' work, which
/// readers released together often run into.
async fn fifo_order(
    (what, row): (integration_tests::fifo::Queued, String),
    permits: u64,
) -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let mut c = pg::psql(&url).map_err(|e| e.to_string())?;
    c.args(["-c", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"]);
    integration_tests::harness::process::run_client(c)?;
    let counted = url.clone();
    let requests: integration_tests::fifo::Count = Arc::new(move || {
        psql_number(
            &counted,
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
              WHERE query LIKE '%distlock_locks%' AND query NOT LIKE '%pg_stat_statements%'
                AND query NOT LIKE '%count(*)%'
                AND query NOT LIKE '% FOR UPDATE' AND query NOT LIKE 'WITH rest AS%'",
        )
    });
    let n = 20;
    integration_tests::fifo::grants_in_arrival_order(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        what,
        n,
        fifo_queued(&url, &row),
        requests,
        // Each release and each grant one statement.
        2 * n as u64 + permits..=2 * n as u64 + permits,
    )
    .await
}

/// Queued permit waiters (limit 1) learn of a changed limit at their next
/// re-check, a third of their entries' life (here 500 ms), not at the
/// holder's expiry a minute later: each gets `LimitMismatch` naming both.
async fn fifo_changed_limit() -> Result<(), Failed> {
    use distlock_core::{Error, LockName, LockRequest};
    let (_server, url) = fifo_server().await?;
    let url = format!("{url}?fifo=true&queue_lease_ms=1500");
    let holder = SqlBackend::connect(&url).await?;
    let name = LockName::new("fifo/changed-limit")?;
    let held = LockRequest::permit(name.clone(), Duration::from_secs(60), 1);
    holder
        .try_acquire(&held)
        .await?
        .ok_or("the first permit was refused")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..2 {
        let (w, name, tx) = (SqlBackend::connect(&url).await?, name.clone(), tx.clone());
        tokio::spawn(async move {
            let req = LockRequest::permit(name, Duration::from_secs(60), 1);
            let _ = tx.send(w.acquire(&req, Some(deadline)).await);
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    if answers.try_recv().is_ok() {
        return Err("a waiter ended while every permit was held".into());
    }
    holder.set_limit(&name, 3).await?;
    for i in 0..2 {
        match tokio::time::timeout(Duration::from_secs(10), answers.recv()).await {
            Ok(Some(Err(Error::LimitMismatch {
                requested: 1,
                stored: 3,
                ..
            }))) => {}
            Ok(other) => return Err(format!("waiter {i} answered {other:?}").into()),
            Err(_) => return Err(format!("waiter {i} did not learn of the new limit").into()),
        }
    }
    Ok(())
}

async fn fifo_cancel((what, row): (integration_tests::fifo::Queued, String)) -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let lease = Duration::from_secs(60);
    integration_tests::fifo::a_cancelled_or_timed_out_waiter_leaves_no_entry(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis()),
        what,
        lease,
        fifo_queued(&url, &row),
    )
    .await
}

/// A wait dropped while its first attempt is blocked in the server (a
/// transaction holds the lock tables against writes meanwhile) leaves no
/// entry, though the attempt joins the queue after the drop.
async fn fifo_dropped_in_flight(
    (what, row): (integration_tests::fifo::Queued, String),
) -> Result<(), Failed> {
    use sqlx::Connection;
    let (_server, url) = fifo_server().await?;
    let (go_on, until_resumed) = tokio::sync::oneshot::channel::<()>();
    let blocker = tokio::sync::Mutex::new(None);
    let lease = Duration::from_secs(60);
    integration_tests::fifo::a_wait_dropped_before_its_first_answer_leaves_no_entry(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis()),
        what,
        fifo_queued(&url, &row),
        || async {
            let mut c = sqlx::PgConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            for sql in [
                "BEGIN",
                "LOCK TABLE distlock_locks, distlock_locks_sems, distlock_locks_permits \
                 IN SHARE ROW EXCLUSIVE MODE",
            ] {
                sqlx::query(sql)
                    .execute(&mut c)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let task = tokio::spawn(async move {
                let _ = until_resumed.await;
                sqlx::query("COMMIT").execute(&mut c).await.map(|_| ())
            });
            *blocker.lock().await = Some(task);
            Ok(())
        },
        || async {
            let _ = go_on.send(());
            let task = blocker.lock().await.take().ok_or("never paused")?;
            task.await
                .map_err(|e| e.to_string())?
                .map_err(|e| Failed::from(e.to_string()))
        },
    )
    .await
}

async fn fifo_freed_at_once() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let lease = Duration::from_secs(60);
    let (what, row) = sql_support::queued_semaphore_row("fifo/at-once");
    integration_tests::fifo::permits_freed_at_once_each_reach_a_waiter(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms={}", lease.as_millis()),
        what,
        lease,
        fifo_queued(&url, &row),
    )
    .await
}

/// A grant judges whether others still wait by its statement's snapshot,
/// which misses an entry that joins as it runs, and may clear the row's
/// `awaited` mark while a waiter is queued. Here the mark is cleared by
/// hand under a queued waiter: the holder's release must still wake it
/// (well before its own re-check, 20 s here), and a try in between must be
/// refused.
async fn fifo_lost_mark() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let fifo = format!("{url}?fifo=true&queue_lease_ms=60000");
    let name = "fifo/mark";
    let holder = LockClient::new(SqlBackend::connect(&fifo).await?);
    let held = holder.lock(name).acquire().await?;
    let waiter = LockClient::new(SqlBackend::connect(&fifo).await?);
    let waiting = tokio::spawn(async move {
        waiter
            .lock(name)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    let queued = fifo_queued(&url, name);
    let start = tokio::time::Instant::now();
    while queued()? != 1 {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the waiter never queued".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = pg::psql(&url).map_err(|e| e.to_string())?;
    c.args([
        "-c",
        &format!("UPDATE distlock_locks SET awaited = false WHERE name = '{name}'"),
    ]);
    integration_tests::harness::process::run_client(c)?;
    held.release().await?;
    if let Some(g) = holder.lock(name).try_acquire().await? {
        g.release().await?;
        return Err("a try took the lock from under a queued waiter".into());
    }
    let within = Duration::from_secs(10);
    let got = tokio::time::timeout(within, waiting)
        .await
        .map_err(|_| format!("the queued waiter had no grant {within:?} after the release"))?
        .map_err(|e| e.to_string())??;
    got.release().await?;
    Ok(())
}

async fn fifo_last_reader() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    sql_support::the_last_readers_release_wakes_a_queued_writer(&url, |row| fifo_queued(&url, row))
        .await
}

/// With `old_table`, the queue table exists already without the column
/// that tells shared entries apart (a table made by a client that predates
/// the column): the first client adds it.
async fn fifo_readers(old_table: bool) -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    if old_table {
        let mut c = pg::psql(&url).map_err(|e| e.to_string())?;
        c.args([
            "-c",
            "CREATE TABLE distlock_locks_queue (
                name TEXT COLLATE \"C\" NOT NULL, owner TEXT NOT NULL, client TEXT NOT NULL,
                arrival BIGSERIAL, ends_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (name, owner))",
        ]);
        integration_tests::harness::process::run_client(c)?;
    }
    let name = "fifo/readers";
    integration_tests::fifo::readers_never_pass_a_queued_writer(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        name,
        fifo_queued(&url, name),
    )
    .await
}

async fn fifo_writer_leaves() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    let name = "fifo/leaves";
    integration_tests::fifo::a_writer_that_leaves_lets_the_readers_behind_it_in(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true&queue_lease_ms=60000"),
        name,
        fifo_queued(&url, name),
    )
    .await
}

async fn fifo_evict() -> Result<(), Failed> {
    let (_server, url) = fifo_server().await?;
    sql_support::an_eviction_wakes_the_queued_head(&url, |row| fifo_queued(&url, row)).await
}

/// The cut-off waiter's pool and LISTEN connection run through a proxy
/// that then drops everything; entries last 3 s (the default).
async fn fifo_cut((what, row): (integration_tests::fifo::Queued, String)) -> Result<(), Failed> {
    let (server, url) = fifo_server().await?;
    let proxy =
        integration_tests::harness::proxy::Proxy::start(server.port).map_err(|e| e.to_string())?;
    let proxied = format!(
        "{}?fifo=true",
        ServerKind::Postgres.url("127.0.0.1", proxy.port)
    );
    integration_tests::fifo::a_cut_off_waiter_holds_up_the_queue_only_until_its_entry_lapses(
        sql_support::fifo_connect(),
        &format!("{url}?fifo=true"),
        &proxied,
        std::slice::from_ref(&proxy),
        what,
        SqlConfig::default().queue_lease,
        fifo_queued(&url, &row),
    )
    .await
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
    let admin: sqlx::PgPool = f.admin_pool().await?;
    sql_support::a_shared_renewal_after_its_lock_row_was_freed_leaves_nothing(
        f,
        |table, name| async move {
            let done = sqlx::query(&format!("UPDATE {table} SET owner = NULL WHERE name = $1"))
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
    let admin: sqlx::PgPool = f.admin_pool().await?;
    sql_support::a_limit_distlock_did_not_write_is_misconfigured(f, |table, name, set| {
        let admin = admin.clone();
        async move {
            let value = set.unwrap_or(0);
            let done = sqlx::query(&format!(
                "UPDATE {table} SET permits = {value} WHERE name = $1"
            ))
            .bind(name)
            .execute(&admin)
            .await?;
            Ok(done.rows_affected())
        }
    })
    .await
}
