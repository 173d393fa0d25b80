//! rockq on etcd beside a raw `etcd-client` baseline, from the same run, on a 1-member and a
//! 3-member etcd cluster that the bench starts on loopback ports (and stops by pid):
//!
//! - **produce**: N messages (100-byte payloads) sent by 64 producer tasks, each awaiting
//!   every `send`, on one queue;
//! - **end to end**: the same produce while one ordered-group subscriber acks every delivery,
//!   timed from the first send to the N-th delivery; and while a worker pool of 8 (no-op
//!   handler) in the same broker runs every message as a job, timed until its last ack;
//! - **pool drain**: N messages already in the queue (sent before the clock starts), drained by
//!   a worker pool of a work-queue group (8 workers, a no-op handler): every job claimed (a claim
//!   record written with its fencing compares), read, acked (a `Done` record compared with the
//!   claim) and the offset moved, timed until the pool stopped with every ack in etcd;
//! - **pool drain, two brokers**: the same with two brokers (two etcd clients, as two
//!   instances of a service would have) on the namespace, each running a pool of 8 workers;
//!   they compete for the same messages, fenced by etcd's compares; and again with a
//!   `concurrency_limit` above what the handlers hold (every claim then also rewrites and
//!   compares the group's limit record: the cost of a limit that does not bind);
//! - **pool drain, handlers of 10 ms**: N/5 messages drained by a pool of 8 whose handler
//!   takes 10 ms (a sleep: a call to another service; `ROCKQ_BENCH_HANDLER_MS` sets it),
//!   beside eight tasks doing the same sleeps with no queue: what the writes behind each job
//!   cost when handlers do work (a lease renewed as a handler starts is a write of its own);
//! - **flows**: n / 5 steps in flows of 8 children and a parent `then` them, on one work group,
//!   submitted first, run by a pool of 8 (a no-op handler) until every step is acked in etcd:
//!   each child's ack carries its flow's change record, which its writer applies (the parent
//!   sent with the last child's); steps per second beside the pool drain's jobs per second;
//! - **a large flow**: one flow of n / 10 children and a parent, larger than one transaction:
//!   its submit timed (written in parts, its children sent over several transactions before it
//!   returns), with the longest answer to a flush asked of the writer meanwhile (how long the
//!   submit held the process's other requests), then its run by a pool of 8 — each child's change applied on its own, reading
//!   only the steps it touches — steps per second beside the pool drain's jobs per second;
//! - **raw drain**: the same work with `etcd-client` alone, sequentially, per batch of `k`
//!   messages: a claim Txn (`k` compares on the records' revisions, the offset compare, `k`
//!   puts), a ranged read of the `k` messages, a done Txn (`k` compares, `k` puts) and an
//!   offset Txn (compare, put, ranged delete of the records) — with `k` such that it commits as
//!   many write transactions per message as the pool did;
//! - **raw etcd**: N messages written with `etcd-client` alone, one transaction at a time, each
//!   `If value(tail) == prev Then Put message keys…, Put tail` — the shape of rockq's append —
//!   with as many messages per transaction as rockq's produce put in its own, and values of the
//!   size rockq stored. It is the ceiling of rockq's design: one append transaction in flight
//!   per queue. Beside it, **two writers at once** (each half the messages to a tail of its
//!   own): how far etcd overlaps transactions that arrive together, which is what the engine's
//!   appender task, writing beside the writer's claims and acks, can gain.
//!
//! - **large calls**: the N messages in `send_batch` calls of 4,096 (the default
//!   `max_batch_messages`) from one task: each one transaction of packed runs (32 runs of 128
//!   at 100 bytes; a call whose runs do not fit one is reserved and written in parts), beside
//!   **raw etcd** writing each call's messages in one transaction, packed into keys of 128 —
//!   the most etcd takes for this work — and raw etcd's full transactions of 127 unpacked,
//!   which the awaited produce is printed against.
//!
//! The ten run interleaved, three times per cluster, each in its own namespace (rockq) or
//! key prefix (raw); the table prints medians, and each repetition's figures go to stderr.
//!
//! `cargo bench --features etcd --bench etcd`; `ROCKQ_BENCH_ETCD_N` sets N (default 20,000),
//! `ROCKQ_BENCH_ONLY=1member|3member` runs one cluster size.

mod common;
#[path = "../tests/common/etcd.rs"]
mod etcd;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use futures::StreamExt;
use rockq::{Broker, EtcdOptions, WriterStats};

const PRODUCERS: u64 = 64;
/// etcd's default `--max-txn-ops` (128) less the tail's put: the most messages one append
/// transaction of rockq holds.
const MAX_TXN_MESSAGES: u64 = 127;
/// The queue every rockq measurement uses, and its id in a fresh namespace (the first queue
/// created gets id 1), which the raw baseline's keys copy.
const QUEUE: &str = "bench";
const QUEUE_ID: u32 = 1;
/// Repetitions of each measurement per cluster: one run on this kind of machine swings by a
/// third (etcd's fsyncs), so the table prints medians.
const REPS: usize = 3;

/// What one rockq measurement saw.
struct Measured {
    secs: f64,
    /// etcd transactions the measurement committed: the cluster's revision moved by this much
    /// (every committed Txn that writes bumps the revision by exactly one; a Txn whose compare
    /// fails writes nothing and does not; nothing else writes to the cluster meanwhile).
    txns: u64,
    /// The broker's writer counters over the measurement.
    writer: WriterStats,
}

fn main() {
    // `cargo test --all-targets --features etcd` runs this binary without `--bench`: only
    // check that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("etcd: skipped (run `cargo bench --features etcd --bench etcd`)");
        return;
    }
    let n: u64 = std::env::var("ROCKQ_BENCH_ETCD_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    assert!(n >= PRODUCERS, "ROCKQ_BENCH_ETCD_N must be at least {PRODUCERS}");
    let sizes: &[usize] = match std::env::var("ROCKQ_BENCH_ONLY").ok().as_deref() {
        None => &[1, 3],
        Some("1member") => &[1],
        Some("3member") => &[3],
        Some(other) => panic!("ROCKQ_BENCH_ONLY: expected 1member or 3member, got {other}"),
    };
    // Two workers, as the other benches: the etcd members share the same two cores.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    for &members in sizes {
        rt.block_on(bench_cluster(members, n));
    }
}

/// One repetition's measurements on a cluster.
/// The concurrency limit of the limited two-broker drain: above what 16 no-op handlers hold at
/// once, so what it costs is the limit record's compare, not waiting for a place.
const LIMIT: u32 = 1024;

/// What each handler of the working drain takes (a sleep: a call to another service).
fn handler_work() -> Duration {
    let ms = std::env::var("ROCKQ_BENCH_HANDLER_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    Duration::from_millis(ms)
}

struct Rep {
    produce: Measured,
    /// [`flow_drain`]: flows of [`FLOW_KIDS`] children and a parent, run by a pool of 8.
    flows: Measured,
    /// [`large_flow`]: its submit's seconds and write transactions, and its run.
    large_submit: (f64, u64, f64),
    large: Measured,
    e2e: Measured,
    /// The drain of n / 5 jobs whose handler takes [`handler_work`].
    drain_working: Measured,
    /// Eight tasks running as many handlers alone: the most a pool of 8 can do with them.
    handlers_alone_secs: f64,
    /// Send → pool → ack, in one broker.
    e2e_pool: Measured,
    drain: Measured,
    drain_two: Measured,
    /// The two brokers' drain of a group with a concurrency limit (every claim compared with
    /// the group's limit record).
    drain_limited: Measured,
    /// The raw drain: seconds, and its messages per batch.
    raw_drain_secs: f64,
    drain_k: u64,
    /// The raw baseline: seconds, and its messages per transaction.
    raw_secs: f64,
    /// The same appends by two writers at once.
    raw_two_secs: f64,
    /// The same transactions with their messages packed into one key each, as rockq's appends
    /// store them in a namespace of format 3.
    raw_packed_secs: f64,
    k: u64,
    /// `send_batch` calls of 4,096 messages (each one transaction of packed runs when they fit),
    /// raw etcd writing full transactions of 127 from the same run, and raw etcd writing each
    /// call's messages in one transaction of runs of 128.
    one_call: Measured,
    raw_full_secs: f64,
    raw_calls_secs: f64,
}

/// Starts a cluster of `members`, runs the three measurements on it `REPS` times, interleaved
/// (so drift of the machine between runs lands on both sides of each ratio), and prints their
/// table.
async fn bench_cluster(members: usize, n: u64) {
    let cluster = etcd::Cluster::start(members).await;
    let endpoints = cluster.endpoints();
    // The raw baseline's client, also used to read revisions and the stored values: connected
    // to every member, as rockq's is.
    let mut client = cluster.client().await;
    let mut value_len = 0;
    let mut reps = Vec::with_capacity(REPS);
    for i in 0..REPS {
        let ns = format!("bench-produce-{i}");
        let produce = produce(&endpoints, &mut client, &ns, n).await;
        value_len = stored_value_len(&mut client, &ns).await;
        // The raw baseline writes as many messages per transaction as this produce did on
        // average. A round holds one Txn per 127 messages of a queue, so with 64 producers
        // awaiting each send (≤ 64 staged at once) a round is one Txn and messages/rounds is the
        // Txn size; the revision delta counts the Txns themselves, so it stays right if rounds
        // ever split. Cost per Txn is a fixed round trip plus a part per put, so the same
        // count of Txns of the mean size carries the same work as rockq's mix of sizes.
        let k = (n as f64 / produce.txns.max(1) as f64).round().clamp(1.0, MAX_TXN_MESSAGES as f64) as u64;
        // Right after the produce, so both see the cluster in the same state (its database
        // grows by a few MB per measurement).
        let raw_secs = raw_appends(&mut client, &format!("bench-raw-{i}"), n, k, value_len).await;
        let raw_two_secs = raw_appends_two(&client, &format!("bench-raw-two-{i}"), n, k, value_len).await;
        let raw_packed_secs =
            raw_appends_as(&mut client, &format!("bench-raw-packed-{i}"), n, k, value_len, k).await;
        let raw_full_secs =
            raw_appends(&mut client, &format!("bench-raw-full-{i}"), n, MAX_TXN_MESSAGES, value_len).await;
        // Large calls beside the same calls' work as etcd takes it best: each call's messages in
        // one transaction, packed into keys of 128 (rockq's longest runs). A run of either is a
        // few transactions (tens of ms): the median of `CALL_RUNS`, alternating the two.
        let (mut calls, mut raw_calls) = (Vec::new(), Vec::new());
        for j in 0..CALL_RUNS {
            calls
                .push(produce_one_call(&endpoints, &mut client, &format!("bench-one-call-{i}-{j}"), n).await);
            raw_calls.push(
                raw_appends_as(
                    &mut client,
                    &format!("bench-raw-calls-{i}-{j}"),
                    n,
                    BATCH_CALL,
                    value_len,
                    RUN_SPAN,
                )
                .await,
            );
        }
        calls.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let one_call = calls.swap_remove(CALL_RUNS / 2);
        let raw_calls_secs = median(raw_calls.into_iter());
        let e2e = end_to_end(&endpoints, &mut client, &format!("bench-e2e-{i}"), n).await;
        let e2e_pool = end_to_end_pool(&endpoints, &mut client, &format!("bench-e2e-pool-{i}"), n).await;
        let drain = pool_drain(&endpoints, &mut client, &format!("bench-drain-{i}"), n).await;
        let working_ns = format!("bench-drain-working-{i}");
        let drain_working = pool_run(&endpoints, &mut client, &working_ns, n / 5, true, handler_work()).await;
        let handlers_alone_secs = handlers_alone(n / 5, handler_work()).await;
        // The pool's write transactions per message, matched by the raw drain's three per batch.
        let drain_k = (3.0 * n as f64 / drain.txns.max(1) as f64).round().clamp(1.0, 120.0) as u64;
        let raw_drain_secs =
            raw_drain(&mut client, &format!("bench-raw-drain-{i}"), n, drain_k, value_len).await;
        let flows = flow_drain(&endpoints, &mut client, &format!("bench-flows-{i}"), flow_count(n)).await;
        let (large_submit, large) =
            large_flow(&endpoints, &mut client, &format!("bench-large-flow-{i}"), n / 10).await;
        let drain_two =
            pool_drain_two(&endpoints, &mut client, &format!("bench-drain-two-{i}"), n, None).await;
        let drain_limited =
            pool_drain_two(&endpoints, &mut client, &format!("bench-drain-limited-{i}"), n, Some(LIMIT))
                .await;
        eprintln!(
            "{members} member(s), repetition {}: produce {:.0} msg/s, end to end {:.0} msg/s, through a pool {:.0} msg/s, raw (txn size {k}) {:.0} msg/s, pool drain {:.0} msg/s, raw drain (batch {drain_k}) {:.0} msg/s, two brokers' pools {:.0} msg/s, limited {:.0} msg/s",
            i + 1,
            n as f64 / produce.secs,
            n as f64 / e2e.secs,
            n as f64 / e2e_pool.secs,
            n as f64 / raw_secs,
            n as f64 / drain.secs,
            n as f64 / raw_drain_secs,
            n as f64 / drain_two.secs,
            n as f64 / drain_limited.secs
        );
        reps.push(Rep {
            produce,
            flows,
            large_submit,
            large,
            e2e,
            e2e_pool,
            drain,
            drain_working,
            handlers_alone_secs,
            drain_two,
            drain_limited,
            raw_drain_secs,
            drain_k,
            raw_secs,
            raw_two_secs,
            raw_packed_secs,
            k,
            one_call,
            raw_full_secs,
            raw_calls_secs,
        });
    }
    drop(client);
    // Dropping the cluster kills and reaps its members.
    drop(cluster);

    let rate = |secs: f64| n as f64 / secs;
    let raw_txns = |r: &Rep| n.div_ceil(r.k);
    println!();
    println!(
        "etcd, {members} member{}: {n} messages, {}-byte payloads stored as {value_len}-byte values, {PRODUCERS} producers awaiting each send; medians of {REPS}",
        if members == 1 { "" } else { "s" },
        common::PAYLOAD
    );
    println!("  {:<40} {:>9} {:>8} {:>7} {:>9} {:>8}", "", "msg/s", "vs raw", "txns", "msgs/txn", "ms/txn");
    // txns, msgs/txn and ms/txn are means over the repetitions (totals divided); "vs raw" is
    // the median of each repetition's ratio to its own baseline.
    let row = |name: &str,
               m: &dyn Fn(&Rep) -> &Measured,
               appends: &dyn Fn(&Measured) -> u64,
               base: &dyn Fn(&Rep) -> f64| {
        let txns: u64 = reps.iter().map(|r| m(r).txns).sum();
        let secs: f64 = reps.iter().map(|r| m(r).secs).sum();
        let appended: u64 = reps.iter().map(|r| appends(m(r))).sum();
        println!(
            "  {:<40} {:>9.0} {:>7.0}% {:>7} {:>9.1} {:>8.2}",
            name,
            median(reps.iter().map(|r| rate(m(r).secs))),
            100.0 * median(reps.iter().map(|r| base(r) / m(r).secs)),
            txns / REPS as u64,
            (n * REPS as u64) as f64 / appended.max(1) as f64,
            1e3 * secs / txns.max(1) as f64
        );
    };
    // A baseline's row: its seconds and write transactions per repetition.
    let raw_row = |name: &str, secs: &dyn Fn(&Rep) -> f64, txns: &dyn Fn(&Rep) -> u64| {
        let total: u64 = reps.iter().map(txns).sum();
        println!(
            "  {:<40} {:>9.0} {:>8} {:>7} {:>9.1} {:>8.2}",
            name,
            median(reps.iter().map(|r| rate(secs(r)))),
            "",
            total / REPS as u64,
            (n * REPS as u64) as f64 / total.max(1) as f64,
            1e3 * reps.iter().map(secs).sum::<f64>() / total.max(1) as f64
        );
    };
    row("produce", &|r| &r.produce, &|m| m.txns, &|r| r.raw_secs);
    // End to end, the writer also commits the group's offset (a Txn per round that saw acks),
    // in the same task as the appends: txns and ms/txn count those commits, msgs/txn only the
    // appends.
    row(
        "end to end (ordered group, ack each)",
        &|r| &r.e2e,
        &|m| m.txns.saturating_sub(m.writer.offset_commits),
        &|r| r.raw_secs,
    );
    // Send → pool → ack in one broker: the appends, claims and acks (with the offset moves)
    // share its writer, so txns counts all three kinds and msgs/txn is per write of any kind.
    row("end to end (pool of 8, ack each)", &|r| &r.e2e_pool, &|m| m.txns, &|r| r.raw_secs);
    println!(
        "  end to end through the pool vs produce: {:.0}% (issue 32: ≥ 50%)",
        100.0 * median(reps.iter().map(|r| r.produce.secs / r.e2e_pool.secs))
    );
    let (k_min, k_max) = (reps.iter().map(|r| r.k).min(), reps.iter().map(|r| r.k).max());
    let raw_name = match (k_min, k_max) {
        (Some(a), Some(b)) if a != b => format!("raw etcd (txn size {a}–{b})"),
        _ => format!("raw etcd (txn size {})", k_max.unwrap_or(0)),
    };
    raw_row(&raw_name, &|r| r.raw_secs, &raw_txns);
    // How far etcd overlaps transactions that arrive together: what a second task writing
    // beside the first (the appender beside the writer) can add.
    raw_row("  the same, two writers at once", &|r| r.raw_two_secs, &raw_txns);
    println!(
        "  raw etcd, two writers vs one: {:.2}x",
        median(reps.iter().map(|r| r.raw_secs / r.raw_two_secs))
    );
    // The same work packed as rockq stores it (one key per transaction): what etcd can do for
    // the messages 64 awaiting producers have out, one transaction at a time.
    raw_row("  the same, packed into one key a txn", &|r| r.raw_packed_secs, &raw_txns);
    println!(
        "  produce vs raw packed at the same size: {:.0}%",
        100.0 * median(reps.iter().map(|r| r.raw_packed_secs / r.produce.secs))
    );
    // Large calls beside raw etcd's full transactions; the awaited produce against them too
    // (issue 32's produce target is a share of full-transaction throughput).
    row("send_batch of 4096, one task", &|r| &r.one_call, &|m| m.txns, &|r| r.raw_calls_secs);
    raw_row("raw etcd (4096 a txn, runs of 128)", &|r| r.raw_calls_secs, &|_| n.div_ceil(BATCH_CALL));
    raw_row(&format!("raw etcd (txn size {MAX_TXN_MESSAGES})"), &|r| r.raw_full_secs, &|_| {
        n.div_ceil(MAX_TXN_MESSAGES)
    });
    println!(
        "  produce (64 awaiting producers) vs raw txn size {MAX_TXN_MESSAGES}: {:.0}%",
        100.0 * median(reps.iter().map(|r| r.raw_full_secs / r.produce.secs))
    );
    // The drain beside its own baseline.
    row("pool drain (work group, 8 workers)", &|r| &r.drain, &|m| m.txns, &|r| r.raw_drain_secs);
    raw_row(
        &format!("raw drain (batch {})", median(reps.iter().map(|r| r.drain_k as f64))),
        &|r| r.raw_drain_secs,
        &|r| 3 * n.div_ceil(r.drain_k),
    );
    // Handlers that work: beside what eight of them allow at most (their own time alone).
    let working = n / 5;
    let working_rate = median(reps.iter().map(|r| working as f64 / r.drain_working.secs));
    println!(
        "  {:<40} {:>9.0} {:>7.0}% {:>7} {:>9.1} {:>8.2}   ({working} jobs; vs eight tasks running the handlers alone)",
        format!("pool drain, handlers of {} ms each", handler_work().as_millis()),
        working_rate,
        100.0 * median(reps.iter().map(|r| r.handlers_alone_secs / r.drain_working.secs)),
        reps.iter().map(|r| r.drain_working.txns).sum::<u64>() / REPS as u64,
        (working * REPS as u64) as f64 / reps.iter().map(|r| r.drain_working.txns).sum::<u64>().max(1) as f64,
        1e3 * reps.iter().map(|r| r.drain_working.secs).sum::<f64>()
            / reps.iter().map(|r| r.drain_working.txns).sum::<u64>().max(1) as f64,
    );
    println!(
        "  {:<40} {:>9.0}   (the handlers' sleeps of {} ms take {:.2} ms each on this runtime)",
        "  eight tasks running the handlers alone",
        median(reps.iter().map(|r| working as f64 / r.handlers_alone_secs)),
        handler_work().as_millis(),
        1e3 * median(reps.iter().map(|r| r.handlers_alone_secs * 8.0 / working as f64)),
    );
    // Flows: their steps per second beside the plain drain of the same repetition (each step is
    // a job, and its finish carries a change record its writer then applies).
    let flows_row = |label: &str, steps: u64, m: &dyn Fn(&Rep) -> &Measured, note: String| {
        let txns: u64 = reps.iter().map(|r| m(r).txns).sum();
        println!(
            "  {:<40} {:>9.0} {:>7.0}% {:>7} {:>9.2} {:>8.2}   ({note})",
            label,
            median(reps.iter().map(|r| steps as f64 / m(r).secs)),
            100.0 * median(reps.iter().map(|r| (steps as f64 / m(r).secs) / rate(r.drain.secs))),
            txns / REPS as u64,
            (steps * REPS as u64) as f64 / txns.max(1) as f64,
            1e3 * reps.iter().map(|r| m(r).secs).sum::<f64>() / txns.max(1) as f64,
        );
    };
    flows_row(
        "flows, pool of 8 workers",
        flow_count(n) * (FLOW_KIDS + 1),
        &|r| &r.flows,
        format!(
            "{} flows of {FLOW_KIDS} children and a parent: steps/s, vs the pool drain's jobs/s",
            flow_count(n)
        ),
    );
    flows_row(
        "a large flow, pool of 8 workers",
        n / 10 + 1,
        &|r| &r.large,
        format!(
            "one flow of {} children and a parent; its submit {:.0} ms in {} transactions, the writer's longest answer meanwhile {:.1} ms (a flush)",
            n / 10,
            1e3 * median(reps.iter().map(|r| r.large_submit.0)),
            reps.iter().map(|r| r.large_submit.1).sum::<u64>() / REPS as u64,
            1e3 * median(reps.iter().map(|r| r.large_submit.2)),
        ),
    );
    // Two brokers' pools beside the same raw drain (one client, no competition: the most the
    // cluster does for this work in one sequence of transactions).
    row("pool drain, two brokers × 8 workers", &|r| &r.drain_two, &|m| m.txns, &|r| r.raw_drain_secs);
    row(&format!("  the same, concurrency_limit({LIMIT})"), &|r| &r.drain_limited, &|m| m.txns, &|r| {
        r.raw_drain_secs
    });
    let sum = |f: &dyn Fn(&Rep) -> u64| reps.iter().map(f).sum::<u64>() / REPS as u64;
    let (p_rounds, p_msgs) = (sum(&|r| r.produce.writer.rounds), sum(&|r| r.produce.writer.messages));
    println!(
        "  writer per repetition: produce {p_rounds} rounds, {:.1} msgs/round; end to end {} rounds, {} offset commits",
        p_msgs as f64 / p_rounds.max(1) as f64,
        sum(&|r| r.e2e.writer.rounds),
        sum(&|r| r.e2e.writer.offset_commits)
    );
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn connect(endpoints: &[String], namespace: &str) -> Broker {
    Broker::connect_etcd(endpoints.iter().cloned(), namespace, EtcdOptions::new())
        .await
        .expect("connect a broker to etcd")
}

/// The cluster's current revision (a linearizable read: every Txn answered before is counted).
async fn revision(client: &mut Client) -> i64 {
    let got = client.get("rockq-bench-revision", None).await.expect("read the revision");
    got.header().expect("a response header").revision()
}

/// The writer counters' growth from `before` to `after`.
fn writer_delta(before: WriterStats, after: WriterStats) -> WriterStats {
    WriterStats {
        rounds: after.rounds - before.rounds,
        messages: after.messages - before.messages,
        offset_commits: after.offset_commits - before.offset_commits,
        write_time: after.write_time.saturating_sub(before.write_time),
    }
}

/// `n` messages from `PRODUCERS` tasks, each awaiting every send (the first tasks take one
/// more when `n` does not divide evenly).
async fn send_all(q: &rockq::Queue, n: u64) {
    let (per, extra) = (n / PRODUCERS, n % PRODUCERS);
    let mut tasks = Vec::with_capacity(PRODUCERS as usize);
    let mut first = 0;
    for p in 0..PRODUCERS {
        let count = per + u64::from(p < extra);
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            for i in first..first + count {
                q.send(common::value(i)).await.expect("send");
            }
        }));
        first += count;
    }
    for t in tasks {
        t.await.expect("a producer task");
    }
}

/// Produce: `n` sends on a queue of a fresh namespace.
async fn produce(endpoints: &[String], client: &mut Client, ns: &str, n: u64) -> Measured {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    send_all(&q, n).await;
    let secs = start.elapsed().as_secs_f64();
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    assert_eq!(writer.messages, n, "the writer stored another count of messages than was sent");
    drop(q);
    broker.shutdown().await.expect("shut the broker down");
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// Messages per call of [`produce_one_call`]: the default `Options::max_batch_messages`.
const BATCH_CALL: u64 = 4096;

/// Runs of the large-call measurement and its baseline per repetition (each is short).
const CALL_RUNS: usize = 5;

/// The most messages rockq packs into one key (`store/etcd/segment.rs`'s `MAX_SPAN`).
const RUN_SPAN: u64 = 128;

/// `send_batch` calls of [`BATCH_CALL`] messages, one after another, `n` in all, on a queue of a
/// fresh namespace: each larger than a transaction, so its sequences are reserved and it is
/// written in transactions of 127.
async fn produce_one_call(endpoints: &[String], client: &mut Client, ns: &str, n: u64) -> Measured {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let mut next = 0;
    while next < n {
        let end = (next + BATCH_CALL).min(n);
        let seqs = q.send_batch((next..end).map(common::value)).await.expect("send_batch");
        assert_eq!(seqs, next + 1..=end);
        next = end;
    }
    let secs = start.elapsed().as_secs_f64();
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    drop(q);
    broker.shutdown().await.expect("shut the broker down");
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// End to end: the produce of [`produce`] while one ordered-group subscriber acks each delivery;
/// timed from the first send to the `n`-th delivery.
async fn end_to_end(endpoints: &[String], client: &mut Client, ns: &str, n: u64) -> Measured {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let mut sub = q.group("g").expect("a valid group name").subscribe().await.expect("subscribe");
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let consumer = tokio::spawn(async move {
        for expected in 1..=n {
            let d = sub.next().await.expect("the subscription ended early").expect("a delivery");
            assert_eq!(d.seq(), expected, "deliveries out of order");
            d.ack().expect("ack");
        }
        let last = Instant::now();
        // The offset reaches etcd before the broker shuts down (not timed).
        let committed = sub.commit().await.expect("commit the offset");
        (last, committed)
    });
    send_all(&q, n).await;
    let (last, committed) = consumer.await.expect("the consumer task");
    let secs = (last - start).as_secs_f64();
    assert_eq!(committed, n, "the committed offset is not the last message");
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    drop(q);
    broker.shutdown().await.expect("shut the broker down");
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// A handler taking `work` (none: a no-op), and a token it cancels once its `n`-th job is done
/// (the pool then stops).
fn jobs_until(
    n: u64,
    work: Duration,
) -> (
    rockq::CancellationToken,
    impl Fn(rockq::Task) -> futures::future::BoxFuture<'static, Result<(), rockq::HandlerError>>
    + Clone
    + Send
    + Sync
    + 'static,
) {
    use futures::FutureExt;
    let done = Arc::new(AtomicU64::new(0));
    let token = rockq::CancellationToken::new();
    let cancel = token.clone();
    let handler = move |_task: rockq::Task| {
        let (done, cancel) = (done.clone(), cancel.clone());
        async move {
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            if done.fetch_add(1, Ordering::SeqCst) + 1 == n {
                cancel.cancel();
            }
            Ok(())
        }
        .boxed()
    };
    (token, handler)
}

/// End to end through a pool: the produce of [`produce`] while a worker pool of 8 (no-op
/// handler, defaults) in the same broker runs the jobs; timed from the first send until the
/// pool stopped with every ack in etcd.
async fn end_to_end_pool(endpoints: &[String], client: &mut Client, ns: &str, n: u64) -> Measured {
    pool_run(endpoints, client, ns, n, false, Duration::ZERO).await
}

/// Children of each flow [`flow_drain`] runs (a parent runs after them).
const FLOW_KIDS: u64 = 8;

/// Flows [`flow_drain`] runs for a bench of `n` messages: about n / 5 steps.
fn flow_count(n: u64) -> u64 {
    (n / 5 / (FLOW_KIDS + 1)).max(1)
}

/// Flows: `flows` flows of [`FLOW_KIDS`] children and a parent `then` them, all on one work
/// group, submitted first (not timed), then run by a pool of 8 (a no-op handler) until every
/// step is acked in etcd — each parent sent as its last child's ack applies its flow's change.
async fn flow_drain(endpoints: &[String], client: &mut Client, ns: &str, flows: u64) -> Measured {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let group = q.work_group("w").expect("a valid group name");
    for f in 0..flows {
        let mut flow = broker.flow();
        let kids: Vec<_> =
            (0..FLOW_KIDS).map(|k| flow.job(&group, common::value(f * 100 + k)).expect("a step")).collect();
        flow.then(&group, common::value(f), &kids).expect("the parent");
        flow.submit().await.expect("submit a flow");
    }
    let steps = flows * (FLOW_KIDS + 1);
    let (token, handler) = jobs_until(steps, Duration::ZERO);
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let report = group.clone().workers(8).shutdown_on(token).run(handler).await.expect("the pool");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, steps, "the pool acked another count than the flows' steps");
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    let last = broker.flows(0, usize::MAX).await.expect("flows").pop().expect("a flow");
    assert_eq!(broker.flow_status(last).await.expect("status").state, rockq::FlowState::Succeeded);
    broker.shutdown().await.expect("shut the broker down");
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// A large flow: `kids` children and a parent `then` them, on one work group — its submit
/// timed (seconds, write transactions), then its run by a pool of 8 (a no-op handler) until
/// every step is acked in etcd and the flow has succeeded.
async fn large_flow(
    endpoints: &[String],
    client: &mut Client,
    ns: &str,
    kids: u64,
) -> ((f64, u64, f64), Measured) {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let group = q.work_group("w").expect("a valid group name");
    let mut flow = broker.flow();
    let steps: Vec<_> = (0..kids).map(|k| flow.job(&group, common::value(k)).expect("a step")).collect();
    flow.then(&group, common::value(kids), &steps).expect("the parent");
    let rev_before = revision(client).await;
    // While the submit runs, a probe asks the writer for flushes, one after another (a
    // millisecond apart): the longest one's answer is how long the submit held the process's
    // other requests.
    let submitting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe = {
        let (broker, submitting) = (broker.clone(), submitting.clone());
        tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            while submitting.load(Ordering::SeqCst) {
                let t = Instant::now();
                broker.flush().await.expect("a flush");
                longest = longest.max(t.elapsed());
                // A pause between flushes, so that the probe does not take a core.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            longest
        })
    };
    let start = Instant::now();
    let submitted = flow.submit().await.expect("submit a large flow");
    let submit_secs = start.elapsed().as_secs_f64();
    submitting.store(false, Ordering::SeqCst);
    let longest = probe.await.expect("the probe").as_secs_f64();
    let submit = (submit_secs, (revision(client).await - rev_before) as u64, longest);
    assert_eq!(submitted.sent.len() as u64, kids, "every child sent by the submit");
    let (token, handler) = jobs_until(kids + 1, Duration::ZERO);
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let report = group.clone().workers(8).shutdown_on(token).run(handler).await.expect("the pool");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, kids + 1, "the pool acked another count than the flow's steps");
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    // A large flow's last change is applied by the mover moments after its ack returned.
    let mut waited = 0;
    while broker.flow_status(submitted.id).await.expect("status").state != rockq::FlowState::Succeeded {
        waited += 1;
        assert!(waited < 1000, "the large flow never succeeded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    broker.shutdown().await.expect("shut the broker down");
    (submit, Measured { secs, txns: (rev_after - rev_before) as u64, writer })
}

/// Pool drain: `n` messages sent first (in batches of 100, not timed), then a worker pool of 8
/// on a work-queue group drains them; timed from the pool's start until it stopped with every
/// ack in etcd. The revision delta counts the drain's write transactions alone.
async fn pool_drain(endpoints: &[String], client: &mut Client, ns: &str, n: u64) -> Measured {
    pool_run(endpoints, client, ns, n, true, Duration::ZERO).await
}

/// The baseline of the working drain: `n` pieces of the handlers' work (`work` each) done by
/// eight tasks (the pool's workers) with no queue at all.
async fn handlers_alone(n: u64, work: Duration) -> f64 {
    let left = Arc::new(AtomicU64::new(n));
    let start = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let left = left.clone();
            tokio::spawn(async move {
                while left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1)).is_ok() {
                    tokio::time::sleep(work).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a task");
    }
    start.elapsed().as_secs_f64()
}

/// A pool of 8 workers whose handler takes `work` (none: a no-op) running `n` jobs in one broker: sent before the clock starts
/// (`backlog`), or by [`send_all`]'s producers while the pool runs.
async fn pool_run(
    endpoints: &[String],
    client: &mut Client,
    ns: &str,
    n: u64,
    backlog: bool,
    work: Duration,
) -> Measured {
    let broker = connect(endpoints, ns).await;
    let q = broker.queue(QUEUE).await.expect("create the queue");
    let mut sent = 0;
    while backlog && sent < n {
        let count = 100.min(n - sent);
        q.send_batch((sent..sent + count).map(common::value)).await.expect("fill the queue");
        sent += count;
    }
    let group = q.work_group("w").expect("a valid group name");
    let (token, handler) = jobs_until(n, work);
    let writer_before = broker.writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let pool = tokio::spawn(group.clone().workers(8).shutdown_on(token).run(handler));
    if !backlog {
        send_all(&q, n).await;
    }
    let report = pool.await.expect("the pool task").expect("the pool");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, n, "the pool acked another count than was sent");
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, broker.writer_stats());
    broker.flush().await.expect("flush");
    assert_eq!(group.committed(), Some(n), "the offset did not reach the last message");
    drop(q);
    broker.shutdown().await.expect("shut the broker down");
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// The pool drain with two brokers on the namespace, each running 8 workers, until every
/// message is acked (the writer counters are the first broker's).
async fn pool_drain_two(
    endpoints: &[String],
    client: &mut Client,
    ns: &str,
    n: u64,
    limit: Option<u32>,
) -> Measured {
    let brokers = [connect(endpoints, ns).await, connect(endpoints, ns).await];
    let q = brokers[0].queue(QUEUE).await.expect("create the queue");
    let mut sent = 0;
    while sent < n {
        let count = 100.min(n - sent);
        q.send_batch((sent..sent + count).map(common::value)).await.expect("fill the queue");
        sent += count;
    }
    let mut groups = Vec::new();
    for b in &brokers {
        let q = b.queue(QUEUE).await.expect("the queue");
        groups.push(q.work_group("w").expect("a valid group name").concurrency_limit(limit));
    }
    let done = Arc::new(AtomicU64::new(0));
    let token = rockq::CancellationToken::new();
    let writer_before = brokers[0].writer_stats();
    let rev_before = revision(client).await;
    let start = Instant::now();
    let pools = groups.iter().map(|group| {
        let (done, stop) = (done.clone(), token.clone());
        let handler = move |_task: rockq::Task| {
            if done.fetch_add(1, Ordering::SeqCst) + 1 == n {
                stop.cancel();
            }
            async { Ok(()) }
        };
        group.clone().workers(8).shutdown_on(token.clone()).run(handler)
    });
    let reports = futures::future::join_all(pools).await;
    let secs = start.elapsed().as_secs_f64();
    let acked: u64 = reports.into_iter().map(|r| r.expect("a pool").acked).sum();
    assert_eq!(acked, n, "the pools acked another count than was sent");
    let rev_after = revision(client).await;
    let writer = writer_delta(writer_before, brokers[0].writer_stats());
    for b in brokers {
        b.flush().await.expect("flush");
        b.shutdown().await.expect("shut the broker down");
    }
    Measured { secs, txns: (rev_after - rev_before) as u64, writer }
}

/// The raw drain (see the module docs): seconds to claim, read, finish and move past `n`
/// messages of `value_len` bytes in sequential batches of `k`, with rockq's key and record
/// shapes (claim records are rockq's size; the offset an 8-byte counter).
async fn raw_drain(client: &mut Client, prefix: &str, n: u64, k: u64, value_len: usize) -> f64 {
    let message_prefix = [format!("{prefix}/m/").as_bytes(), &QUEUE_ID.to_be_bytes()].concat();
    let claim_prefix = format!("{prefix}/c/claim:w:{QUEUE}:").into_bytes();
    let offset_key = format!("{prefix}/o/consumer:w:{QUEUE}").into_bytes();
    let key = |p: &[u8], seq: u64| [p, &seq.to_be_bytes()].concat();
    // The messages and the offset exist before the clock starts.
    let mut seq = 1;
    while seq <= n {
        let count = 127.min(n - seq + 1);
        let ops: Vec<TxnOp> = (seq..seq + count)
            .map(|s| {
                let mut v = common::value(s);
                v.resize(value_len, b'x');
                TxnOp::put(key(&message_prefix, s), v, None)
            })
            .collect();
        client.txn(Txn::new().and_then(ops)).await.expect("fill the raw queue");
        seq += count;
    }
    client.put(offset_key.clone(), 0u64.to_be_bytes().to_vec(), None).await.expect("the raw offset");
    let claim = vec![b'c'; 40];
    let start = Instant::now();
    let mut offset = 0u64;
    while offset < n {
        let (lo, hi) = (offset + 1, (offset + k).min(n));
        let floor = (lo - 1).to_be_bytes().to_vec();
        let mut cmps = vec![Compare::value(offset_key.clone(), CompareOp::Equal, floor.clone())];
        cmps.extend((lo..=hi).map(|s| Compare::mod_revision(key(&claim_prefix, s), CompareOp::Equal, 0)));
        let puts: Vec<TxnOp> =
            (lo..=hi).map(|s| TxnOp::put(key(&claim_prefix, s), claim.clone(), None)).collect();
        let claimed = client.txn(Txn::new().when(cmps).and_then(puts)).await.expect("a raw claim");
        assert!(claimed.succeeded(), "nothing else claims the raw records");
        let rev = claimed.header().expect("a header").revision();
        let read = GetOptions::new().with_range(key(&message_prefix, hi + 1));
        let got = client.get(key(&message_prefix, lo), Some(read)).await.expect("a raw read");
        assert_eq!(got.kvs().len() as u64, hi - lo + 1);
        let cmps: Vec<Compare> =
            (lo..=hi).map(|s| Compare::mod_revision(key(&claim_prefix, s), CompareOp::Equal, rev)).collect();
        let dones: Vec<TxnOp> =
            (lo..=hi).map(|s| TxnOp::put(key(&claim_prefix, s), vec![b'd'; 2], None)).collect();
        let finished = client.txn(Txn::new().when(cmps).and_then(dones)).await.expect("a raw ack");
        assert!(finished.succeeded(), "the raw claims are this loop's");
        let moved =
            Txn::new().when([Compare::value(offset_key.clone(), CompareOp::Equal, floor)]).and_then([
                TxnOp::put(offset_key.clone(), hi.to_be_bytes().to_vec(), None),
                TxnOp::delete(
                    key(&claim_prefix, 0),
                    Some(etcd_client::DeleteOptions::new().with_range(key(&claim_prefix, hi + 1))),
                ),
            ]);
        assert!(client.txn(moved).await.expect("a raw offset move").succeeded());
        offset = hi;
    }
    start.elapsed().as_secs_f64()
}

/// The size of one message value rockq stored in namespace `ns` (its envelope around the
/// payload), read from its key layout: `<ns>/m/<queue id u32><seq u64>`.
async fn stored_value_len(client: &mut Client, ns: &str) -> usize {
    let opts = GetOptions::new().with_prefix().with_limit(1);
    let got = client.get(format!("{ns}/m/"), Some(opts)).await.expect("read a stored message");
    let value = got.kvs().first().expect("rockq stored no message where the layout says").value();
    // A packed run (`store/etcd/segment.rs`): its first envelope's length.
    match value {
        [0xE5, _, _, a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]) as usize,
        _ => value.len(),
    }
}

/// Raw etcd: [`raw_appends`] of `n` messages by two writers at once, each to a tail of its
/// own with one transaction in flight (`n / 2` each).
async fn raw_appends_two(client: &Client, prefix: &str, n: u64, k: u64, value_len: usize) -> f64 {
    let (mut a, mut b) = (client.clone(), client.clone());
    let (pa, pb) = (format!("{prefix}-a"), format!("{prefix}-b"));
    let (sa, sb) = tokio::join!(
        raw_appends(&mut a, &pa, n / 2, k, value_len),
        raw_appends(&mut b, &pb, n - n / 2, k, value_len)
    );
    sa.max(sb)
}

/// rockq's tail record: last sequence and the nonce of the append that wrote it.
fn tail_value(last: u64, nonce: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&last.to_be_bytes());
    v.extend_from_slice(&nonce.to_be_bytes());
    v
}

/// Raw etcd: seconds to write `n` messages of `value_len` bytes under `prefix` with sequential
/// transactions of `k` messages, each as rockq's append: compare the tail's value, put the
/// messages at the next sequences and the new tail. Keys and values have rockq's shapes.
async fn raw_appends(client: &mut Client, prefix: &str, n: u64, k: u64, value_len: usize) -> f64 {
    raw_appends_as(client, prefix, n, k, value_len, 1).await
}

/// Raw etcd: `n` messages of `value_len` bytes, `k` per transaction, one transaction in flight,
/// each compared with the tail as the last one left it; `per_key` messages concatenated into
/// one key (with a length before each, as rockq packs them: `k` is one key per transaction,
/// 128 rockq's longest runs), or 1: one key each.
async fn raw_appends_as(
    client: &mut Client,
    prefix: &str,
    n: u64,
    k: u64,
    value_len: usize,
    per_key: u64,
) -> f64 {
    let tail_key = [format!("{prefix}/t/").as_bytes(), &QUEUE_ID.to_be_bytes()].concat();
    let message_prefix = [format!("{prefix}/m/").as_bytes(), &QUEUE_ID.to_be_bytes()].concat();
    // The queue exists before the clock starts, as rockq's does (its creation puts the tail).
    client.put(tail_key.clone(), tail_value(0, 0), None).await.expect("put the raw tail");
    let (mut last, mut nonce) = (0u64, 0u64);
    let start = Instant::now();
    while last < n {
        let count = k.min(n - last);
        let mut ops = Vec::with_capacity(count as usize + 1);
        let mut run = Vec::new();
        for seq in last + 1..=last + count {
            // Built per transaction, as rockq's writer copies each envelope into its Txn.
            let mut value = common::value(seq);
            value.resize(value_len, b'x');
            let key = [message_prefix.as_slice(), &seq.to_be_bytes()].concat();
            if per_key == 1 {
                ops.push(TxnOp::put(key, value, None));
                continue;
            }
            run.extend_from_slice(&(value.len() as u32).to_be_bytes());
            run.extend_from_slice(&value);
            if (seq - last) % per_key == 0 || seq == last + count {
                ops.push(TxnOp::put(key, std::mem::take(&mut run), None));
            }
        }
        ops.push(TxnOp::put(tail_key.clone(), tail_value(last + count, nonce + 1), None));
        let txn = Txn::new()
            .when([Compare::value(tail_key.clone(), CompareOp::Equal, tail_value(last, nonce))])
            .and_then(ops)
            .or_else([TxnOp::get(tail_key.clone(), None)]);
        let resp = client.txn(txn).await.expect("a raw append");
        assert!(resp.succeeded(), "nothing else writes the raw tail: its compare must hold");
        last += count;
        nonce += 1;
    }
    start.elapsed().as_secs_f64()
}
