//! The ceiling of "tasks await a dedicated writer thread": 64 tasks each sending a message to
//! one thread and awaiting its reply, built the way a Rust engineer would write group commit
//! from tokio's own parts — an unbounded `mpsc` into the thread, a `oneshot` back per message,
//! the thread taking everything queued at once — with nothing of rockq in it.
//!
//! Why: issue 36 asks awaited sends for 50 % of raw RocksDB's batches of 1000, and the
//! project's standard keeps RocksDB writes off the runtime's workers. With `write` off, this
//! measures what the hand-over alone costs on this runtime and machine: if that alone runs
//! below half of raw RocksDB's rate, no design with a writer thread reaches the target.
//! With `write` on, it is the textbook group commit over raw RocksDB, a second yardstick for
//! rockq's awaited sends.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::value;

/// What the thread does with each group of messages it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thread {
    /// Replies at once: the hand-over alone.
    ReplyOnly,
    /// Writes the group as one raw RocksDB `WriteBatch` (WAL on, unsynced), then replies.
    RawBatch,
}

type Item = (Vec<u8>, oneshot::Sender<u64>);

/// Seconds for `producers` tasks on `rt` to each send and await `n / producers` messages
/// through one thread. `spin` is how long the thread looks for more work before it blocks
/// (rockq's writer looks for 25 µs).
pub fn run(
    rt: &tokio::runtime::Runtime,
    path: &Path,
    n: u64,
    producers: u64,
    thread: Thread,
    spin: Duration,
) -> f64 {
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    let db = (thread == Thread::RawBatch).then(|| {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        rocksdb::DB::open(&o, path).unwrap()
    });
    let writer = std::thread::spawn(move || serve(rx, db, spin));
    let per = n / producers;
    let secs = rt.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = (0..producers)
            .map(|p| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    for i in 0..per {
                        let (reply, done) = oneshot::channel();
                        tx.send((value(p * per + i), reply)).unwrap();
                        done.await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed().as_secs_f64()
    });
    let groups = writer.join().unwrap();
    eprintln!(
        "hand-over {thread:?}, spin {spin:?}: {:.0} msg/s, {groups} groups of {:.1}",
        (per * producers) as f64 / secs,
        (per * producers) as f64 / groups.max(1) as f64
    );
    secs
}

/// The thread: takes what is queued, writes it (or not), replies; returns how many groups.
fn serve(mut rx: mpsc::UnboundedReceiver<Item>, db: Option<rocksdb::DB>, spin: Duration) -> u64 {
    let (mut seq, mut groups) = (0u64, 0u64);
    let mut group: Vec<Item> = Vec::with_capacity(1024);
    while let Some(first) = next(&mut rx, spin) {
        group.push(first);
        while let Ok(m) = rx.try_recv() {
            group.push(m);
        }
        let first_seq = seq + 1;
        if let Some(db) = &db {
            let mut wb = rocksdb::WriteBatch::default();
            for (v, _) in &group {
                seq += 1;
                let mut k = [0u8; 12];
                k[..4].copy_from_slice(&1u32.to_be_bytes());
                k[4..].copy_from_slice(&seq.to_be_bytes());
                wb.put(k, v);
            }
            db.write(wb).unwrap();
        } else {
            seq += group.len() as u64;
        }
        for (i, (_, reply)) in group.drain(..).enumerate() {
            let _ = reply.send(first_seq + i as u64);
        }
        groups += 1;
    }
    groups
}

/// The next message: looked for during `spin` (a `pause` burst then a yield, as rockq's
/// writer does), then waited for.
fn next(rx: &mut mpsc::UnboundedReceiver<Item>, spin: Duration) -> Option<Item> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) if start.elapsed() >= spin => return rx.blocking_recv(),
            Err(mpsc::error::TryRecvError::Empty) => {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
            }
        }
    }
}
