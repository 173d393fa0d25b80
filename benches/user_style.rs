//! rockq as a new user writes it from the README: default `Options` (only the durability set),
//! default group settings, plain tasks awaiting each `send`, `workers(n).run(handler).await` in
//! the application's own task, on a 2-worker runtime (`#[tokio::main(worker_threads = 2)]`),
//! 100-byte payloads — beside raw RocksDB from the same run and the tuned rows (sends kept in
//! flight, a pool spawned on the runtime) the other benches print.
//!
//! `cargo bench --bench user_style`; `ROCKQ_BENCH_N` sets the message count (default 500k),
//! `ROCKQ_BENCH_ONLY=send|fsync|ceiling|batch|e2e|pool|outcomes|priorities|limits|flows|latency` runs one part
//! (`ceiling`: awaited sends beside the same 64 tasks awaiting a bare thread's replies, with and
//! without a raw RocksDB write per group — see `common/handover.rs`; `outcomes`:
//! the pool(8) drain again with the group keeping outcomes and each job setting a 16-byte
//! result, and with a progress report per job too: their cost per job beside the plain drain;
//! `priorities`: the pool(8) drain of the backlog while 1,000 urgent jobs (priority 9) arrive
//! one by one, each timed from its send to its handler, beside the same drain without
//! priorities, and with every backlog job at priority 1; `limits`: the pool(8) drain with a
//! concurrency limit and with a rate limit, each set too high to bind — the cost per job of
//! checking them and writing the bucket, and of the rate-limited pool's claims for idle
//! handlers only — beside the plain drain; `flows`: the same backlog submitted as flows of ten
//! jobs and a `then` step each, in the same work group, drained by the pool(8) — each step's
//! cost beside the plain drain, and the submission's beside `send_batch`). The throughput rows are
//! the median of three runs, alternating with their tuned counterpart where there is one.
//! `ROCKQ_BENCH_THREADS=1` prints, after each send and pool run, every thread's time on a CPU
//! and waiting for one, and the writer's rounds: which thread bounds the run.

mod common;

use common::handover::{self, Thread};
use common::{fill, raw_write, send_all, stop_after, value};

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rockq::{Durability, Options};

const PRODUCERS: u64 = 64;
const REPS: usize = 3;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("user_style: skipped (run `cargo bench --bench user_style`)");
        return;
    }
    let n: u64 = std::env::var("ROCKQ_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(500_000);
    let n = n / PRODUCERS * PRODUCERS;
    let fsync_n = (n / 5) / PRODUCERS * PRODUCERS;
    // What `#[tokio::main(flavor = "multi_thread", worker_threads = 2)]` builds: the
    // application's main future runs on this thread, not on a worker.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let root = tempfile::Builder::new().prefix("rockq-bench-user").tempdir().unwrap();
    let dir = |name: String| root.path().join(name);
    let only = std::env::var("ROCKQ_BENCH_ONLY").ok();
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);

    let raw1000 = n as f64 / raw_write(&dir("raw-1000".into()), n, 1000, false, false);
    let raw64 = n as f64 / raw_write(&dir("raw-64".into()), n, 64, false, false);
    let raw_sync = fsync_n as f64 / raw_write(&dir("raw-sync-64".into()), fsync_n, 64, true, false);
    println!(
        "raw rocksdb: unsynced batch 1000 {raw1000:.0} msg/s, unsynced batch 64 {raw64:.0} msg/s, fsync batch 64 {raw_sync:.0} msg/s"
    );
    let line = |row: &str, rate: f64, raw: f64, raw_name: &str, tuned: Option<(&str, f64)>| {
        let tuned = tuned.map_or(String::new(), |(name, t)| {
            format!(
                "; tuned ({name}) {t:.0}/s ({:.0}% of raw), user-style = {:.0}% of tuned",
                100.0 * t / raw,
                100.0 * rate / t
            )
        });
        println!("{row}: {rate:.0}/s = {:.0}% of {raw_name}{tuned}", 100.0 * rate / raw);
    };

    let sends = [
        ("send", Durability::Buffered, n, raw1000, "raw unsynced b1000"),
        ("fsync", Durability::Fsync, fsync_n, raw_sync, "raw fsync b64"),
    ];
    for (part, mode, count, raw, raw_name) in sends {
        if !run(part) {
            continue;
        }
        let (mut plain, mut tuned) = (Vec::new(), Vec::new());
        for i in 0..REPS {
            plain.push(rt.block_on(produce(&dir(format!("{part}-{i}")), mode, count, 1)));
            tuned.push(rt.block_on(produce(&dir(format!("{part}-t-{i}")), mode, count, 16)));
        }
        let (p, t) = (count as f64 / median(plain), count as f64 / median(tuned));
        let row = format!("64 tasks each `send().await`, {mode:?}");
        line(&row, p, raw, raw_name, Some(("16 in flight each", t)));
    }
    if run("ceiling") {
        // Alternated, so drift spreads over every row alike.
        let spin = Duration::from_micros(25);
        let variants = [
            ("rockq: 64 tasks each `send().await`, Buffered", None),
            (
                "hand-over alone: 64 tasks each awaiting one thread's reply (tokio mpsc + oneshot), the thread blocks at once",
                Some((Thread::ReplyOnly, Duration::ZERO)),
            ),
            ("hand-over alone, the thread looks for 25 µs before it blocks", Some((Thread::ReplyOnly, spin))),
            (
                "textbook group commit: the same, each group one raw RocksDB WriteBatch, blocks at once",
                Some((Thread::RawBatch, Duration::ZERO)),
            ),
            (
                "textbook group commit, the thread looks for 25 µs before it blocks",
                Some((Thread::RawBatch, spin)),
            ),
        ];
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for i in 0..REPS {
            for (j, (_, v)) in variants.iter().enumerate() {
                let path = dir(format!("ceiling-{j}-{i}"));
                runs[j].push(match v {
                    None => rt.block_on(produce(&path, Durability::Buffered, n, 1)),
                    Some((thread, spin)) => handover::run(&rt, &path, n, PRODUCERS, *thread, *spin),
                });
            }
        }
        for ((row, _), secs) in variants.iter().zip(runs) {
            line(row, n as f64 / median(secs), raw1000, "raw unsynced b1000", None);
        }
    }
    if run("batch") {
        let secs: Vec<f64> = (0..REPS).map(|i| rt.block_on(batches(&dir(format!("batch-{i}")), n))).collect();
        line(
            "8 tasks each `send_batch(100)`, Buffered",
            n as f64 / median(secs),
            raw1000,
            "raw unsynced b1000",
            None,
        );
    }
    if run("e2e") {
        let secs: Vec<f64> =
            (0..REPS).map(|i| rt.block_on(end_to_end(&dir(format!("e2e-{i}")), n))).collect();
        line(
            "64 tasks `send().await` → `group().subscribe()` → `ack()`, Buffered",
            n as f64 / median(secs),
            raw1000,
            "raw unsynced b1000",
            None,
        );
    }
    if run("pool") {
        for workers in [8, 64] {
            let (mut plain, mut tuned) = (Vec::new(), Vec::new());
            for i in 0..REPS {
                plain.push(rt.block_on(pool(&dir(format!("pool-{workers}-{i}")), n, workers, false)));
                tuned.push(rt.block_on(pool(&dir(format!("pool-t-{workers}-{i}")), n, workers, true)));
            }
            let (p, t) = (n as f64 / median(plain), n as f64 / median(tuned));
            line(
                &format!("`workers({workers}).run(handler).await`, no-op handler, {n} backlog, Buffered"),
                p,
                raw1000,
                "raw unsynced b1000",
                Some(("the pool spawned on the runtime", t)),
            );
        }
    }
    if run("outcomes") {
        let mut runs: [Vec<f64>; 3] = Default::default();
        for i in 0..REPS {
            for (v, secs) in
                [Kept::Nothing, Kept::Outcomes, Kept::OutcomesAndProgress].into_iter().zip(&mut runs)
            {
                secs.push(rt.block_on(pool_keeping(&dir(format!("outcomes-{v:?}-{i}")), n, v)));
            }
        }
        let [plain, kept, progress] = runs.map(median);
        let per_job = |secs: f64| (secs - plain) / n as f64 * 1e6;
        for (what, secs) in [
            ("no-op handler, defaults", plain),
            ("`keep_outcomes(1h)`, `set_result` of 16 bytes", kept),
            ("`keep_outcomes(1h)`, `set_result` and one `progress` report", progress),
        ] {
            println!(
                "`workers(8).run(handler).await`, {n} backlog, Buffered, {what}: {:.0} jobs/s ({:+.2} µs/job, {:.0} % of raw unsynced b1000)",
                n as f64 / secs,
                per_job(secs),
                n as f64 / secs / raw1000 * 100.0
            );
        }
    }
    if run("limits") {
        let mut runs: [Vec<f64>; 4] = Default::default();
        let variants = [Limit::None, Limit::Concurrency, Limit::Rate, Limit::RatePrefetched];
        for i in 0..REPS {
            for k in 0..variants.len() {
                let j = (i + k) % variants.len();
                let v = variants[j];
                runs[j].push(rt.block_on(pool_limited(&dir(format!("limits-{v:?}-{i}")), n, v)));
            }
        }
        let [plain, capped, rated, prefetched] = runs.map(median);
        let per_job = |secs: f64| (secs - plain) / n as f64 * 1e6;
        for (what, secs) in [
            ("no limit, defaults", plain),
            ("`concurrency_limit(1024)` (never reached)", capped),
            (
                "`rate_limit(RateLimit::per_second(100_000_000).burst(1_000_000))` (never reached; the pool claims only for idle handlers)",
                rated,
            ),
            ("the same rate limit, `workers(8).prefetch(1024)`", prefetched),
        ] {
            println!(
                "`workers(8).run(handler).await`, {n} backlog, Buffered, {what}: {:.0} jobs/s ({:+.2} µs/job, {:.0} % of the plain drain, {:.0} % of raw unsynced b1000)",
                n as f64 / secs,
                per_job(secs),
                plain / secs * 100.0,
                n as f64 / secs / raw1000 * 100.0
            );
        }
    }
    if run("flows") {
        let mut runs: [Vec<(f64, f64)>; 2] = Default::default();
        for i in 0..REPS {
            for k in 0..2 {
                let j = (i + k) % 2;
                runs[j].push(rt.block_on(pool_flows(&dir(format!("flows-{j}-{i}")), n, j == 1)));
            }
        }
        let jobs = n / FLOW_WIDTH * FLOW_WIDTH;
        let [plain, flows] =
            runs.map(|r| (median(r.iter().map(|r| r.0).collect()), median(r.iter().map(|r| r.1).collect())));
        let children = FLOW_WIDTH - 1;
        for (what, (fill, drain)) in [
            ("plain jobs (`send_batch` of 4,096)", plain),
            (&*format!("flows of {children} jobs and one `then` step (8 tasks submitting)"), flows),
        ] {
            println!(
                "`workers(8).run(handler).await`, {jobs} jobs, Buffered, {what}: drain {:.0} jobs/s ({:+.2} µs/job, {:.0} % of the plain drain, {:.0} % of raw unsynced b1000); submitted at {:.0} jobs/s ({:+.2} µs/job beside `send_batch`)",
                jobs as f64 / drain,
                (drain - plain.1) / jobs as f64 * 1e6,
                plain.1 / drain * 100.0,
                jobs as f64 / drain / raw1000 * 100.0,
                jobs as f64 / fill,
                (fill - plain.0) / jobs as f64 * 1e6,
            );
        }
    }
    if run("priorities") {
        let urgent = 1000;
        let mut runs: [Vec<(f64, Vec<Duration>)>; 3] = Default::default();
        let variants = [Prio::None, Prio::Urgent, Prio::AllPrioritised];
        for i in 0..REPS {
            // Rotated each repetition: a run's place in the sequence biases it (±20 % here).
            for k in 0..variants.len() {
                let j = (i + k) % variants.len();
                let v = variants[j];
                runs[j].push(rt.block_on(pool_priorities(&dir(format!("prio-{v:?}-{i}")), n, urgent, v)));
            }
        }
        let total = n + urgent;
        let plain = median(runs[0].iter().map(|r| r.0).collect());
        for (what, rows) in [
            ("no priorities (the 1,000 sent plain)", &runs[0]),
            ("backlog priority 0, the 1,000 at priority 9", &runs[1]),
            ("backlog priority 1 (all indexed), the 1,000 at priority 9", &runs[2]),
        ] {
            let secs = median(rows.iter().map(|r| r.0).collect());
            let mut lat: Vec<Duration> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
            lat.sort_unstable();
            let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
            let ms = |d: Option<&Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
            println!(
                "`workers(8).run(handler).await`, {n} backlog + {urgent} sent during the drain, Buffered, {what}: {:.0} jobs/s ({:.0} % of the drain without priorities, {:.0} % of raw unsynced b1000); the {urgent}: send → handler p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                total as f64 / secs,
                plain / secs * 100.0,
                total as f64 / secs / raw1000 * 100.0,
                ms(pct(0.5)),
                ms(pct(0.99)),
                ms(lat.last()),
            );
        }
    }
    if run("latency") {
        for mode in [Durability::Buffered, Durability::Fsync] {
            let (p50, p99, max) = rt.block_on(latency(&dir(format!("lat-{mode:?}")), mode, 10_000, 3));
            println!(
                "`send().await` → `subscribe()` at 10k msg/s, {mode:?}: p50 {} µs, p99 {} µs, max {} µs",
                p50.as_micros(),
                p99.as_micros(),
                max.as_micros()
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn open(path: &Path, mode: Durability) -> rockq::Broker {
    Options::new().durability(mode).open(path).await.unwrap()
}

/// 64 plain tasks, each awaiting its sends (`depth` 1) or keeping `depth` in flight (tuned).
async fn produce(path: &Path, mode: Durability, n: u64, depth: usize) -> f64 {
    let broker = open(path, mode).await;
    let q = broker.queue("orders").await.unwrap();
    let per = n / PRODUCERS;
    let writer = broker.writer_stats();
    let threads = common::threads();
    let start = Instant::now();
    let tasks: Vec<_> =
        (0..PRODUCERS).map(|p| tokio::spawn(send_all(q.clone(), p * per, per, depth))).collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(q.last_seq(), n);
    common::print_threads(&threads);
    common::print_rounds(&writer, &broker.writer_stats(), secs);
    broker.shutdown().await.unwrap();
    secs
}

/// 8 tasks, each sending batches of 100.
async fn batches(path: &Path, n: u64) -> f64 {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("orders").await.unwrap();
    let per = n / 8;
    let start = Instant::now();
    let tasks: Vec<_> = (0..8u64)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut i = p * per;
                while i < (p + 1) * per {
                    let k = ((p + 1) * per - i).min(100);
                    q.send_batch((i..i + k).map(value)).await.unwrap();
                    i += k;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(q.last_seq(), n - n % 8);
    broker.shutdown().await.unwrap();
    secs
}

/// 64 producer tasks awaiting each send; the application's own task subscribes and acks each.
async fn end_to_end(path: &Path, n: u64) -> f64 {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("orders").await.unwrap();
    let mut sub = q.group("billing").unwrap().subscribe().await.unwrap();
    let per = n / PRODUCERS;
    let start = Instant::now();
    let tasks: Vec<_> = (0..PRODUCERS).map(|p| tokio::spawn(send_all(q.clone(), p * per, per, 1))).collect();
    let mut seen = 0;
    while seen < n {
        let d = sub.next().await.unwrap().unwrap();
        seen += 1;
        d.ack().unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    drop(sub);
    broker.shutdown().await.unwrap();
    secs
}

/// A pool of `workers` with a no-op handler drains an `n` backlog, timed from the call to the
/// pool's return after the last ack. As a user writes it, `run(..).await` in the application's
/// own task; `spawned`: the tuned benches' way, the pool spawned on the runtime.
async fn pool(path: &Path, n: u64, workers: usize, spawned: bool) -> f64 {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("jobs").await.unwrap();
    fill(&q, n).await;
    let token = rockq::CancellationToken::new();
    let handler = stop_after(n, &token);
    let group = q.work_group("mailer").unwrap();
    let (threads, writer) = (common::threads(), broker.writer_stats());
    let start = Instant::now();
    let report = if spawned {
        tokio::spawn(group.workers(workers).shutdown_on(token).run(handler)).await.unwrap().unwrap()
    } else {
        group.workers(workers).shutdown_on(token).run(handler).await.unwrap()
    };
    let secs = start.elapsed().as_secs_f64();
    common::print_threads(&threads);
    common::print_rounds(&writer, &broker.writer_stats(), secs);
    assert_eq!(report.acked, n);
    broker.shutdown().await.unwrap();
    secs
}

/// Which limit a [`pool_limited`] run sets.
#[derive(Debug, Clone, Copy)]
enum Limit {
    None,
    Concurrency,
    Rate,
    RatePrefetched,
}

/// [`pool`] with 8 workers, as a user writes it, under a limit too high to bind.
async fn pool_limited(path: &Path, n: u64, limit: Limit) -> f64 {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("jobs").await.unwrap();
    fill(&q, n).await;
    let token = rockq::CancellationToken::new();
    let handler = stop_after(n, &token);
    let group = q.work_group("mailer").unwrap();
    let group = match limit {
        Limit::None => group,
        Limit::Concurrency => group.concurrency_limit(1024),
        Limit::Rate | Limit::RatePrefetched => {
            group.rate_limit(rockq::RateLimit::per_second(100_000_000).burst(1_000_000))
        }
    };
    let workers = match limit {
        Limit::RatePrefetched => group.workers(8).prefetch(1024),
        _ => group.workers(8),
    };
    let start = Instant::now();
    let report = workers.shutdown_on(token).run(handler).await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, n);
    broker.shutdown().await.unwrap();
    secs
}

/// What a [`pool_keeping`] run keeps per job.
#[derive(Debug, Clone, Copy)]
enum Kept {
    Nothing,
    Outcomes,
    OutcomesAndProgress,
}

/// [`pool`] with 8 workers, as a user writes it, the group keeping what `kept` says.
async fn pool_keeping(path: &Path, n: u64, kept: Kept) -> f64 {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("jobs").await.unwrap();
    fill(&q, n).await;
    let token = rockq::CancellationToken::new();
    let stop = stop_after(n, &token);
    let mut group = q.work_group("mailer").unwrap();
    if !matches!(kept, Kept::Nothing) {
        group = group.keep_outcomes(Duration::from_secs(3600));
    }
    let handler = move |task: rockq::Task| {
        match kept {
            Kept::Nothing => {}
            Kept::Outcomes => task.set_result(&b"result-of-the-job"[..16]).unwrap(),
            Kept::OutcomesAndProgress => {
                task.progress(&b"half"[..]).unwrap();
                task.set_result(&b"result-of-the-job"[..16]).unwrap();
            }
        }
        stop(task)
    };
    let start = Instant::now();
    let report = group.workers(8).shutdown_on(token).run(handler).await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, n);
    broker.shutdown().await.unwrap();
    secs
}

/// Jobs per flow in the `flows` rows: children and the one `then` step that waits for them all.
const FLOW_WIDTH: u64 = 11;

/// [`pool`] with 8 workers over a backlog of `n` (rounded down to whole flows) jobs: plain, sent
/// with `send_batch`, or as flows of ten children and a `then` step in the same group, submitted
/// by 8 tasks (whose `then` steps the writer sends as the children finish, so part of the
/// backlog appears during the drain). Seconds to fill, and seconds to drain.
async fn pool_flows(path: &Path, n: u64, flows: bool) -> (f64, f64) {
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("mailer").unwrap();
    let count = n / FLOW_WIDTH;
    let jobs = count * FLOW_WIDTH;
    let start = Instant::now();
    if flows {
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let (broker, group) = (broker.clone(), group.clone());
                tokio::spawn(async move {
                    for f in (t..count).step_by(8) {
                        let mut flow = broker.flow();
                        let base = f * FLOW_WIDTH;
                        let steps: Vec<_> =
                            (0..FLOW_WIDTH - 1).map(|c| flow.job(&group, value(base + c)).unwrap()).collect();
                        flow.then(&group, value(base + FLOW_WIDTH - 1), &steps).unwrap();
                        flow.submit().await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    } else {
        let mut sent = 0;
        while sent < jobs {
            let k = (jobs - sent).min(4096);
            q.send_batch((sent..sent + k).map(value)).await.unwrap();
            sent += k;
        }
    }
    let fill = start.elapsed().as_secs_f64();
    let token = rockq::CancellationToken::new();
    let handler = stop_after(jobs, &token);
    let start = Instant::now();
    let report = group.workers(8).shutdown_on(token).run(handler).await.unwrap();
    let drain = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, jobs);
    assert_eq!(q.last_seq(), jobs);
    broker.shutdown().await.unwrap();
    (fill, drain)
}

/// What a [`pool_priorities`] run sends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Prio {
    /// The urgent ones without a priority.
    None,
    /// The urgent ones at 9, the backlog at 0.
    Urgent,
    /// The urgent ones at 9, every backlog message at 1 (each in the index).
    AllPrioritised,
}

/// [`pool`] with 8 workers draining an `n` backlog while a task sends `urgent` more, one every
/// 2 ms, each carrying its send time: seconds for the whole drain, and each urgent job's time
/// from its send to its handler.
async fn pool_priorities(path: &Path, n: u64, urgent: u64, prio: Prio) -> (f64, Vec<Duration>) {
    use std::sync::{Arc, Mutex};
    let broker = open(path, Durability::Buffered).await;
    let q = broker.queue("jobs").await.unwrap();
    let level = if prio == Prio::AllPrioritised { 1 } else { 0 };
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(4096);
        q.send_batch((sent..sent + k).map(|i| rockq::Message::new(value(i)).priority(level))).await.unwrap();
        sent += k;
    }
    let token = rockq::CancellationToken::new();
    let stop = stop_after(n + urgent, &token);
    let base = Instant::now();
    let seen: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let s = seen.clone();
    let handler = move |task: rockq::Task| {
        if task.payload().len() == 8 {
            let at = u64::from_be_bytes(task.payload()[..8].try_into().unwrap());
            s.lock().unwrap().push(base.elapsed() - Duration::from_nanos(at));
        }
        stop(task)
    };
    let producer = {
        let q = q.clone();
        tokio::spawn(async move {
            for _ in 0..urgent {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let at = (base.elapsed().as_nanos() as u64).to_be_bytes().to_vec();
                let p = if prio == Prio::None { 0 } else { 9 };
                q.send(rockq::Message::new(at).priority(p)).await.unwrap();
            }
        })
    };
    let start = Instant::now();
    let report = q.work_group("mailer").unwrap().workers(8).shutdown_on(token).run(handler).await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    producer.await.unwrap();
    assert_eq!(report.acked, n + urgent);
    broker.shutdown().await.unwrap();
    let lat = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(lat.len() as u64, urgent);
    (secs, lat)
}

/// A task sends `rate` messages a second (a 100 µs interval, `send().await` each) for `seconds`;
/// the application's task subscribes. Latency: from the `send` call to the delivery, carried
/// in the payload.
async fn latency(path: &Path, mode: Durability, rate: u64, seconds: u64) -> (Duration, Duration, Duration) {
    let broker = open(path, mode).await;
    let q = broker.queue("events").await.unwrap();
    let mut sub = q.group("audit").unwrap().subscribe().await.unwrap();
    let total = rate * seconds;
    let base = Instant::now();
    let producer = tokio::spawn({
        let q = q.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
            for _ in 0..total {
                tick.tick().await;
                let mut payload = value(0);
                payload[..16].copy_from_slice(&base.elapsed().as_nanos().to_be_bytes());
                q.send(payload).await.unwrap();
            }
        }
    });
    let mut lat = Vec::with_capacity(total as usize);
    while (lat.len() as u64) < total {
        let d = sub.next().await.unwrap().unwrap();
        let sent = u128::from_be_bytes(d.payload()[..16].try_into().unwrap());
        lat.push(Duration::from_nanos((base.elapsed().as_nanos() - sent) as u64));
        d.ack().unwrap();
    }
    producer.await.unwrap();
    drop(sub);
    broker.shutdown().await.unwrap();
    lat.sort_unstable();
    let pick = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    (pick(0.50), pick(0.99), *lat.last().unwrap())
}
