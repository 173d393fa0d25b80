#!/usr/bin/env bash
# Runs the embedded engine's semantics suites (ordered groups, work groups, worker pools,
# dead letters and redrive, retention, idempotency keys, delayed messages and schedules, keyspaces
# and transactions, producers, lifecycle, metrics and tracing, stats and the console) unchanged
# against a real single-member etcd (feature `etcd`):
# starts Debian's `etcd` on loopback ports chosen now, data in a temp dir, points the tests at
# it (`ROCKQ_TEST_ETCD`, see tests/common/mod.rs), and stops it by its pid at the end.
# Called by scripts/test.sh and scripts/etcd-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROCKQ_NEED_ETCD=1 source scripts/bootstrap.sh
# A loopback port nothing listens on now (etcd takes it a moment later), below Linux's
# ephemeral range (32768 up), where the many loopback connections of the tests before this
# one take their source ports.
port() {
  while :; do
    local p=$((20000 + RANDOM % 12000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
data=$(mktemp -d -t rockq-etcd-XXXXXX)
pid=""
# Stop etcd by its pid however this ends, keeping the tests' exit status (etcd's own, 143
# after the SIGTERM, must not become the script's).
stop_etcd() {
  local status=$?
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$data"
  exit "$status"
}
trap stop_etcd EXIT
# Started again on other ports if it does not answer within 20 s (a port taken meanwhile).
for attempt in 1 2 3; do
  client=$(port)
  peer=$(port)
  [ "$client" = "$peer" ] && continue
  rm -rf "$data/member"
  etcd --name semantics --data-dir "$data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "semantics=http://127.0.0.1:$peer" >"$data/etcd.log" 2>&1 &
  pid=$!
  up=""
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    (exec 3<>"/dev/tcp/127.0.0.1/$client") 2>/dev/null && { up=1; break; }
    sleep 0.1
  done
  [ -n "$up" ] && break
  echo "etcd-semantics: etcd did not answer on port $client (attempt $attempt); its log ends:" >&2
  tail -n 5 "$data/etcd.log" >&2 || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
done
[ -n "$pid" ] || { echo "etcd-semantics: could not start etcd" >&2; exit 1; }
export ROCKQ_TEST_ETCD="http://127.0.0.1:$client"
# Skipped: the tests that open or write RocksDB directly or measure its disk space.
features="${ROCKQ_FEATURES:-etcd}"
# (typed_jobs: its tower test runs on tokio's paused clock, under which every etcd request times
# out at once.)
cargo test --features "$features" --test ordered_basics --test ordered_offsets --test work_groups --test pool_workers \
  --test pool_typed_jobs "$@" -- --skip a_tower_timeout_layer --skip a_corrupt_record_mid_batch
cargo test --features "$features" --test ordered_poison "$@" -- --skip trimmed --skip stale_delivery_records --skip saturated --skip a_crash_after
cargo test --features "$features" --test dlq_redrive "$@" -- --skip a_corrupted_message
# One dead letter on its own (not the restart test, which opens the database with the
# Inspector, nor deleting the dead-letter queue: deleting queues is not on etcd yet).
cargo test --features "$features" --test dead_letter_actions "$@" -- --skip across_a_restart
# Operators' actions on one job (retry now, delete, dead-letter).
cargo test --features "$features" --test job_actions "$@"
# Where one job stands (Broker::job).
cargo test --features "$features" --test job_status "$@"
# Work groups ordered by key (50 keys × 20 messages there), through a crash half-way, and
# durable limits: rate, concurrency and per key.
cargo test --features "$features" --test work_per_key "$@"
cargo test --features "$features" --test limits "$@"
# Message priorities (not the export into a database directory).
# (Not the restart test: on etcd a stopped process's lease holds until it runs out, tested
# across brokers in tests/etcd_engine.rs.)
cargo test --features "$features" --test priorities "$@" -- --skip an_export_and_import --skip after_a_restart
# Kept job outcomes, results and progress reports (not the reset-while-leased test, nor the
# export into a database directory).
cargo test --features "$features" --test job_outcomes "$@" -- --skip a_trim_or_a_reset \
  --skip export_and_import
# Deleting and purging (not the tests that list RocksDB's keys).
cargo test --features "$features" --test admin_lifecycle "$@" -- --skip delete_and_recreate --skip delete_queue_under
cargo test --features "$features" --test queue_retention "$@" -- --skip large_consumed_backlog
# Keyspaces and transactions — keyspace writes, job acks and sends in one etcd transaction,
# pool handlers' transactions, keyed and delayed sends and ordered acks included (not the one
# that holds more than one etcd transaction's 128 operations: etcd cannot, docs/etcd.md).
cargo test --features "$features" --test kv_transactions "$@" -- --skip acks_count_toward_max_tx_ops
# Idempotency keys, delayed ones included.
cargo test --features "$features" --test queue_dedup "$@"
# Delayed messages and recurring schedules.
cargo test --features "$features" --test schedule_delays "$@"
# Producers, queue isolation, pool cancellation, group settings, lifecycle events and
# pipelines. Not on etcd: sends after the broker's runtime is gone (etcd refuses them:
# tests/etcd_engine.rs::calls_after_the_connecting_runtime_is_gone_…), and a settings record
# written into RocksDB directly.
cargo test --features "$features" --test queue_producers --test queue_isolation --test pool_cancellation \
  --test work_settings --test broker_events --test broker_errors --test ordered_pipelines "$@" -- \
  --skip sends_resolve_from_another_runtime \
  --skip a_record_from_an_older_build
# Shutdown and bad input (not the tests that open, lock or corrupt a RocksDB directory).
cargo test --features "$features" --test broker_shutdown --test broker_bad_input "$@" -- \
  --skip dropping_every_handle_without_shutdown --skip a_corrupted_registry_record \
  --skip a_corrupted_message_ends --skip a_database_held_by_another_process --skip a_database_open_in_this_process \
  --skip a_dropped_open
# Metrics, tracing events and OpenTelemetry context, as embedded (on etcd a writer round is a
# round of sends).
cargo test --features "$features" --test telemetry_metrics --test telemetry_tracing --test telemetry_otel \
  --test telemetry_grafana "$@"
# Flows of dependent jobs (across processes, and a change left by a stopped one:
# tests/etcd_flows.rs, tests/etcd_faults.rs).
cargo test --features "$features" --test flows "$@"
# Stats and the console's pages (flows included) and operator actions. Not: RocksDB's read-only
# opens and byte counts, a restart voiding leases (on etcd they hold until they run out), and
# `rockq serve` on a database path.
cargo test --features "$features" --test admin_inspect --test web_http --test web_operator "$@" -- \
  --skip inspector_reads_a_database_another_broker_holds --skip leases_of_a_process_that_is_gone \
  --skip live_stats_from_memory_agree --skip stats_report_lag_as_count_and_age \
  --skip a_read_only_console_reads_a_database --skip overview_shows_the_numbers \
  --skip rockq_serve_is_read_only --skip with_a_token_every_read_needs_it
