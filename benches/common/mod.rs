//! What the benchmarks share: the payload, the producer loop, and the raw-RocksDB baseline
//! every table prints beside rockq's figures.
#![allow(dead_code)]

pub mod handover;

use std::path::Path;
use std::time::Instant;

/// Bytes of every benchmark payload (its size is what the tables report against).
pub const PAYLOAD: usize = 100;

/// Payload `i`: its number, then filler.
pub fn value(i: u64) -> Vec<u8> {
    let mut v = vec![b'x'; PAYLOAD];
    v[..8].copy_from_slice(&i.to_be_bytes());
    v
}

/// Raw RocksDB: seconds to write `n` keys `<queue u32><seq u64>` with 100-byte values in
/// batches; the median of three runs in fresh databases, because one run on this kind of
/// machine swings by a third. `settle` flushes the page cache to disk before each timed run
/// (so the previous run's writeback does not land on this one).
pub fn raw_write(path: &Path, n: u64, batch: u64, sync: bool, settle: bool) -> f64 {
    let mut runs: Vec<f64> =
        (0..3).map(|i| raw_write_once(&path.join(i.to_string()), n, batch, sync, settle)).collect();
    runs.sort_by(f64::total_cmp);
    let rates: Vec<f64> = runs.iter().map(|s| n as f64 / s).collect();
    eprintln!("raw: {n} messages, batch {batch}, sync {sync}: {rates:.0?} msg/s");
    runs[1]
}

pub fn raw_write_once(path: &Path, n: u64, batch: u64, sync: bool, settle: bool) -> f64 {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    let db = rocksdb::DB::open(&o, path).unwrap();
    let mut wo = rocksdb::WriteOptions::default();
    wo.set_sync(sync);
    if settle {
        sync_disk();
    }
    let start = Instant::now();
    let mut seq = 1u64;
    while seq <= n {
        let mut wb = rocksdb::WriteBatch::default();
        for _ in 0..batch.min(n - seq + 1) {
            let mut k = [0u8; 12];
            k[..4].copy_from_slice(&1u32.to_be_bytes());
            k[4..].copy_from_slice(&seq.to_be_bytes());
            wb.put(k, value(seq));
            seq += 1;
        }
        db.write_opt(wb, &wo).unwrap();
    }
    start.elapsed().as_secs_f64()
}

/// Raw RocksDB with rockq's memtable insert hint (a 4-byte key prefix): seconds to write `n`
/// keys spread round-robin over `queues` queue ids — each batch holds consecutive sequences of
/// every queue, as a writer round does when every producer sends to its own queue. The median
/// of three runs in fresh databases.
pub fn raw_write_spread(path: &Path, n: u64, batch: u64, queues: u32) -> f64 {
    let mut runs: Vec<f64> = (0..3)
        .map(|i| {
            let path = path.join(i.to_string());
            let mut o = rocksdb::Options::default();
            o.create_if_missing(true);
            let mut o = o
                .get_options_from_string("memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.4")
                .unwrap();
            o.create_if_missing(true);
            let db = rocksdb::DB::open(&o, &path).unwrap();
            sync_disk();
            let start = Instant::now();
            let mut i = 0u64;
            while i < n {
                let mut wb = rocksdb::WriteBatch::default();
                for _ in 0..batch.min(n - i) {
                    let q = (i % queues as u64) as u32;
                    let mut k = [0u8; 12];
                    k[..4].copy_from_slice(&q.to_be_bytes());
                    k[4..].copy_from_slice(&(i / queues as u64 + 1).to_be_bytes());
                    wb.put(k, value(i));
                    i += 1;
                }
                db.write(wb).unwrap();
            }
            let secs = start.elapsed().as_secs_f64();
            drop(db);
            let _ = std::fs::remove_dir_all(&path);
            secs
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    eprintln!("raw: {n} messages over {queues} queues, batch {batch}: {:.0} msg/s", n as f64 / runs[1]);
    runs[1]
}

/// Writes dirty pages out (`sync`), so one run's writeback does not slow the next.
pub fn sync_disk() {
    std::process::Command::new("sync").status().unwrap();
}

/// One producer: `count` messages from `first`, awaiting each (`depth` 1) or keeping up to
/// `depth` in flight through `Queue::enqueue` receipts.
pub async fn send_all(q: rockq::Queue, first: u64, count: u64, depth: usize) {
    if depth == 1 {
        for i in 0..count {
            q.send(value(first + i)).await.unwrap();
        }
        return;
    }
    let mut in_flight = std::collections::VecDeque::with_capacity(depth);
    for i in 0..count {
        if in_flight.len() == depth {
            let receipt: rockq::SendReceipt = in_flight.pop_front().unwrap();
            receipt.await.unwrap();
        }
        in_flight.push_back(q.enqueue(value(first + i)).await.unwrap());
    }
    for receipt in in_flight {
        receipt.await.unwrap();
    }
}

/// Appends `n` messages in batches of 4096 (an untimed prefill).
pub async fn fill(q: &rockq::Queue, n: u64) {
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(4096);
        q.send_batch((sent..sent + k).map(value)).await.unwrap();
        sent += k;
    }
}

/// A pool's no-op handler that cancels `token` once it has run `n` times: a drain is timed to
/// the pool's return after that.
pub fn stop_after(
    n: u64,
    token: &rockq::CancellationToken,
) -> impl Fn(rockq::Task) -> std::future::Ready<Result<(), rockq::HandlerError>> + Clone + Send + Sync + 'static
{
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let token = token.clone();
    move |_task: rockq::Task| {
        if done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
            token.cancel();
        }
        std::future::ready(Ok(()))
    }
}

/// Peak resident memory of this process (KiB).
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Per thread of this process: its name and id, and the nanoseconds it ran on a CPU and waited
/// for one (`/proc/self/task/*/schedstat`; empty where that is not available).
pub fn threads() -> Vec<(String, (u64, u64))> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let p = task.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        let v: Vec<u64> = stat.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if let [run, wait, ..] = v[..] {
            out.push((format!("{}/{}", comm.trim(), task.file_name().to_string_lossy()), (run, wait)));
        }
    }
    out
}

/// With `ROCKQ_BENCH_THREADS` set: what each thread that ran more than 10 ms since `before`
/// (from [`threads`]) spent on a CPU and waiting for one — which thread bounds a run.
pub fn print_threads(before: &[(String, (u64, u64))]) {
    if std::env::var_os("ROCKQ_BENCH_THREADS").is_none() {
        return;
    }
    for (name, (run, wait)) in threads() {
        let (run0, wait0) = before.iter().find(|(n, _)| *n == name).map_or((0, 0), |(_, t)| *t);
        if run - run0 > 10_000_000 {
            let s = |ns: u64| ns as f64 / 1e9;
            eprintln!(
                "  thread {name}: on a CPU {:.3} s, waiting for one {:.3} s",
                s(run - run0),
                s(wait - wait0)
            );
        }
    }
}

/// With `ROCKQ_BENCH_THREADS` set: the writer's rounds between two of its counters' readings,
/// their mean size, and the share of `secs` spent inside RocksDB's writes.
pub fn print_rounds(before: &rockq::WriterStats, after: &rockq::WriterStats, secs: f64) {
    if std::env::var_os("ROCKQ_BENCH_THREADS").is_none() {
        return;
    }
    let rounds = after.rounds - before.rounds;
    let messages = after.messages - before.messages;
    let write = after.write_time.saturating_sub(before.write_time).as_secs_f64();
    eprintln!(
        "  writer: {rounds} rounds, {:.1} messages each, {} offset records, {:.3} s in RocksDB writes ({:.0}% of the run)",
        messages as f64 / rounds.max(1) as f64,
        after.offset_commits - before.offset_commits,
        write,
        100.0 * write / secs
    );
}
