//! Per-key ordering in work-queue groups: 1,000 keys × 100 messages (50 × 20 against etcd) through a pool of 16 with
//! random failures (retried). For every key, handlers run strictly one at a time and start in
//! sequence order; every message of every key finishes (no key starves); and a crash half-way
//! (the pool aborted, the broker dropped without a shutdown) keeps it: after the restart the
//! restored claims are re-keyed before anything is claimed. In both durability modes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rockq::{HandlerError, Message, RetryPolicy, Task};
use tokio_util::sync::CancellationToken;

/// Keys, and messages per key: 1,000 × 100 on RocksDB; 50 × 20 against etcd
/// (`scripts/etcd-semantics.sh`), where a debug build drains a few hundred jobs a second.
fn keys() -> usize {
    if against_etcd() { 50 } else { 1000 }
}

fn per_key() -> usize {
    if against_etcd() { 20 } else { 100 }
}

#[derive(Default)]
struct Key {
    running: bool,
    /// Index (within the key) of the last handler started.
    last_started: Option<usize>,
    /// Indexes finished successfully.
    done: Vec<bool>,
}

struct Tracker {
    keys: Vec<Mutex<Key>>,
    finished: AtomicUsize,
    violations: Mutex<Vec<String>>,
    stop_at: usize,
    stop: CancellationToken,
}

impl Tracker {
    fn new(stop_at: usize) -> Arc<Self> {
        Arc::new(Tracker {
            keys: (0..keys())
                .map(|_| Mutex::new(Key { done: vec![false; per_key()], ..Key::default() }))
                .collect(),
            finished: AtomicUsize::new(0),
            violations: Mutex::new(Vec::new()),
            stop_at,
            stop: CancellationToken::new(),
        })
    }

    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    /// A new phase after a crash: nothing runs any more, and starts may begin again from
    /// whatever was not durably finished.
    fn restart(&self, stop_at: usize) -> Arc<Self> {
        let fresh = Tracker::new(stop_at);
        for (old, new) in self.keys.iter().zip(&fresh.keys) {
            new.lock().unwrap().done = old.lock().unwrap().done.clone();
        }
        fresh.finished.store(self.finished.load(Ordering::SeqCst), Ordering::SeqCst);
        fresh
    }
}

async fn handle(t: Arc<Tracker>, task: Task) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(task.payload()).unwrap().to_owned();
    let (k, n) = text.split_once(':').unwrap();
    let (k, n): (usize, usize) = (k.parse().unwrap(), n.parse().unwrap());
    assert_eq!(task.key(), Some(format!("key-{k}").as_str()));
    {
        let mut key = t.keys[k].lock().unwrap();
        if key.running {
            t.violation(format!("key {k}: message {n} started while another ran"));
        }
        if key.last_started.is_some_and(|last| n < last) {
            t.violation(format!("key {k}: message {n} started after {:?}", key.last_started));
        }
        key.running = true;
        key.last_started = Some(n);
    }
    // Give another worker every chance to overlap.
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    // One first attempt in eight fails and is retried.
    let fail = task.attempt() == 1 && (task.seq().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) == 0;
    let mut key = t.keys[k].lock().unwrap();
    key.running = false;
    if fail {
        return Err(HandlerError::retry_after("random failure", Duration::from_millis(1)));
    }
    // Every earlier message of the key finished before this one started.
    if let Some(missing) = key.done[..n].iter().position(|d| !d) {
        t.violation(format!("key {k}: message {n} finished before message {missing}"));
    }
    if !std::mem::replace(&mut key.done[n], true)
        && t.finished.fetch_add(1, Ordering::SeqCst) + 1 >= t.stop_at
    {
        t.stop.cancel();
    }
    Ok(())
}

/// Every key's messages in order, laid out in runs of 1 to 12 messages of one key, the runs of
/// different keys shuffled (a fixed seed): neighbours in the queue often share a key, so a pool
/// of 16 would run one key's messages side by side if nothing held them back.
fn workload() -> Vec<(usize, usize)> {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut sent = vec![0usize; keys()];
    let mut open: Vec<usize> = (0..keys()).collect();
    let mut out = Vec::with_capacity(keys() * per_key());
    while !open.is_empty() {
        let at = (next() % open.len() as u64) as usize;
        let k = open[at];
        let run = (1 + next() % 12) as usize;
        for _ in 0..run.min(per_key() - sent[k]) {
            out.push((k, sent[k]));
            sent[k] += 1;
        }
        if sent[k] == per_key() {
            open.swap_remove(at);
        }
    }
    out
}

async fn run_pool(q: &rockq::Queue, t: Arc<Tracker>) -> rockq::PoolHandle {
    let group = q
        .work_group("ledger")
        .unwrap()
        .ordered_by_key(true)
        .retry_policy(RetryPolicy::default().max_attempts(100));
    let token = t.stop.clone();
    group.workers(16).shutdown_on(token).spawn(move |task: Task| handle(t.clone(), task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_keys_run_one_at_a_time_in_order_through_a_pool_of_16_and_a_crash() {
    for mode in [rockq::Durability::Buffered, rockq::Durability::Fsync] {
        thousand_keys(mode).await;
    }
}

async fn thousand_keys(mode: rockq::Durability) {
    let dir = tempdir();
    let total = keys() * per_key();
    let tracker = {
        let broker = open_with(dir.path(), mode).await;
        let q = broker.queue("accounts").await.unwrap();
        for chunk in workload().chunks(1000) {
            let batch = chunk.iter().map(|&(k, n)| Message::new(format!("{k}:{n}")).key(format!("key-{k}")));
            q.send_batch(batch).await.unwrap();
        }
        // Half-way, crash: the pool is aborted mid-flight and the broker dropped unshut.
        let tracker = Tracker::new(total / 2);
        let pool = run_pool(&q, tracker.clone()).await;
        tokio::time::timeout(HANG_GUARD, tracker.stop.cancelled()).await.expect("phase 1 hung");
        pool.abort();
        drop(q);
        drop(broker);
        tracker
    };
    {
        let v = tracker.violations.lock().unwrap();
        assert!(v.is_empty(), "{} violations before the crash, first: {:?}", v.len(), &v[..v.len().min(5)]);
    }

    // Reopened first: once the old writer has closed the database, every ack it made durable
    // was preceded by its handler marking the message done, so the copy below sees all of them
    // (an aborted handler may still finish on another thread after `abort`).
    let broker = reopen_after_drop_mode(dir.path(), mode).await;
    let tracker = tracker.restart(total);
    let q = broker.queue("accounts").await.unwrap();
    let pool = run_pool(&q, tracker.clone()).await;
    if tokio::time::timeout(HANG_GUARD * 5, tracker.stop.cancelled()).await.is_err() {
        // Say where it stalled before failing.
        let stats = broker.stats().await.unwrap();
        let pending = broker.pending("accounts", "ledger").await.unwrap();
        let stuck: Vec<_> = tracker
            .keys
            .iter()
            .enumerate()
            .filter_map(|(k, key)| key.lock().unwrap().done.iter().position(|d| !d).map(|n| (k, n)))
            .take(10)
            .collect();
        panic!(
            "phase 2 hung: finished {} of {total}; group {:?}; {} pending, first {:?}; stuck keys (key, first unfinished) {stuck:?}",
            tracker.finished.load(Ordering::SeqCst),
            stats.groups.iter().find(|g| g.group == "ledger"),
            pending.len(),
            pending.first(),
        );
    }
    pool.shutdown().await.unwrap();
    {
        let v = tracker.violations.lock().unwrap();
        assert!(v.is_empty(), "{} violations after the restart, first: {:?}", v.len(), &v[..v.len().min(5)]);
    }
    for (k, key) in tracker.keys.iter().enumerate() {
        assert!(key.lock().unwrap().done.iter().all(|d| *d), "key {k} did not finish");
    }
    broker.shutdown().await.unwrap();
}

/// Without `ordered_by_key` one key's messages do run side by side: the tracker above sees the
/// overlaps, so its checks are not vacuous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ordering_by_key_the_same_key_does_overlap() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("accounts").await.unwrap();
    q.send_batch((0..2000).map(|n| Message::new(format!("0:{n}")).key("key-0"))).await.unwrap();
    let t = Arc::new(Tracker {
        keys: vec![Mutex::new(Key { done: vec![false; 2000], ..Key::default() })],
        finished: AtomicUsize::new(0),
        violations: Mutex::new(Vec::new()),
        stop_at: 2000,
        stop: CancellationToken::new(),
    });
    let group = q.work_group("plain").unwrap().retry_policy(RetryPolicy::default().max_attempts(100));
    let (h, token) = (t.clone(), t.stop.clone());
    let pool = group.workers(16).shutdown_on(token).spawn(move |task: Task| handle(h.clone(), task));
    tokio::time::timeout(HANG_GUARD, t.stop.cancelled()).await.expect("hung");
    pool.shutdown().await.unwrap();
    assert!(!t.violations.lock().unwrap().is_empty(), "16 workers on one key never overlapped");
    broker.shutdown().await.unwrap();
}
