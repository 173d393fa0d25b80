//! rockq throughput and latency beside a raw RocksDB baseline from the same run.
//!
//! `cargo bench --bench throughput` (1M messages); `-- --quick` for a 100k smoke run.
//! Every figure is printed in one table; ratios compare rockq with raw RocksDB writing
//! WriteBatches of 100-byte values with the same sync setting on the same machine. Raw
//! baselines and the rows with targets, (a) and (c), are each the median of three runs.

mod common;

use common::{peak_rss_kib, raw_write, raw_write_once, send_all, value};

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rockq::{Broker, Durability, Options};

const PRODUCERS: usize = 64;
/// Sends each pipelined producer keeps in flight.
const DEPTH: usize = 16;

struct Row {
    name: String,
    messages: u64,
    secs: f64,
    baseline: Option<(String, f64)>,
    /// The median of per-pair ratios, for rows run interleaved with their baseline.
    paired: Option<f64>,
    note: String,
}

impl Row {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.secs
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo test --all-targets` runs this binary without `--bench`: only check that it builds.
    if !quick && !std::env::args().any(|a| a == "--bench") {
        println!("throughput: skipped (run `cargo bench --bench throughput`)");
        return;
    }
    let n: u64 = std::env::var("ROCKQ_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(if quick {
        100_000
    } else {
        1_000_000
    });
    // Multiples of the producer count, so every producer sends the same number.
    let n = n / PRODUCERS as u64 * PRODUCERS as u64;
    let fsync_n = (n / 5).max(10_000) / PRODUCERS as u64 * PRODUCERS as u64;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // Profiling aids: `ROCKQ_BENCH_ONLY=drain|produce|pipelined|e2e|e2e-pipelined` runs one
    // Buffered benchmark, with the raw unsynced batch-1000 baseline beside it for the others;
    // `latency` runs (d) in both modes.
    if let Ok(only) = std::env::var("ROCKQ_BENCH_ONLY") {
        let root = tempfile::Builder::new().prefix("rockq-bench").tempdir().unwrap();
        let path = root.path().join(&only);
        let secs = match only.as_str() {
            "drain" => rt.block_on(drain(&path, Durability::Buffered, n, true)),
            "produce" | "pipelined" => {
                let depth = if only == "pipelined" { DEPTH } else { 1 };
                let (secs, stats) = rt.block_on(produce(&path, Durability::Buffered, n, PRODUCERS, depth));
                eprintln!(
                    "  writer: {} rounds, mean batch {:.0}, {:.0}% of the time in RocksDB ({:.0} ns/msg)",
                    stats.rounds,
                    stats.messages as f64 / stats.rounds.max(1) as f64,
                    100.0 * stats.write_time.as_secs_f64() / secs,
                    stats.write_time.as_nanos() as f64 / stats.messages.max(1) as f64
                );
                secs
            }
            "e2e" => rt.block_on(end_to_end(&path, Durability::Buffered, n, 1)),
            "e2e-pipelined" => rt.block_on(end_to_end(&path, Durability::Buffered, n, DEPTH)),
            "latency" => {
                for mode in [Durability::Buffered, Durability::Fsync] {
                    let p = root.path().join(format!("latency-{mode:?}"));
                    let (p50, p99, max) = rt.block_on(latency(&p, mode, 10_000, 3));
                    println!(
                        "latency, {mode:?}: p50 {} µs, p99 {} µs, max {} µs",
                        p50.as_micros(),
                        p99.as_micros(),
                        max.as_micros()
                    );
                }
                return;
            }
            other => panic!("ROCKQ_BENCH_ONLY: unknown benchmark {other}"),
        };
        let rate = n as f64 / secs;
        if only == "drain" {
            println!("{only}, Buffered: {rate:.0} msg/s");
        } else {
            let raw = n as f64 / raw_write(&root.path().join("raw"), n, 1000, false, false);
            println!("{only}, Buffered: {rate:.0} msg/s, raw {raw:.0} msg/s, {:.0}%", 100.0 * rate / raw);
        }
        return;
    }
    let root = tempfile::Builder::new().prefix("rockq-bench").tempdir().unwrap();
    let dir = |name: &str| root.path().join(name);
    let mut rows: Vec<Row> = Vec::new();

    // Raw RocksDB baselines.
    let raw_buf_1000 = raw_write(&dir("raw-buf-1000"), n, 1000, false, false);
    let raw_buf_64 = raw_write(&dir("raw-buf-64"), n, PRODUCERS as u64, false, false);
    let raw_sync_1000 = raw_write(&dir("raw-sync-1000"), fsync_n, 1000, true, false);
    let raw_sync_64 = raw_write(&dir("raw-sync-64"), fsync_n, PRODUCERS as u64, true, false);
    let raw_sync_1 = raw_write(&dir("raw-sync-1"), 2_000, 1, true, false);
    for (name, m, secs) in [
        ("raw rocksdb, unsynced, batch 1000", n, raw_buf_1000),
        ("raw rocksdb, unsynced, batch 64", n, raw_buf_64),
        ("raw rocksdb, fsync, batch 1000", fsync_n, raw_sync_1000),
        ("raw rocksdb, fsync, batch 64", fsync_n, raw_sync_64),
        ("raw rocksdb, fsync, batch 1", 2_000, raw_sync_1),
    ] {
        rows.push(Row {
            name: name.into(),
            messages: m,
            secs,
            baseline: None,
            paired: None,
            note: String::new(),
        });
    }
    let rate = |m: u64, s: f64| m as f64 / s;

    // A cross-thread round trip per awaited send with no storage at all: what one handoff per
    // message costs when neither side ever waits for the other's work.
    let secs = common::handover::run(
        &rt,
        &dir("handoff"),
        n,
        PRODUCERS as u64,
        common::handover::Thread::ReplyOnly,
        std::time::Duration::ZERO,
    );
    rows.push(Row {
        name: format!("handoff only, {PRODUCERS} tasks awaiting each"),
        messages: n,
        secs,
        baseline: Some(("raw unsynced b1000".into(), rate(n, raw_buf_1000))),
        paired: None,
        note: "no storage: mpsc to a thread that writes nothing, oneshot back".into(),
    });

    // (a) 64 concurrent producers: each awaiting every send, then each keeping DEPTH sends in
    // flight through `Queue::enqueue` receipts. Each of three repetitions runs the raw
    // baseline(s) and then rockq back to back, so drift of the machine between runs cancels in
    // the ratios.
    for (mode, count) in [(Durability::Buffered, n), (Durability::Fsync, fsync_n)] {
        for depth in [1, DEPTH] {
            let path = dir(&format!("a-{mode:?}-{depth}"));
            let how = if depth == 1 { "awaiting each".to_string() } else { format!("{depth} in flight") };
            let bases = baselines(mode, depth);
            let p = paired(&path, count, &bases, |i| {
                rt.block_on(produce(&path.join(i.to_string()), mode, count, PRODUCERS, depth))
            });
            let note = format!(
                "mean batch {:.0}, writer in RocksDB {:.0}% of the time",
                p.stats.messages as f64 / p.stats.rounds.max(1) as f64,
                100.0 * p.stats.write_time.as_secs_f64() / p.secs
            );
            for (k, (base_name, base, ratio)) in p.bases.into_iter().enumerate() {
                rows.push(Row {
                    name: format!("(a) produce, {PRODUCERS} producers {how}, {mode:?}"),
                    messages: count,
                    secs: p.secs,
                    baseline: Some((base_name, base)),
                    paired: Some(ratio),
                    note: if k == 0 { note.clone() } else { String::new() },
                });
            }
        }
    }

    // (b) one producer awaiting each send, Fsync.
    let single_n = 2_000;
    let (secs, _) = rt.block_on(produce(&dir("b"), Durability::Fsync, single_n, 1, 1));
    rows.push(Row {
        name: "(b) produce, 1 producer awaiting each, Fsync".into(),
        messages: single_n,
        secs,
        baseline: Some(("raw fsync b1".into(), rate(2_000, raw_sync_1))),
        paired: None,
        note: String::new(),
    });

    // (c) end to end, with the producers of (a), interleaved with the baseline as in (a).
    for mode in [Durability::Buffered, Durability::Fsync] {
        for depth in [1, DEPTH] {
            let count = if mode == Durability::Fsync { fsync_n } else { n };
            let path = dir(&format!("c-{mode:?}-{depth}"));
            let bases = baselines(mode, depth);
            let p = paired(&path, count, &bases[..1], |i| {
                (rt.block_on(end_to_end(&path.join(i.to_string()), mode, count, depth)), Default::default())
            });
            let how = if depth == 1 { "awaiting each".to_string() } else { format!("{depth} in flight") };
            for (base_name, base, ratio) in p.bases {
                rows.push(Row {
                    name: format!("(c) produce→subscribe→ack, {how}, {mode:?}"),
                    messages: count,
                    secs: p.secs,
                    baseline: Some((base_name, base)),
                    paired: Some(ratio),
                    note: String::new(),
                });
            }
        }
    }

    // (f) work-queue group: 8 workers drain a prefilled queue, claim + ack per message,
    // beside an ordered group draining the same backlog (the cost of leases).
    for mode in [Durability::Buffered, Durability::Fsync] {
        let count = if mode == Durability::Fsync { fsync_n } else { n };
        let (base_name, base) = if mode == Durability::Fsync {
            ("raw fsync b64", rate(fsync_n, raw_sync_64))
        } else {
            ("raw unsynced b1000", rate(n, raw_buf_1000))
        };
        let ordered = rt.block_on(drain(&dir(&format!("f-ordered-{mode:?}")), mode, count, false));
        let shared = rt.block_on(drain(&dir(&format!("f-shared-{mode:?}")), mode, count, true));
        rows.push(Row {
            name: format!("(f) drain backlog, ordered group, {mode:?}"),
            messages: count,
            secs: ordered,
            baseline: Some((base_name.into(), base)),
            paired: None,
            note: String::new(),
        });
        rows.push(Row {
            name: format!("(f) drain backlog, work group 8 workers, {mode:?}"),
            messages: count,
            secs: shared,
            baseline: Some((base_name.into(), base)),
            paired: None,
            note: format!("{:.0}% of the ordered drain", 100.0 * ordered / shared),
        });
    }

    println!();
    println!(
        "{:<46} {:>9} {:>12} {:>20} {:>7}  note",
        "benchmark", "messages", "msg/s", "baseline msg/s", "ratio"
    );
    for r in &rows {
        let (base, ratio) = match &r.baseline {
            Some((name, b)) => {
                (format!("{b:.0} ({name})"), format!("{:.0}%", 100.0 * r.paired.unwrap_or(r.rate() / b)))
            }
            None => (String::new(), String::new()),
        };
        println!("{:<46} {:>9} {:>12.0} {:>20} {:>7}  {}", r.name, r.messages, r.rate(), base, ratio, r.note);
    }

    // (d) delivery latency at a steady 10k msg/s.
    println!();
    for mode in [Durability::Buffered, Durability::Fsync] {
        let (p50, p99, max) =
            rt.block_on(latency(&dir(&format!("d-{mode:?}")), mode, 10_000, if quick { 1 } else { 3 }));
        println!(
            "(d) send-resolved → delivered at 10k msg/s, {mode:?}: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6
        );
    }
    // (e) peak RSS.
    println!("(e) peak RSS of the whole run: {} MiB", peak_rss_kib() / 1024);
}

/// Raw baselines for a produce row: `(label, batch, sync)`. Buffered rows compare with unsynced
/// batches of 1000; awaiting each under Fsync, a round holds at most one send per producer, so
/// batches of 64 first (and 1000 beside it); Fsync with sends in flight, batches of 1000.
fn baselines(mode: Durability, depth: usize) -> Vec<(&'static str, u64, bool)> {
    match (mode, depth) {
        (Durability::Fsync, 1) => {
            vec![("raw fsync b64", PRODUCERS as u64, true), ("raw fsync b1000", 1000, true)]
        }
        (Durability::Fsync, _) => vec![("raw fsync b1000", 1000, true)],
        _ => vec![("raw unsynced b1000", 1000, false)],
    }
}

/// A rockq benchmark run three times, each run right after one run of each raw baseline.
struct Paired {
    /// The median rockq time.
    secs: f64,
    /// Per baseline: label, median raw rate, median of the per-repetition ratios.
    bases: Vec<(String, f64, f64)>,
    /// Writer stats of the median rockq run.
    stats: rockq::WriterStats,
}

fn paired(
    path: &Path,
    n: u64,
    bases: &[(&str, u64, bool)],
    mut run: impl FnMut(usize) -> (f64, rockq::WriterStats),
) -> Paired {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut raw: Vec<Vec<f64>> = vec![Vec::new(); bases.len()];
    let mut ours: Vec<(f64, rockq::WriterStats)> = Vec::new();
    for i in 0..3 {
        for (k, &(_, batch, sync)) in bases.iter().enumerate() {
            raw[k].push(raw_write_once(&path.join(format!("raw-{k}-{i}")), n, batch, sync, false));
        }
        ours.push(run(i));
    }
    let bases = bases
        .iter()
        .zip(&raw)
        .map(|(&(label, _, _), raw)| {
            let ratios: Vec<f64> = raw.iter().zip(&ours).map(|(r, (o, _))| r / o).collect();
            let rates: Vec<f64> = raw.iter().map(|r| n as f64 / r).collect();
            eprintln!("  paired with {label}: ratios {ratios:.2?}");
            (label.to_string(), median(rates), median(ratios))
        })
        .collect();
    let (secs, stats) = median_of_3(|i| ours[i]);
    Paired { secs, bases, stats }
}

/// The run with the median time of three (each in a fresh database), with what it returned:
/// the rows that carry targets are not judged on one run of a machine that swings by a third.
fn median_of_3<T>(mut run: impl FnMut(usize) -> (f64, T)) -> (f64, T) {
    let mut runs: Vec<(f64, T)> = (0..3).map(&mut run).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs.swap_remove(1)
}

async fn open(path: &Path, mode: Durability) -> Broker {
    Options::new().durability(mode).open(path).await.unwrap()
}

/// `producers` tasks send `n` messages between them. With `depth` 1 each awaits every send;
/// with more, each keeps up to `depth` sends in flight through `Queue::enqueue` receipts.
async fn produce(
    path: &Path,
    mode: Durability,
    n: u64,
    producers: usize,
    depth: usize,
) -> (f64, rockq::WriterStats) {
    eprintln!("produce: {n} messages, {producers} producers, {depth} in flight each, {mode:?}");
    let broker = open(path, mode).await;
    let q = broker.queue("bench").await.unwrap();
    let start = Instant::now();
    let per = n / producers as u64;
    let mut tasks = Vec::new();
    for p in 0..producers as u64 {
        let q = q.clone();
        tasks.push(tokio::spawn(send_all(q.clone(), p * per, per, depth)));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = broker.writer_stats();
    broker.shutdown().await.unwrap();
    (secs, stats)
}

async fn end_to_end(path: &Path, mode: Durability, n: u64, depth: usize) -> f64 {
    eprintln!("end to end: {n} messages, {depth} in flight per producer, {mode:?}");
    let broker = open(path, mode).await;
    let q = broker.queue("bench").await.unwrap();
    let mut sub =
        q.group("consumers").unwrap().read_batch(1024).max_in_flight(4096).subscribe().await.unwrap();
    let start = Instant::now();
    let consumer = tokio::spawn(async move {
        let mut got = 0u64;
        while got < n {
            let d = sub.next().await.unwrap().unwrap();
            d.ack().unwrap();
            got += 1;
        }
        sub.commit().await.unwrap()
    });
    let per = n / PRODUCERS as u64;
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS as u64 {
        tasks.push(tokio::spawn(send_all(q.clone(), p * per, per, depth)));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let committed = consumer.await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(committed, n);
    broker.shutdown().await.unwrap();
    secs
}

/// Prefills `n` messages (untimed), then times draining them: an ordered subscription acking
/// each, or a worker pool of 8 whose handler succeeds (one claim and one ack per message).
async fn drain(path: &Path, mode: Durability, n: u64, shared: bool) -> f64 {
    eprintln!("drain: {n} messages, {} group, {mode:?}", if shared { "work" } else { "ordered" });
    let broker = open(path, mode).await;
    let q = broker.queue("backlog").await.unwrap();
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(4096);
        q.send_batch((0..k).map(|i| value(sent + i))).await.unwrap();
        sent += k;
    }
    let start = Instant::now();
    if shared {
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let token = rockq::CancellationToken::new();
        let group = q.work_group("workers").unwrap();
        let handler = {
            let (done, token) = (done.clone(), token.clone());
            move |_task: rockq::Task| {
                let (done, token) = (done.clone(), token.clone());
                async move {
                    if done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
                        token.cancel();
                    }
                    Ok(())
                }
            }
        };
        // Spawned, as an application would run a pool: on a runtime worker, not in block_on.
        // Prefetch 64 (the default until issue 13 made it `concurrency`): the row measures
        // claiming in batches of 64, as before.
        let pool = group.workers(8).prefetch(64).shutdown_on(token);
        let report = tokio::spawn(pool.run(handler)).await.unwrap().unwrap();
        assert_eq!(report.acked, n);
        assert_eq!(group.committed(), Some(n));
    } else {
        let mut sub =
            q.group("ordered").unwrap().read_batch(1024).max_in_flight(4096).subscribe().await.unwrap();
        for _ in 0..n {
            sub.next().await.unwrap().unwrap().ack().unwrap();
        }
        assert_eq!(sub.commit().await.unwrap(), n);
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = broker.writer_stats();
    eprintln!(
        "  writer: {} rounds, {:.0}% of the time in RocksDB",
        stats.rounds,
        100.0 * stats.write_time.as_secs_f64() / secs
    );
    broker.shutdown().await.unwrap();
    secs
}

async fn latency(path: &Path, mode: Durability, rate: u64, seconds: u64) -> (Duration, Duration, Duration) {
    eprintln!("latency: {rate} msg/s for {seconds} s, {mode:?}");
    let broker = open(path, mode).await;
    let q = broker.queue("lat").await.unwrap();
    let total = rate * seconds;
    let resolved: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; total as usize + 2]));
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let consumer = tokio::spawn(async move {
        let mut received = Vec::with_capacity(total as usize);
        while (received.len() as u64) < total {
            let d = sub.next().await.unwrap().unwrap();
            received.push((d.seq(), Instant::now()));
            d.ack().unwrap();
        }
        received
    });
    // 10 sends every millisecond, each on its own task so Fsync rounds can overlap.
    let per_tick = rate / 1000;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sends = Vec::with_capacity(total as usize);
    for _ in 0..total / per_tick {
        tick.tick().await;
        for _ in 0..per_tick {
            let q = q.clone();
            let resolved = resolved.clone();
            sends.push(tokio::spawn(async move {
                let seq = q.send(value(0)).await.unwrap();
                let now = Instant::now();
                resolved.lock().unwrap()[seq as usize] = Some(now);
            }));
        }
    }
    for s in sends {
        s.await.unwrap();
    }
    let received = consumer.await.unwrap();
    let mut lat: Vec<Duration> = {
        let resolved = resolved.lock().unwrap();
        received
            .iter()
            .map(|(seq, at)| at.saturating_duration_since(resolved[*seq as usize].unwrap()))
            .collect()
    };
    lat.sort_unstable();
    broker.shutdown().await.unwrap();
    let pick = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    (pick(0.50), pick(0.99), *lat.last().unwrap())
}
