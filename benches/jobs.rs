//! The job-queue features beside their plain counterparts and a raw-RocksDB baseline, all from
//! the same run:
//!
//! - produce, 64 producers awaiting each send: plain sends vs sends with a unique idempotency
//!   key each (the dedup check and record cost per message);
//! - delayed messages: submitting them, then firing a backlog that fell due at once, beside
//!   plain sends of the same messages;
//! - a pool of 8 draining a backlog: no keys vs 1,000 ordering keys in a group ordered by key;
//! - a pool of 8 whose handler writes one keyspace entry and sends one message per job in its
//!   transaction (`Task::tx`), committed with the ack, vs the plain drain, Buffered and Fsync
//!   (Fsync with a tenth of the messages, beside raw RocksDB writing synced batches of 8).
//!
//! Each rockq row and its plain counterpart run alternately, three times each (this machine
//! drifts by a third between runs); the tables print medians.
//!
//! `cargo bench --bench jobs`; `ROCKQ_BENCH_N` sets the message count (default 200k),
//! `ROCKQ_BENCH_ONLY=produce|delayed|drain|tx` runs one part.

mod common;

use common::{raw_write, value};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rockq::{Durability, Message, Options};

const PRODUCERS: u64 = 64;
const REPS: usize = 3;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("jobs: skipped (run `cargo bench --bench jobs`)");
        return;
    }
    let n: u64 = std::env::var("ROCKQ_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let n = n / PRODUCERS * PRODUCERS;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let root = tempfile::Builder::new().prefix("rockq-bench-jobs").tempdir().unwrap();
    let dir = |name: String| root.path().join(name);

    let only = std::env::var("ROCKQ_BENCH_ONLY").ok();
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let raw64 = n as f64 / raw_write(&dir("raw-64".into()), n, PRODUCERS, false, false);
    let raw1000 = n as f64 / raw_write(&dir("raw-1000".into()), n, 1000, false, false);
    println!("raw rocksdb, unsynced: batch 64 {raw64:.0} msg/s, batch 1000 {raw1000:.0} msg/s");

    // Produce: plain vs unique idempotency keys, alternating.
    if run("produce") {
        let (mut plain, mut keyed) = (Vec::new(), Vec::new());
        for i in 0..REPS {
            plain.push(rt.block_on(produce(&dir(format!("p-plain-{i}")), n, false)));
            keyed.push(rt.block_on(produce(&dir(format!("p-keyed-{i}")), n, true)));
        }
        let (p, k) = (median(plain), median(keyed));
        println!(
            "produce, 64 producers awaiting each, Buffered: plain {:.0} msg/s ({:.0}% of raw b64), unique idempotency keys {:.0} msg/s ({:.0}% of raw b64): +{:.2} µs per message",
            n as f64 / p,
            100.0 * n as f64 / p / raw64,
            n as f64 / k,
            100.0 * n as f64 / k / raw64,
            (k - p) / n as f64 * 1e6
        );
    }

    // Delayed: submit n delayed messages (they pile up in the schedule), then let them fall due
    // at once and time the firing until all are appended; beside plain sends of n messages.
    if run("delayed") {
        let (mut submit, mut fire, mut sends) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..REPS {
            let (s, f) = rt.block_on(delayed(&dir(format!("d-{i}")), n));
            submit.push(s);
            fire.push(f);
            sends.push(rt.block_on(produce(&dir(format!("d-plain-{i}")), n, false)));
        }
        let (s, f, pl) = (median(submit), median(fire), median(sends));
        println!(
            "delayed: submit {:.0} msg/s, firing a due backlog {:.0} msg/s ({:.0}% of raw b1000); plain sends {:.0} msg/s",
            n as f64 / s,
            n as f64 / f,
            100.0 * n as f64 / f / raw1000,
            n as f64 / pl
        );
    }

    // Pool drain: no keys vs 1,000 keys ordered by key, alternating.
    if run("drain") {
        let (mut free, mut keys) = (Vec::new(), Vec::new());
        for i in 0..REPS {
            free.push(rt.block_on(drain(&dir(format!("w-free-{i}")), n, false, Durability::Buffered, false)));
            keys.push(rt.block_on(drain(&dir(format!("w-keys-{i}")), n, true, Durability::Buffered, false)));
        }
        let (a, b) = (median(free), median(keys));
        println!(
            "pool of 8 drains a backlog, Buffered: no keys {:.0} msg/s ({:.0}% of raw b1000), 1,000 keys ordered by key {:.0} msg/s ({:.0}% of raw b1000, {:.0}% of no keys)",
            n as f64 / a,
            100.0 * n as f64 / a / raw1000,
            n as f64 / b,
            100.0 * n as f64 / b / raw1000,
            100.0 * a / b
        );
    }

    // Transactions: ack + 1 keyspace put + 1 send per job, vs the plain drain, alternating.
    if run("tx") {
        for (mode, n) in [(Durability::Buffered, n), (Durability::Fsync, n / 10)] {
            let (mut plain, mut tx) = (Vec::new(), Vec::new());
            for i in 0..REPS {
                plain.push(rt.block_on(drain(&dir(format!("t-plain-{mode:?}-{i}")), n, false, mode, false)));
                tx.push(rt.block_on(drain(&dir(format!("t-tx-{mode:?}-{i}")), n, false, mode, true)));
            }
            let (a, b) = (median(plain), median(tx));
            let (raw, label) = match mode {
                Durability::Fsync => (
                    n as f64 / raw_write(&dir(format!("raw-sync-{i}", i = 8)), n, 8, true, false),
                    "raw synced b8",
                ),
                _ => (raw1000, "raw b1000"),
            };
            println!(
                "pool of 8, {mode:?}, {n} jobs: plain drain {:.0} msg/s ({:.0}% of {label}); ack + put + send in one transaction {:.0} jobs/s ({:.0}% of {label}, {:.0}% of plain): +{:.1} µs per job; {label} {raw:.0} msg/s",
                n as f64 / a,
                100.0 * n as f64 / a / raw,
                n as f64 / b,
                100.0 * n as f64 / b / raw,
                100.0 * a / b,
                (b - a) / n as f64 * 1e6
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn open(path: &Path) -> rockq::Broker {
    open_mode(path, Durability::Buffered).await
}

async fn open_mode(path: &Path, mode: Durability) -> rockq::Broker {
    Options::new().durability(mode).open(path).await.unwrap()
}

/// 64 producers, awaiting each send; with `dedup`, each message carries a unique key.
async fn produce(path: &Path, n: u64, dedup: bool) -> f64 {
    let broker = open(path).await;
    let q = broker.queue("bench").await.unwrap();
    let per = n / PRODUCERS;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            for i in p * per..(p + 1) * per {
                let m = Message::new(value(i));
                if dedup {
                    q.send(m.idempotency_key(format!("op-{i}"))).await.unwrap();
                } else {
                    q.send(m).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(q.last_seq(), n);
    broker.shutdown().await.unwrap();
    secs
}

/// Seconds to submit `n` delayed messages (64 producers, batches of 256), and seconds from
/// their due time until all of them are appended.
async fn delayed(path: &Path, n: u64) -> (f64, f64) {
    let clock = rockq::ManualClock::new();
    let broker =
        Options::new().durability(Durability::Buffered).clock(clock.clone()).open(path).await.unwrap();
    let q = broker.queue("later").await.unwrap();
    let per = n / PRODUCERS;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = p * per;
            while i < (p + 1) * per {
                let k = ((p + 1) * per - i).min(256);
                let batch = (i..i + k).map(|j| Message::new(value(j)).deliver_after(Duration::from_secs(60)));
                q.submit_batch(batch).await.unwrap();
                i += k;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let submit = start.elapsed().as_secs_f64();
    assert_eq!(q.last_seq(), 0);
    let start = Instant::now();
    clock.advance(Duration::from_secs(60));
    let mut watch = q.group("watch").unwrap().subscribe().await.unwrap();
    // Wait for the last one: the ordered group is woken by each round that appends.
    use futures::StreamExt;
    let mut seen = 0;
    while seen < n {
        let d = watch.next().await.unwrap().unwrap();
        seen = d.seq();
        d.ack().unwrap();
    }
    let fire = start.elapsed().as_secs_f64();
    drop(watch);
    broker.shutdown().await.unwrap();
    (submit, fire)
}

/// A pool of 8 (adaptive prefetch) drains `n` prefilled messages; with `keys`, they carry 1,000
/// ordering keys round-robin and the group is ordered by key; with `tx`, each handler puts one
/// entry (1,000 keys round-robin) and sends one message in its job's transaction.
async fn drain(path: &Path, n: u64, keys: bool, mode: Durability, tx: bool) -> f64 {
    let broker = open_mode(path, mode).await;
    let state = broker.kv("state").await.unwrap();
    let out = broker.queue("out").await.unwrap();
    let q = broker.queue("backlog").await.unwrap();
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(4096);
        let batch = (sent..sent + k).map(|i| {
            let m = Message::new(value(i));
            if keys { m.key(format!("account-{}", i % 1000)) } else { m }
        });
        q.send_batch(batch).await.unwrap();
        sent += k;
    }
    let done = Arc::new(AtomicU64::new(0));
    let token = rockq::CancellationToken::new();
    let group = q.work_group("workers").unwrap().ordered_by_key(keys);
    let handler = {
        let (done, token) = (done.clone(), token.clone());
        move |task: rockq::Task| {
            let wrote = if tx {
                let t = task.tx();
                t.put(&state, (task.seq() % 1000).to_be_bytes(), task.payload().clone())
                    .and_then(|()| t.send(&out, task.payload().clone()))
            } else {
                Ok(())
            };
            if done.fetch_add(1, Ordering::Relaxed) + 1 == n {
                token.cancel();
            }
            async move { wrote.map_err(rockq::HandlerError::dead_letter) }
        }
    };
    let start = Instant::now();
    let report = tokio::spawn(group.workers(8).shutdown_on(token).run(handler)).await.unwrap().unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(report.acked, n);
    if tx {
        assert_eq!(broker.get_queue("out").unwrap().len(), n, "every job's send landed");
    }
    broker.shutdown().await.unwrap();
    secs
}
