//! The tombstone problem at a queue's head (see the RocksDB queue recipe), rockq against a naive
//! baseline in the same run.
//!
//! `cargo bench --bench tombstones` (1M messages; `ROCKQ_TOMBSTONES_N` to change; `-- --quick`
//! for 200k). Fills a queue, consumes and deletes all of it, then measures:
//! (a) how long a new subscriber takes to get the first live message (the head seek),
//! (b) the caught-up poll at the tail (send → delivered),
//! (c) bytes on disk before and after reclamation.
//! The naive baseline point-deletes every key and seeks from `<queue, 0>` without bounds.
//! The last line is rockq's head-seek ratio after N deletes against an empty queue.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rockq::{Broker, Durability, Options, Retention};

const TRIALS: usize = 41;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if !quick && !std::env::args().any(|a| a == "--bench") {
        println!("tombstones: skipped (run `cargo bench --bench tombstones`)");
        return;
    }
    let n: u64 = std::env::var("ROCKQ_TOMBSTONES_N").ok().and_then(|v| v.parse().ok()).unwrap_or(if quick {
        200_000
    } else {
        1_000_000
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let root = tempfile::Builder::new().prefix("rockq-tombstones").tempdir().unwrap();

    let r = rt.block_on(rockq_run(&root.path().join("rockq"), n));
    let naive = naive_run(&root.path().join("naive"), n);
    let (range_del, range_seek) = delete_variant(&root.path().join("range"), n, true);
    let (single_del, single_seek) = delete_variant(&root.path().join("single"), n, false);

    println!();
    println!("{n} messages of 100 B filled, consumed and deleted");
    println!("{:<58} {:>14} {:>14}", "", "rockq", "naive");
    println!(
        "{:<58} {:>14} {:>14}",
        "(a) head: first live message, after N deletes",
        us(r.head_trimmed),
        us(naive.head_seek)
    );
    println!(
        "{:<58} {:>14} {:>14}",
        "(a) head: same on an empty queue",
        us(r.head_empty),
        us(naive.head_seek_empty)
    );
    println!(
        "{:<58} {:>14} {:>14}",
        "(b) tail: caught-up poll, after N deletes",
        us(r.tail_trimmed),
        us(naive.tail_next)
    );
    println!(
        "{:<58} {:>14} {:>14}",
        "(b) tail: same on an empty queue",
        us(r.tail_empty),
        us(naive.tail_next_empty)
    );
    println!(
        "{:<58} {:>14} {:>14}",
        "(c) bytes on disk after consuming, before reclamation", r.bytes_before, naive.bytes_before
    );
    println!("{:<58} {:>14} {:>14}", "(c) bytes on disk after reclamation", r.bytes_after, naive.bytes_after);
    println!();
    println!("deleting the consumed head, raw RocksDB, then a seek bounded to [<q, first live>, <q + 1>):");
    println!(
        "  DeleteRange (rockq's choice): delete {:>12}, bounded head seek {}",
        us(range_del),
        us(range_seek)
    );
    println!(
        "  SingleDelete per key:         delete {:>12}, bounded head seek {}",
        us(single_del),
        us(single_seek)
    );
    println!(
        "note: rockq (a)/(b) go through the public API (subscribe + Stream, send → delivered), so they \
         include the group-creation write and task handoffs; naive (a) is one raw Seek(<q,0>), (b) one raw Next()."
    );
    println!(
        "head seek after {n} deletes vs empty queue: rockq {:.2}x (target <= 2x), naive {:.0}x",
        r.head_trimmed.as_secs_f64() / r.head_empty.as_secs_f64(),
        naive.head_seek.as_secs_f64() / naive.head_seek_empty.as_secs_f64()
    );
}

struct RockqResult {
    head_trimmed: Duration,
    head_empty: Duration,
    tail_trimmed: Duration,
    tail_empty: Duration,
    bytes_before: u64,
    bytes_after: u64,
}

/// Subscribe a brand-new group (earliest) and take the first message: the head seek as a user
/// sees it.
async fn head(q: &rockq::Queue, tag: &str) -> Duration {
    let mut times = Vec::with_capacity(TRIALS);
    for i in 0..TRIALS {
        let t = Instant::now();
        let mut sub = q.group(&format!("{tag}-{i}")).unwrap().subscribe().await.unwrap();
        let d = sub.next().await.unwrap().unwrap();
        times.push(t.elapsed());
        drop(d);
    }
    median(times)
}

/// Send one message to a caught-up subscriber and time until it is delivered.
async fn tail(q: &rockq::Queue, tag: &str) -> Duration {
    let mut sub = q
        .group(&format!("{tag}-tail"))
        .unwrap()
        .start_from(rockq::StartFrom::Latest)
        .subscribe()
        .await
        .unwrap();
    let mut times = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let t = Instant::now();
        q.send("tail").await.unwrap();
        let d = sub.next().await.unwrap().unwrap();
        times.push(t.elapsed());
        d.ack().unwrap();
    }
    median(times)
}

async fn rockq_run(path: &Path, n: u64) -> RockqResult {
    eprintln!("rockq: fill {n}");
    let broker: Broker = Options::new()
        .durability(Durability::Buffered)
        .retention_interval(Duration::ZERO)
        .open(path)
        .await
        .unwrap();
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::Forever).await.unwrap(); // consume first, then trim explicitly
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(4096);
        q.send_batch((0..k).map(|_| vec![7u8; 100])).await.unwrap();
        sent += k;
    }
    eprintln!("rockq: consume {n}");
    let mut sub =
        q.group("consumer").unwrap().read_batch(1024).max_in_flight(4096).subscribe().await.unwrap();
    for _ in 0..n {
        sub.next().await.unwrap().unwrap().ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    eprintln!("rockq: trim");
    q.set_retention(Retention::UntilAcked).await.unwrap();
    let report = broker.trim().await.unwrap();
    assert_eq!(report.deleted, n);
    q.send("live").await.unwrap();
    let empty = broker.queue("empty").await.unwrap();
    empty.send("live").await.unwrap();
    eprintln!("rockq: measure");
    let head_trimmed = head(&q, "fresh").await;
    let head_empty = head(&empty, "fresh").await;
    let tail_trimmed = tail(&q, "t").await;
    let tail_empty = tail(&empty, "t").await;
    broker.shutdown().await.unwrap();
    RockqResult {
        head_trimmed,
        head_empty,
        tail_trimmed,
        tail_empty,
        bytes_before: report.bytes_before,
        bytes_after: report.bytes_after,
    }
}

struct NaiveResult {
    head_seek: Duration,
    head_seek_empty: Duration,
    tail_next: Duration,
    tail_next_empty: Duration,
    bytes_before: u64,
    bytes_after: u64,
}

fn key(q: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&q.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn sst_bytes(db: &rocksdb::DB) -> u64 {
    let p = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
    p("rocksdb.live-sst-files-size") + p("rocksdb.size-all-mem-tables")
}

/// Seek `<q, 0>` with no bounds and return the time to the first key (the recipe's "before").
fn naive_head(db: &rocksdb::DB, q: u32) -> Duration {
    let mut times = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let t = Instant::now();
        let mut it = db.raw_iterator();
        it.seek(key(q, 0));
        assert!(it.valid());
        times.push(t.elapsed());
    }
    median(times)
}

/// Position at the last key, then time the `Next()` that finds nothing more.
fn naive_tail(db: &rocksdb::DB, q: u32, last: u64) -> Duration {
    let mut times = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let mut it = db.raw_iterator();
        it.seek(key(q, last));
        let t = Instant::now();
        it.next();
        times.push(t.elapsed());
        assert!(!it.valid() || it.key().is_some_and(|k| k[..4] != q.to_be_bytes()));
    }
    median(times)
}

fn naive_run(path: &Path, n: u64) -> NaiveResult {
    eprintln!("naive: fill, point-delete {n}");
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    let db = rocksdb::DB::open(&o, path).unwrap();
    fill_raw(&db, n);
    let mut seq = 1;
    while seq <= n {
        let mut wb = rocksdb::WriteBatch::default();
        for s in seq..(seq + 1000).min(n + 1) {
            wb.delete(key(1, s));
        }
        db.write(wb).unwrap();
        seq += 1000;
    }
    db.put(key(1, n + 1), [7u8; 100]).unwrap();
    db.put(key(2, 1), [7u8; 100]).unwrap(); // an "empty" queue with one live message
    let bytes_before = sst_bytes(&db);
    let head_seek = naive_head(&db, 1);
    let head_seek_empty = naive_head(&db, 2);
    let tail_next = naive_tail(&db, 1, n + 1);
    let tail_next_empty = naive_tail(&db, 2, 1);
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
    let bytes_after = sst_bytes(&db);
    NaiveResult { head_seek, head_seek_empty, tail_next, tail_next_empty, bytes_before, bytes_after }
}

/// Fills `n`, deletes them with one `DeleteRange` or `n` `SingleDelete`s, and times the delete
/// and a seek bounded the way rockq bounds its reads.
fn delete_variant(path: &Path, n: u64, range: bool) -> (Duration, Duration) {
    eprintln!("raw: {} of {n}", if range { "DeleteRange" } else { "SingleDelete" });
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    let db = rocksdb::DB::open(&o, path).unwrap();
    fill_raw(&db, n);
    db.put(key(1, n + 1), [7u8; 100]).unwrap();
    let t = Instant::now();
    if range {
        let mut wb = rocksdb::WriteBatch::default();
        wb.delete_range(key(1, 1), key(1, n + 1));
        db.write(wb).unwrap();
    } else {
        let mut seq = 1;
        while seq <= n {
            let mut wb = rocksdb::WriteBatch::default();
            for s in seq..(seq + 1000).min(n + 1) {
                wb.single_delete(key(1, s));
            }
            db.write(wb).unwrap();
            seq += 1000;
        }
    }
    let deleted = t.elapsed();
    let mut times = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_lower_bound(key(1, n + 1).to_vec());
        ro.set_iterate_upper_bound(2u32.to_be_bytes().to_vec());
        let t = Instant::now();
        let mut it = db.raw_iterator_opt(ro);
        it.seek(key(1, n + 1));
        assert!(it.valid());
        times.push(t.elapsed());
    }
    (deleted, median(times))
}

/// Puts messages 1..=n of queue 1 in batches of 1000.
fn fill_raw(db: &rocksdb::DB, n: u64) {
    let mut seq = 1;
    while seq <= n {
        let mut wb = rocksdb::WriteBatch::default();
        for s in seq..(seq + 1000).min(n + 1) {
            wb.put(key(1, s), [7u8; 100]);
        }
        db.write(wb).unwrap();
        seq += 1000;
    }
}
