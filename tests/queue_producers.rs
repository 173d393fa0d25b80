//! Many concurrent producers: unique, dense sequences; exactly-once consumption in a clean run.

mod common;

use std::collections::HashSet;

use common::*;
use rockq::ManualClock;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_get_unique_dense_sequences_and_each_message_is_consumed_once() {
    const PRODUCERS: usize = 8;
    const PER_PRODUCER: usize = 400;
    let dir = tempdir();
    let broker = open_with(dir.path(), rockq::Durability::Fsync).await;
    let q = broker.queue("work").await.unwrap();

    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..PER_PRODUCER {
                // Mix single sends and small atomic batches.
                if i % 4 == 0 {
                    let r = q.send_batch([format!("{p}-{i}-a"), format!("{p}-{i}-b")]).await.unwrap();
                    seqs.extend(r);
                } else {
                    seqs.push(q.send(format!("{p}-{i}")).await.unwrap());
                }
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let seqs = t.await.unwrap();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "one producer's sequences increase");
        all.extend(seqs);
    }
    let total = all.len();
    all.sort_unstable();
    assert_eq!(all, (1..=total as u64).collect::<Vec<_>>(), "unique and dense");
    assert!(broker.writer_stats().rounds < total as u64, "group commit shared rounds");

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let mut seen = HashSet::new();
    for expected in 1..=total as u64 {
        let d = next(&mut sub).await;
        assert_eq!(d.seq(), expected);
        assert!(seen.insert(d.payload().clone()), "payload delivered twice");
        d.ack().unwrap();
    }
    assert_next_is_sentinel(&q, &mut sub).await;
    assert_eq!(seen.len(), total);
    broker.shutdown().await.unwrap();
}

/// Rounds are completed in write order whichever thread completes them (the writer itself, or
/// the completer task while requests wait): a queue's published tail never goes back, and a
/// resolved send is already in it. Flushes keep requests in the writer's channel, so both ways
/// are taken while the sends run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_complete_in_write_order_while_requests_and_sends_mix() {
    let (producers, per) = if against_etcd() { (4u64, 25u64) } else { (16, 1_000) };
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mixed").await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (q, stop) = (q.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = q.last_seq();
                assert!(now >= last, "the published tail went back from {last} to {now}");
                last = now;
                tokio::task::yield_now().await;
            }
        })
    };
    let flusher = {
        let (broker, stop) = (broker.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                broker.flush().await.unwrap();
            }
        })
    };
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    let seq = q.send(format!("{p}-{i}")).await.unwrap();
                    assert!(q.last_seq() >= seq, "send {seq} resolved before its round was published");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.await.unwrap();
    flusher.await.unwrap();
    assert_eq!(q.last_seq(), producers * per);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_contiguous_even_with_concurrent_single_sends() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mixed").await.unwrap();
    let noise = {
        let q = q.clone();
        tokio::spawn(async move {
            for i in 0..500 {
                q.send(format!("noise-{i}")).await.unwrap();
            }
        })
    };
    let mut ranges = Vec::new();
    for b in 0..20 {
        let r = q.send_batch((0..25).map(|i| format!("b{b}-{i}"))).await.unwrap();
        ranges.push((b, r));
    }
    noise.await.unwrap();
    let mut sub = q.group("g").unwrap().read_batch(64).subscribe().await.unwrap();
    let all = take(&mut sub, 1000).await;
    for (b, r) in ranges {
        let got: Vec<String> = payloads(&all[(*r.start() - 1) as usize..*r.end() as usize]);
        let want: Vec<String> = (0..25).map(|i| format!("b{b}-{i}")).collect();
        assert_eq!(got, want, "batch {b} is contiguous and in order");
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_messages_keep_the_order_of_the_enqueue_calls() {
    const N: usize = 600;
    const DEPTH: usize = 16;
    let dir = tempdir();
    let broker = open_with(dir.path(), rockq::Durability::Fsync).await;
    let q = broker.queue("pipelined").await.unwrap();
    // Another producer interleaves its sends with the pipelined ones.
    let noise = {
        let q = q.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                q.send(format!("noise-{i}")).await.unwrap();
            }
        })
    };
    let mut in_flight = std::collections::VecDeque::new();
    let mut seqs = Vec::new();
    for i in 0..N {
        if in_flight.len() == DEPTH {
            let receipt: rockq::SendReceipt = in_flight.pop_front().unwrap();
            seqs.push(receipt.await.unwrap());
        }
        in_flight.push_back(q.enqueue(format!("p-{i}")).await.unwrap());
    }
    // A dropped receipt does not withdraw its message.
    drop(q.enqueue("dropped-receipt").await.unwrap());
    for receipt in in_flight {
        seqs.push(receipt.await.unwrap());
    }
    let last = q.send("last").await.unwrap();
    noise.await.unwrap();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "sequences follow the order of the enqueue calls");

    let mut sub = q.group("g").unwrap().read_batch(128).subscribe().await.unwrap();
    let all = take(&mut sub, last as usize).await;
    let mine: Vec<String> = payloads(&all).into_iter().filter(|p| !p.starts_with("noise-")).collect();
    let want: Vec<String> =
        (0..N).map(|i| format!("p-{i}")).chain(["dropped-receipt".into(), "last".into()]).collect();
    assert_eq!(mine, want);
    for (i, seq) in seqs.iter().enumerate() {
        assert_eq!(all[(*seq - 1) as usize].payload().as_ref(), format!("p-{i}").as_bytes());
    }
    broker.shutdown().await.unwrap();
}

#[test]
fn sends_resolve_from_another_runtime_and_after_the_brokers_runtime_is_gone() {
    let dir = tempdir();
    let home = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (broker, q) = home.block_on(async {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        (broker, q)
    });
    let other = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Completed by the task on the broker's runtime, waking a task of this one.
    assert_eq!(other.block_on(q.send("from another runtime")).unwrap(), 1);
    assert_eq!(other.block_on(async { q.enqueue("enqueued").await.unwrap().await }).unwrap(), 2);
    // With the broker's runtime gone, the writer completes its own commits.
    drop(home);
    assert_eq!(other.block_on(q.send("after")).unwrap(), 3);
    drop((broker, q));
    // The last handle is gone: the writer thread closes RocksDB on its own. Wait until it has
    // (the directory is locked until then) before the test returns, so that the process does
    // not exit while RocksDB is still closing (a crash in RocksDB's static teardown).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let reopened = loop {
        match other.block_on(rockq::Broker::open(dir.path())) {
            Err(rockq::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::yield_now()
            }
            res => break res.expect("reopens once the dropped broker has closed"),
        }
    };
    let q = other.block_on(reopened.queue("q")).unwrap();
    assert_eq!(q.last_seq(), 3, "everything sent before the drop was written");
    other.block_on(reopened.shutdown()).unwrap();
}

/// Truncated to the microseconds an envelope stores.
fn micros(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()
}

/// The writer stamps each group commit with the broker's clock: a message's enqueue time is the
/// clock at its commit, and along one queue the times never decrease, however producers race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_times_follow_the_brokers_clock_and_never_decrease_along_a_queue() {
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = rockq::Options::new()
        .clock(clock.clone())
        .retention_interval(std::time::Duration::ZERO)
        .open(dir.path())
        .await
        .unwrap();
    let q = broker.queue("t").await.unwrap();
    let t0 = clock.wall_time();
    q.send("a").await.unwrap();
    clock.advance(std::time::Duration::from_secs(5));
    q.send("b").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let got = take(&mut sub, 2).await;
    assert_eq!(micros(got[0].enqueued_at()), micros(t0));
    assert_eq!(micros(got[1].enqueued_at()), micros(t0) + 5_000_000);
    broker.shutdown().await.unwrap();

    // Real clock, sixteen racing producers: a time read by one producer before another's must
    // not end up behind it in sequence order. (Stamping at the producer, as rockq once did,
    // fails this in nearly every run.)
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("t").await.unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                for i in 0..500 {
                    q.send(format!("{p}-{i}")).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let mut times = Vec::with_capacity(8000);
    for _ in 0..8000 {
        let d = next(&mut sub).await;
        times.push((d.seq(), micros(d.enqueued_at())));
        d.ack().unwrap();
    }
    if let Some(w) = times.windows(2).find(|w| w[1].1 < w[0].1) {
        panic!("enqueue time went back at seq {}: {} then {}", w[1].0, w[0].1, w[1].1);
    }
    broker.shutdown().await.unwrap();
}

// Issue 13 (enqueue stamps across a restart): enqueue stamps restarted from the wall clock at open, so a clock stepped back
// between a shutdown and a reopen made `enqueued_at` go backwards along a queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_times_never_go_back_across_a_restart() {
    let dir = tempdir();
    let ahead = ManualClock::new();
    ahead.advance(Duration::from_secs(3600));
    let broker = open_clock(dir.path(), &ahead).await;
    let q = broker.queue("q").await.unwrap();
    q.send("before").await.unwrap();
    broker.shutdown().await.unwrap();

    // The clock is now an hour behind the last stamp.
    let behind = ManualClock::new();
    let broker = open_clock(dir.path(), &behind).await;
    let q = broker.queue("q").await.unwrap();
    q.send("after").await.unwrap();
    let msgs = broker.peek("q", None, 10).await.unwrap();
    assert_eq!(msgs.len(), 2);
    assert!(
        msgs[1].enqueued_at >= msgs[0].enqueued_at,
        "{:?} < {:?}",
        msgs[1].enqueued_at,
        msgs[0].enqueued_at
    );
    broker.shutdown().await.unwrap();
}
