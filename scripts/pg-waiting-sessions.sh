#!/usr/bin/env bash
# What waiting sessions cost every other statement of a PostgreSQL server:
# the mean latency of a one-row UPDATE (with and without a `pg_notify` on a
# channel nobody listens to), one pgbench client for SECONDS each, with
#   - no other session,
#   - N idle sessions LISTENing on channels of their own (distlock's waiting
#     clients with or without `fifo`),
#   - N sessions sleeping inside a statement (a waiter another session could
#     wake with `pg_cancel_backend`, as MySQL's waiters sleep in the server),
#   - N sessions waiting for a table lock (`LOCK TABLE ... IN SHARE MODE` in
#     an open transaction, behind one session holding ROW EXCLUSIVE): a
#     wait that takes no snapshot of its own.
# Runs a private server (PostgreSQL 15 binaries, `fsync=off`, as the test
# harness does) in a temporary directory and removes it. Needs root (the
# server runs as `postgres`). Usage: scripts/pg-waiting-sessions.sh [N...]
# (default: 10 100).
set -euo pipefail

BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
SECONDS_EACH=${SECONDS_EACH:-5}
PORT=${PORT:-55433}
if [ $# -eq 0 ]; then
  set -- 10 100
fi

DIR=$(mktemp -d)
chmod 755 "$DIR"
chown postgres "$DIR"
stop() {
  runuser -u postgres -- "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap stop EXIT

runuser -u postgres -- "$BIN/initdb" -D "$DIR/data" -A trust -U postgres --no-sync >/dev/null
runuser -u postgres -- "$BIN/pg_ctl" -D "$DIR/data" -w -l "$DIR/log" -o \
  "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=1000" \
  start >/dev/null

psql() { "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qAt "$@"; }
psql -c "CREATE TABLE t (name text PRIMARY KEY, owner text); INSERT INTO t VALUES ('a', NULL); CREATE TABLE bell ()"
echo "UPDATE t SET owner = NULL WHERE name = 'a';" >"$DIR/plain.sql"
echo "UPDATE t SET owner = NULL WHERE name = 'a' RETURNING pg_notify('nobody', 'a');" >"$DIR/notify.sql"

mean() {
  "$BIN/pgbench" -h 127.0.0.1 -p "$PORT" -U postgres -n -c 1 -T "$SECONDS_EACH" \
    -f "$DIR/$1.sql" postgres 2>&1 | sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p'
}

# Waits until `want` sessions besides this one are connected.
until_sessions() {
  for _ in $(seq 200); do
    [ "$(psql -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")" -ge "$1" ] && return
    sleep 0.1
  done
  echo "pg-waiting-sessions: only $(psql -c 'SELECT count(*) - 1 FROM pg_stat_activity') sessions of $1" >&2
  exit 1
}

hold=$((SECONDS_EACH * 2 + 10))
echo "| other sessions | UPDATE, ms | UPDATE + pg_notify, ms |"
echo "|---|---|---|"
echo "| none | $(mean plain) | $(mean notify) |"
for n in "$@"; do
  pids=()
  for i in $(seq "$n"); do
    (echo "LISTEN own_$i;"; sleep "$hold") | psql >/dev/null 2>&1 &
    pids+=($!)
  done
  until_sessions "$n"
  echo "| $n idle, each listening on a channel of its own | $(mean plain) | $(mean notify) |"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
  for i in $(seq "$n"); do
    psql -c "SELECT pg_sleep($hold)" >/dev/null 2>&1 &
    pids+=($!)
  done
  until_sessions "$n"
  echo "| $n sleeping inside a statement | $(mean plain) | $(mean notify) |"
  psql -c "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' AND pid <> pg_backend_pid()" >/dev/null
  wait 2>/dev/null || true
  pids=()
  (echo "BEGIN; LOCK TABLE bell IN ROW EXCLUSIVE MODE;"; sleep "$hold") | psql >/dev/null 2>&1 &
  pids+=($!)
  until_sessions 1
  for i in $(seq "$n"); do
    (echo "BEGIN; LOCK TABLE bell IN SHARE MODE;"; sleep "$hold") | psql >/dev/null 2>&1 &
    pids+=($!)
  done
  until_sessions $((n + 1))
  echo "| $n waiting for a table lock | $(mean plain) | $(mean notify) |"
  kill "${pids[@]}" 2>/dev/null || true
  psql -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE '%LOCK TABLE bell%' AND pid <> pg_backend_pid()" >/dev/null
  wait 2>/dev/null || true
done
