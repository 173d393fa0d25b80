//! The etcd engine against a real single-member etcd (feature `etcd`; `scripts/etcd-tests.sh`
//! installs `etcd-server`): the same `Broker` API, its semantics as on RocksDB, several brokers
//! sharing one namespace, and typed refusals of what the engine does not carry out yet. Each
//! test starts its own etcd on loopback ports chosen at run time and stops it by its pid.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Delivery, Error, EtcdOptions, Message, Subscription};

use common::HANG_GUARD;

async fn connect(cluster: &etcd::Cluster, ns: &str) -> Broker {
    Broker::connect_etcd(cluster.endpoints(), ns, EtcdOptions::new().owner_ttl(Duration::from_secs(2)))
        .await
        .expect("connect to etcd")
}

async fn next(sub: &mut Subscription) -> Delivery {
    tokio::time::timeout(HANG_GUARD, sub.next())
        .await
        .expect("a delivery within the hang guard")
        .expect("the stream ended")
        .expect("a delivery, not an error")
}

/// Subscribes, retrying while another broker's subscription still holds the group (its
/// release is asynchronous: it commits first, then revokes its lease).
async fn subscribe_when_free(group: &rockq::Group) -> Subscription {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        match group.subscribe().await {
            Ok(s) => return s,
            Err(Error::Active { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("subscribe: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_are_delivered_in_order_and_a_new_broker_resumes_after_the_committed_offset() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "orders").await;
    let q = broker.queue("q").await.unwrap();
    for i in 0..10 {
        assert_eq!(q.send(format!("m{i}")).await.unwrap(), i + 1);
    }
    let range = q.send_batch((10..30).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    assert_eq!(range, 11..=30);
    assert_eq!(q.last_seq(), 30);

    let group = q.group("g").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let mut unacked = Vec::new();
    for i in 0..30u64 {
        let d = next(&mut sub).await;
        assert_eq!(d.seq(), i + 1);
        assert_eq!(d.payload().as_ref(), format!("m{i}").as_bytes());
        if i < 15 {
            d.ack().unwrap();
        } else {
            unacked.push(d);
        }
    }
    broker.flush().await.unwrap();
    assert_eq!(group.committed(), Some(15));
    drop((sub, unacked));
    broker.shutdown().await.unwrap();

    // Another broker (as another process would) starts after what was acknowledged.
    let again = connect(&cluster, "orders").await;
    let q = again.queue("q").await.unwrap();
    assert_eq!(q.last_seq(), 30);
    let mut sub = subscribe_when_free(&q.group("g").unwrap()).await;
    assert_eq!(next(&mut sub).await.seq(), 16);
    again.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_sharing_a_namespace_get_dense_unique_sequences_and_every_message_once() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "shared").await;
    let b = connect(&cluster, "shared").await;
    let mut tasks = Vec::new();
    for (who, broker) in [("a", &a), ("b", &b)] {
        for t in 0..4 {
            let q = broker.queue("jobs").await.unwrap();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..100 {
                    seqs.push((q.send(format!("{who}-{t}-{i}")).await.unwrap(), format!("{who}-{t}-{i}")));
                }
                seqs
            }));
        }
    }
    let mut sent = Vec::new();
    for t in tasks {
        sent.extend(t.await.unwrap());
    }
    let seqs: BTreeSet<u64> = sent.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs.len(), 800, "a sequence was handed out twice");
    assert_eq!(
        seqs.iter().copied().collect::<Vec<_>>(),
        (1..=800).collect::<Vec<_>>(),
        "holes in the sequence"
    );

    // One subscriber reads each message once, at the sequence its send returned.
    let q = b.queue("jobs").await.unwrap();
    let mut sub = q.group("reader").unwrap().subscribe().await.unwrap();
    let mut by_seq = std::collections::HashMap::new();
    for _ in 0..800 {
        let d = next(&mut sub).await;
        by_seq.insert(d.seq(), String::from_utf8(d.payload().to_vec()).unwrap());
        d.ack().unwrap();
    }
    for (seq, payload) in &sent {
        assert_eq!(by_seq.get(seq), Some(payload), "message {seq} is not what its send wrote");
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_wakes_on_another_brokers_send_without_polling() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "wake").await;
    let b = connect(&cluster, "wake").await;
    let qb = b.queue("q").await.unwrap();
    let mut sub = qb.group("g").unwrap().subscribe().await.unwrap();
    let waiting = tokio::spawn(async move {
        let d = next(&mut sub).await;
        (d.seq(), d.payload().clone())
    });
    let qa = a.queue("q").await.unwrap();
    assert_eq!(qa.send("from a").await.unwrap(), 1);
    let (seq, payload) = waiting.await.unwrap();
    assert_eq!((seq, payload.as_ref()), (1, b"from a".as_ref()));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_group_has_one_active_subscriber_across_brokers_and_hands_over_its_offset() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "one").await;
    let b = connect(&cluster, "one").await;
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=10).map(|i| Message::new(format!("{i}")))).await.unwrap();
    let mut sub_a = qa.group("g").unwrap().subscribe().await.unwrap();
    let qb = b.queue("q").await.unwrap();
    let gb = qb.group("g").unwrap();
    match gb.subscribe().await {
        Err(Error::Active { group, queue }) => {
            assert_eq!((group.as_str(), queue.as_str()), ("g", "q"))
        }
        other => panic!("expected AlreadySubscribed, got {:?}", other.map(|_| ())),
    }
    for _ in 0..4 {
        next(&mut sub_a).await.ack().unwrap();
    }
    // The fifth is delivered and dropped unacknowledged: it goes to the next owner.
    drop(next(&mut sub_a).await);
    drop(sub_a);
    let mut sub_b = subscribe_when_free(&gb).await;
    let d = next(&mut sub_b).await;
    assert_eq!(d.seq(), 5, "the next owner starts after what the last one acknowledged");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// An ordered group reset from another broker: refused while a subscription owns the group
/// anywhere; then the offset moves back and the group's marks go, and the next owner starts at
/// the new offset with its delivery counts forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_group_reset_is_refused_while_any_broker_owns_it_and_replays_after() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "reset").await;
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=5).map(|i| Message::new(format!("{i}")))).await.unwrap();
    let ga = qa.group("g").unwrap().max_deliveries(5);
    let mut sub = ga.subscribe().await.unwrap();
    for _ in 0..3 {
        next(&mut sub).await.ack().unwrap();
    }
    next(&mut sub).await.nack();
    assert_eq!(next(&mut sub).await.delivery_count(), 2, "4 came back once");
    a.flush().await.unwrap();
    let b = connect(&cluster, "reset").await;
    let gb = b.queue("q").await.unwrap().group("g").unwrap();
    match gb.reset_to(rockq::ResetTo::Sequence(2)).await {
        Err(Error::Active { group, queue }) => assert_eq!((group.as_str(), queue.as_str()), ("g", "q")),
        other => panic!("a subscription in another broker must refuse the reset, got {other:?}"),
    }
    assert_eq!(b.stats().await.unwrap().groups[0].committed, 3, "the refusal changed nothing");
    drop(sub);
    // `a` releases the group asynchronously (it commits, then revokes its lease).
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let next_seq = loop {
        match gb.reset_to(rockq::ResetTo::Sequence(2)).await {
            Err(Error::Active { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(next_seq, 2);
    assert_eq!(gb.committed(), Some(1));
    assert_eq!(b.stats().await.unwrap().groups[0].committed, 1);
    let mut sub = subscribe_when_free(&ga).await;
    let mut got = Vec::new();
    for _ in 2..=5 {
        let d = next(&mut sub).await;
        got.push((d.seq(), d.delivery_count()));
        d.ack().unwrap();
    }
    assert_eq!(got, [(2, 1), (3, 1), (4, 1), (5, 1)], "replayed from 2, the count of 4 forgotten");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A purge from a broker that never used the queue: every message goes and sequences go on;
/// a job of a purged message held in another broker has lost its lease (its claim went with
/// the purge); an idle ordered group and the work group move past the purged range; the
/// ordered group another broker owns skips it.
/// Regression (a review of the engine): loading a namespace read every priority index entry
/// (one per message sent with a priority and not yet trimmed) in one answer. A backlog of them
/// outgrew the client's 4 MiB answer limit and every load failed from then on: connecting,
/// trims, purges, stats. Each prefix is read in pages now. (A long namespace makes each entry
/// large, so 30,000 messages are past the limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_connects_to_a_namespace_whose_priority_index_outgrows_one_answer() {
    let cluster = etcd::Cluster::start(1).await;
    let ns = "n".repeat(rockq::MAX_NAME_LEN);
    let a = connect(&cluster, &ns).await;
    let q = a.queue("q").await.unwrap();
    let n = 30_000u32;
    let producers: Vec<_> = (0..4u32)
        .map(|t| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut i = t * 125;
                while i < n {
                    let batch =
                        (i..(i + 125).min(n)).map(|j| Message::new("low").priority(1 + (j % 5) as u8));
                    q.send_batch(batch).await.unwrap();
                    i += 4 * 125;
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    let top = q.send(Message::new("top").priority(9)).await.unwrap();
    let b = connect(&cluster, &ns).await;
    let qb = b.queue("q").await.unwrap();
    let mut jobs = qb.work_group("w").unwrap().read_batch(1).subscribe().await.unwrap();
    let job = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((job.seq(), job.payload().as_ref()), (top, &b"top"[..]), "the loaded index ranks it first");
    job.ack_durable().await.unwrap();
    let purged = b.purge_queue("q").await.unwrap();
    assert!(purged >= u64::from(n), "a purge loads the namespace too: {purged}");
    drop(jobs);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_from_any_broker_empties_the_queue_and_moves_every_group_past_it() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "purge").await;
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=10).map(|i| Message::new(format!("{i}")))).await.unwrap();
    let mut sub = qa.group("o").unwrap().subscribe().await.unwrap();
    let out = next(&mut sub).await;
    let mut jobs = qa.work_group("w").unwrap().subscribe().await.unwrap();
    let job = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(job.seq(), 1);
    {
        // An idle ordered group: its broker is gone (its lease revoked by the shutdown).
        let c = connect(&cluster, "purge").await;
        drop(c.queue("q").await.unwrap().group("idle").unwrap().subscribe().await.unwrap());
        c.shutdown().await.unwrap();
    }
    let b = connect(&cluster, "purge").await;
    assert_eq!(b.purge_queue("q").await.unwrap(), 10);
    assert_eq!(b.purge_queue("missing").await.unwrap(), 0);
    let stats = b.stats().await.unwrap();
    let q = stats.queues.iter().find(|q| q.name == "q").unwrap();
    assert_eq!((q.len, q.first_seq), (0, 11));
    let committed = |s: &rockq::Stats, g: &str| s.groups.iter().find(|x| x.group == g).unwrap().committed;
    assert_eq!(committed(&stats, "idle"), 10, "the idle ordered group moved past the purge");
    assert_eq!(committed(&stats, "w"), 10, "the work group moved past the purge");
    match job.ack_durable().await {
        Err(Error::LeaseLost { seq: 1, .. }) => {}
        other => panic!("a purged job's lease is gone, got {other:?}"),
    }
    let _ = out.ack(); // a no-op, or refused: nothing is written for a purged message
    assert_eq!(qa.send("new").await.unwrap(), 11, "sequences go on");
    let j = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((j.seq(), j.attempt()), (11, 1));
    j.ack_durable().await.unwrap();
    // The owner's subscription may hand out what it had read ahead until its watch brings the
    // purge mark; then it drops the rest (and what comes back) and goes on at 11.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "the owner never learned of the purge");
        let d = next(&mut sub).await;
        if d.seq() == 11 {
            d.ack().unwrap();
            break;
        }
        assert!(d.seq() <= 10, "{}", d.seq());
    }
    a.flush().await.unwrap();
    assert_eq!(qa.group("o").unwrap().committed(), Some(11), "the owner's offset went past the purge");
    drop((sub, jobs));
    let c = connect(&cluster, "purge").await;
    let mut idle = subscribe_when_free(&c.queue("q").await.unwrap().group("idle").unwrap()).await;
    assert_eq!(next(&mut idle).await.seq(), 11);
    drop(idle);
    for broker in [a, b, c] {
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_and_dead_letters_work_as_embedded() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "poison").await;
    let q = broker.queue("q").await.unwrap();
    q.send("poison").await.unwrap();
    q.send("fine").await.unwrap();
    let group = q.group("g").unwrap().max_deliveries(2).dead_letter_queue("q-dlq");
    let mut sub = group.subscribe().await.unwrap();
    let first = next(&mut sub).await;
    assert_eq!((first.seq(), first.delivery_count()), (1, 1));
    first.nack();
    let second = next(&mut sub).await;
    assert_eq!((second.seq(), second.delivery_count()), (1, 2));
    second.nack();
    // Used up: dead-lettered, and the stream goes on with the next.
    let fine = next(&mut sub).await;
    assert_eq!(fine.payload().as_ref(), b"fine");
    fine.ack().unwrap();
    broker.flush().await.unwrap();
    assert_eq!(q.group("g").unwrap().committed(), Some(2), "the offset passes the dead letter");

    let dlq = broker.queue("q-dlq").await.unwrap();
    let mut dsub = dlq.group("inspect").unwrap().subscribe().await.unwrap();
    let letter = next(&mut dsub).await;
    assert_eq!(letter.payload().as_ref(), b"poison");
    assert_eq!(letter.header("rockq-dlq-seq").map(|v| v.as_ref()), Some(b"1".as_ref()));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_counts_survive_a_handover_to_another_broker() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "counts").await;
    let q = a.queue("q").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.group("g").unwrap().max_deliveries(3).subscribe().await.unwrap();
    next(&mut sub).await.nack();
    next(&mut sub).await.nack();
    drop(sub);
    a.shutdown().await.unwrap();
    let b = connect(&cluster, "counts").await;
    let q = b.queue("q").await.unwrap();
    let mut sub = subscribe_when_free(&q.group("g").unwrap().max_deliveries(3)).await;
    let d = next(&mut sub).await;
    assert_eq!(d.delivery_count(), 3, "the count the last owner persisted");
    b.shutdown().await.unwrap();
}

/// Sends staged before a flush are in etcd when it returns, and those staged before a
/// shutdown are written or failed before it returns (staged sends are written by the engine's
/// appender task, beside the writer that answers both: it has the appender finish first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_staged_before_a_flush_or_a_shutdown_are_written_when_it_returns() {
    const N: u64 = 500;
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "staged").await;
    let q = a.queue("q").await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..N {
        receipts.push(q.enqueue(format!("m{i}")).await.unwrap());
    }
    a.flush().await.unwrap();
    let b = connect(&cluster, "staged").await;
    assert_eq!(b.queue("q").await.unwrap().last_seq(), N, "every send staged before the flush");
    b.shutdown().await.unwrap();
    for r in receipts.drain(..) {
        r.await.unwrap();
    }
    for i in 0..N {
        receipts.push(q.enqueue(format!("n{i}")).await.unwrap());
    }
    a.shutdown().await.unwrap();
    let mut written = 0;
    for r in receipts {
        // Resolved by the time the shutdown returned: written, or failed as shut down.
        match tokio::time::timeout(Duration::ZERO, r).await.expect("resolved before the shutdown returned") {
            Ok(_) => written += 1,
            Err(e) => assert!(matches!(e, Error::Shutdown), "{e}"),
        }
    }
    let c = connect(&cluster, "staged").await;
    assert_eq!(c.queue("q").await.unwrap().last_seq(), N + written, "what resolved written is stored");
    c.shutdown().await.unwrap();
}

/// The engine's tasks are the connecting runtime's: once it is dropped, calls from another
/// runtime are refused with `Shutdown` (embedded, the writer thread outlives it and they go
/// on) instead of waiting forever for a task that is gone, and what was sent before stays.
#[test]
fn calls_after_the_connecting_runtime_is_gone_are_refused_not_left_waiting() {
    let other = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cluster = other.block_on(etcd::Cluster::start(1));
    let home = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (broker, q, mut sub, mut jobs) = home.block_on(async {
        let broker = connect(&cluster, "gone").await;
        let q = broker.queue("q").await.unwrap();
        let sub = q.group("g").unwrap().subscribe().await.unwrap();
        let jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
        (broker, q, sub, jobs)
    });
    assert_eq!(other.block_on(q.send("from another runtime")).unwrap(), 1);
    other.block_on(async {
        next(&mut sub).await.ack().unwrap();
        let job = tokio::time::timeout(HANG_GUARD, jobs.next()).await.expect("a job").expect("open").unwrap();
        job.ack().unwrap();
    });
    // Subscribers waiting for more on a third runtime, each pending (its waker registered)
    // before the drop: woken to see the end (the stream's end, or an error), not left waiting.
    // Each keeps what it yields until then rather than taking its first item for the end: the
    // two acks' `Acked` events are broadcast when etcd has stored them, which on a busy machine
    // is after the event stream subscribed, and even after it first waited.
    let third = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let waiter = |mut stream: std::pin::Pin<Box<dyn futures::Stream<Item = bool> + Send>>| {
        let waiting = waiting.clone();
        let (mut seen, mut pended) = (Vec::new(), false);
        third.spawn(std::future::poll_fn(move |cx| {
            loop {
                match stream.as_mut().poll_next(cx) {
                    std::task::Poll::Pending => {
                        if !pended {
                            pended = true;
                            waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        return std::task::Poll::Pending;
                    }
                    std::task::Poll::Ready(Some(true)) => seen.push(true),
                    std::task::Poll::Ready(end) => {
                        return std::task::Poll::Ready((std::mem::take(&mut seen), end));
                    }
                }
            }
        }))
    };
    let ordered = waiter(Box::pin(sub.map(|d| d.is_ok())));
    let work = waiter(Box::pin(jobs.map(|j| j.is_ok())));
    let events = waiter(Box::pin(broker.event_stream().map(|_| true)));
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while waiting.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        assert!(std::time::Instant::now() < deadline, "the subscribers never waited");
        for (name, task) in [("ordered", &ordered), ("work", &work), ("events", &events)] {
            assert!(!task.is_finished(), "the {name} stream ended before the runtime was dropped");
        }
        std::thread::yield_now();
    }
    drop(home);
    let ((delivered, _), (claimed, _), (_, events_end)) = other.block_on(async {
        tokio::time::timeout(HANG_GUARD, async {
            (ordered.await.unwrap(), work.await.unwrap(), events.await.unwrap())
        })
        .await
        .expect("the waiting subscribers were woken")
    });
    // Nothing new was sent: neither group delivered anything; the events' stream ended.
    assert!(delivered.is_empty() && claimed.is_empty(), "{delivered:?} {claimed:?}");
    assert!(events_end.is_none(), "{events_end:?}");
    let send =
        other.block_on(async { tokio::time::timeout(HANG_GUARD, q.send("after")).await.expect("answered") });
    assert!(matches!(send, Err(Error::Shutdown)), "{send:?}");
    let flushed =
        other.block_on(async { tokio::time::timeout(HANG_GUARD, broker.flush()).await.expect("answered") });
    assert!(matches!(flushed, Err(Error::Shutdown)), "{flushed:?}");
    let peeked = other.block_on(async {
        tokio::time::timeout(HANG_GUARD, broker.peek("q", None, 10)).await.expect("answered")
    });
    assert!(matches!(peeked, Err(Error::Shutdown)), "{peeked:?}");
    assert!(broker.is_shut_down());
    // Returns at once: nothing is left to stop.
    let stopped = other
        .block_on(async { tokio::time::timeout(HANG_GUARD, broker.shutdown()).await.expect("answered") });
    assert!(stopped.is_ok(), "{stopped:?}");
    drop((broker, q, third));
    let again = other.block_on(connect(&cluster, "gone"));
    assert_eq!(other.block_on(again.queue("q")).unwrap().last_seq(), 1);
    other.block_on(again.shutdown()).unwrap();
}

/// A purge sees every send staged before it, as embedded: each is written before the purge
/// and purged with the rest, none lands after it (staged sends are written by the appender
/// task; the writer has it finish before a purge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_sees_every_send_staged_before_it() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "purged").await;
    let q = a.queue("q").await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..500 {
        receipts.push(q.enqueue(format!("m{i}")).await.unwrap());
    }
    a.purge_queue("q").await.unwrap();
    for r in receipts {
        r.await.unwrap();
    }
    let stats = a.stats().await.unwrap();
    let q = stats.queues.iter().find(|s| s.name == "q").unwrap();
    assert_eq!((q.len, q.last_seq), (0, 500), "every staged send written, then purged");
    a.shutdown().await.unwrap();
}

/// A window of deliveries nacked at once (an outage downstream) makes more comeback marks
/// than one etcd transaction holds: they are committed over several, their counts survive a
/// handover, and the marks are deleted once the offset passes them, over several too.
/// Single-threaded: the writer cannot run while the test nacks, so it takes every comeback
/// in one round.
#[tokio::test]
async fn a_burst_of_comebacks_larger_than_a_transaction_is_committed_and_tidied_up() {
    const N: usize = 600;
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let marks = async |etcd: &mut etcd_client::Client| {
        let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
        etcd.get("burst/k/ordered:g:q:", Some(opts)).await.unwrap().count()
    };
    let a = connect(&cluster, "burst").await;
    let q = a.queue("q").await.unwrap();
    q.send_batch((0..N).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    let mut sub = q.group("g").unwrap().max_deliveries(5).max_in_flight(N).subscribe().await.unwrap();
    let mut held = Vec::with_capacity(N);
    for _ in 0..N {
        held.push(next(&mut sub).await);
    }
    for d in held {
        d.nack();
    }
    a.flush().await.expect("the comebacks committed");
    assert_eq!(marks(&mut etcd).await, N as i64, "a mark per comeback");
    drop(sub);
    a.shutdown().await.unwrap();

    let b = connect(&cluster, "burst").await;
    let q = b.queue("q").await.unwrap();
    let mut sub = subscribe_when_free(&q.group("g").unwrap().max_deliveries(5).max_in_flight(N)).await;
    let mut counts = BTreeSet::new();
    for _ in 0..N {
        let d = next(&mut sub).await;
        counts.insert(d.delivery_count());
        d.ack().unwrap();
    }
    assert_eq!(counts, BTreeSet::from([2]), "every count the last owner persisted");
    b.flush().await.unwrap();
    assert_eq!(marks(&mut etcd).await, 0, "the offset passed every mark: all deleted");
    b.shutdown().await.unwrap();
}

/// Dead letters whose copies together exceed what one etcd request carries (large poison
/// messages dead-lettered in one round) are committed over several transactions, each in
/// order. Single-threaded for the same reason as the test above.
#[tokio::test]
async fn dead_letters_larger_together_than_one_request_are_committed_over_several() {
    const BIG: usize = 600 * 1024;
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "poison").await;
    let q = a.queue("q").await.unwrap();
    for i in 0..3u8 {
        q.send(Message::new(vec![i; BIG])).await.unwrap();
    }
    let group = q.group("g").unwrap().max_deliveries(1).max_in_flight(3).dead_letter_queue("poison");
    let mut sub = group.subscribe().await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(next(&mut sub).await);
    }
    for d in held {
        d.nack();
    }
    a.flush().await.expect("the dead letters committed");
    let dlq = a.queue("poison").await.unwrap();
    assert_eq!(dlq.last_seq(), 3, "every letter copied");
    let mut check = dlq.group("check").unwrap().subscribe().await.unwrap();
    for i in 0..3u8 {
        let d = next(&mut check).await;
        assert_eq!((d.payload().len(), d.payload().first()), (BIG, Some(&i)), "letter {i} in order");
        d.ack().unwrap();
    }
    drop((sub, check));
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_engine_does_not_carry_out_is_refused_with_a_typed_error_and_changes_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "refused").await;
    let q = broker.queue("q").await.unwrap();
    let is_etcd = |u: Option<&rockq::UnsupportedError>| u.is_some_and(|u| u.engine() == "etcd");

    let e = q
        .submit_batch((0..64).map(|i| Message::new(format!("{i}")).deliver_after(Duration::from_secs(5))))
        .await
        .unwrap_err();
    assert!(is_etcd(e.unsupported()), "a submit call with delays larger than one transaction: {e}");
    let e = q
        .submit_batch((0..126).map(|i| Message::new(format!("{i}")).idempotency_key(format!("k{i}"))))
        .await
        .unwrap_err();
    assert!(is_etcd(e.unsupported()), "more keys than the transaction that makes a call visible holds: {e}");
    let empty = broker.transaction().commit().await.unwrap();
    assert_eq!((empty.revision(), empty.sent().len()), (None, 0));
    let dir = tempfile::tempdir().unwrap();
    let e = broker.backup(dir.path().join("copy")).await.unwrap_err();
    assert!(is_etcd(e.unsupported()), "backup: {e}");
    assert!(!dir.path().join("copy").exists());
    let e = broker.pause_group("q", "g").await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "pausing a group that does not exist: {e}");
    let e = broker.delete_job("q", "g", 1).await.unwrap_err();
    assert!(
        matches!(e, rockq::Error::NoSuchGroup { .. }),
        "a job action on a group that does not exist: {e}"
    );
    let opts = EtcdOptions::new().options(rockq::Options::new().durability(rockq::Durability::Buffered));
    match Broker::connect_etcd(cluster.endpoints(), "refused", opts).await {
        Err(rockq::Error::Unsupported(u)) => assert_eq!(u.engine(), "etcd"),
        other => panic!("Buffered must be refused, got {:?}", other.map(|_| ())),
    }

    // Nothing of it landed: the queue is as it was, and still works.
    let stats = broker.stats().await.unwrap();
    assert_eq!(stats.queues.iter().map(|q| (q.name.as_str(), q.len)).collect::<Vec<_>>(), [("q", 0)]);
    assert_eq!(stats.queues[0].scheduled, 0, "no delayed message of the refused call");
    assert!(broker.delayed(Some("q"), 100).await.unwrap().is_empty());
    assert!(stats.groups.is_empty(), "no group was created: {:?}", stats.groups);
    assert_eq!(q.send("still works").await.unwrap(), 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_the_namespace_as_every_broker_left_it() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "stats").await;
    let b = connect(&cluster, "stats").await;
    a.queue("one").await.unwrap().send_batch(["1", "2", "3"].map(Message::new)).await.unwrap();
    let q = b.queue("two").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    b.flush().await.unwrap();
    // `a` never opened "two" and never saw the group: stats come from etcd.
    let stats = a.stats().await.unwrap();
    let queues: Vec<_> =
        stats.queues.iter().map(|q| (q.name.as_str(), q.first_seq, q.last_seq, q.len)).collect();
    assert_eq!(queues, [("one", 1, 3, 3), ("two", 1, 1, 1)]);
    // The dedup window is the queue record's (the default: SQS's five minutes).
    assert!(stats.queues.iter().all(|q| q.dedup_window == Duration::from_secs(300)), "{:?}", stats.queues);
    let groups: Vec<_> =
        stats.groups.iter().map(|g| (g.queue.as_str(), g.group.as_str(), g.committed, g.lag)).collect();
    assert_eq!(groups, [("two", "g", 1, 0)]);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_holding_something_else_is_refused_and_left_untouched() {
    let cluster = etcd::Cluster::start(1).await;
    let mut client = cluster.client().await;
    client.put("alien/meta/format", "not ours", None).await.unwrap();
    match Broker::connect_etcd(cluster.endpoints(), "alien", EtcdOptions::new()).await {
        Err(rockq::Error::NotRockq { reason, .. }) => assert!(reason.contains("format"), "{reason}"),
        other => panic!("expected NotRockq, got {:?}", other.map(|_| ())),
    }
    let left = client.get("alien/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(left.kvs().len(), 1, "nothing was written into a foreign namespace");
    match Broker::connect_etcd(cluster.endpoints(), "bad name!", EtcdOptions::new()).await {
        Err(rockq::Error::InvalidOption(_)) => {}
        other => panic!("expected InvalidOption, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_another_broker_creates_is_registered_here_through_the_watch() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "names").await;
    let b = connect(&cluster, "names").await;
    assert!(a.queue_names().is_empty());
    b.queue("late").await.unwrap().send("x").await.unwrap();
    // `a` never asked for it: the watch sees the new queue's tail and registers it, then the
    // send's tail move (two watch events, handled in order).
    tokio::time::timeout(HANG_GUARD, async {
        while a.get_queue("late").is_none_or(|q| q.last_seq() != 1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("registered with its tail within the hang guard");
    assert_eq!(a.queue_names(), ["late"]);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Two brokers on `ns` whose ordered groups' leases last 30 s: a lease revoked behind one's
/// back is not noticed by its keep-alive before the test's next commit.
async fn two_with_long_owner_leases(cluster: &etcd::Cluster, ns: &str) -> (Broker, Broker) {
    let opts = || EtcdOptions::new().owner_ttl(Duration::from_secs(30));
    let a = Broker::connect_etcd(cluster.endpoints(), ns, opts()).await.unwrap();
    let b = Broker::connect_etcd(cluster.endpoints(), ns, opts()).await.unwrap();
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_whose_lease_lapsed_commits_nothing_and_its_stream_ends() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = two_with_long_owner_leases(&cluster, "lapse").await;
    let qa = a.queue("q").await.unwrap();
    qa.send_batch(["1", "2"].map(Message::new)).await.unwrap();
    let mut sub_a = qa.group("g").unwrap().subscribe().await.unwrap();
    let held = next(&mut sub_a).await;
    // `a`'s lease lapses (as for a process paused past its TTL): revoked behind its back.
    let mut client = cluster.client().await;
    let owner = client.get("lapse/own/consumer:g:q", None).await.unwrap();
    let lease = owner.kvs().first().expect("a holds the group").lease();
    client.lease_revoke(lease).await.unwrap();
    let mut sub_b = subscribe_when_free(&b.queue("q").await.unwrap().group("g").unwrap()).await;
    // `a` still believes it holds the group: its ack must not be committed over `b`.
    held.ack().unwrap();
    a.flush().await.unwrap();
    match tokio::time::timeout(HANG_GUARD, sub_a.next()).await.expect("the stream answers") {
        Some(Err(rockq::Error::OwnershipLost { group, queue })) => {
            assert_eq!((group.as_str(), queue.as_str()), ("g", "q"));
        }
        other => panic!("expected OwnershipLost, got {:?}", other.map(|r| r.map(|d| d.seq()))),
    }
    assert_eq!(next(&mut sub_b).await.seq(), 1, "the new owner starts where the group's committed offset is");
    let stats = b.stats().await.unwrap();
    assert_eq!(stats.groups[0].committed, 0, "the lapsed owner's ack was not written");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// An ordered delivery's ack in a transaction is fenced by etcd's compare on the group's owner
/// key, not by what this process believes: after `a`'s lease was revoked behind its back and
/// `b` took the group, `a`'s transaction (a keyspace write and the ack) applies nothing, is
/// answered `LeaseLost`, and ends `a`'s subscription; `b` delivers the message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_ack_in_a_transaction_of_a_lapsed_owner_applies_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = two_with_long_owner_leases(&cluster, "txlapse").await;
    let (qa, ka) = (a.queue("q").await.unwrap(), a.kv("seen").await.unwrap());
    qa.send_batch(["1", "2"].map(Message::new)).await.unwrap();
    let mut sub_a = qa.group("g").unwrap().subscribe().await.unwrap();
    // While `a` owns the group: applied, and the offset committed with it.
    let first = next(&mut sub_a).await;
    let mut tx = a.transaction();
    tx.put(&ka, "1", "seen").unwrap();
    tx.ack(first);
    tx.commit().await.unwrap();
    assert_eq!(b.stats().await.unwrap().groups[0].committed, 1);
    let held = next(&mut sub_a).await;
    // `a`'s lease lapses (as for a process paused past its TTL): revoked behind its back.
    let mut client = cluster.client().await;
    let owner = client.get("txlapse/own/consumer:g:q", None).await.unwrap();
    let lease = owner.kvs().first().expect("a holds the group").lease();
    client.lease_revoke(lease).await.unwrap();
    let mut sub_b = subscribe_when_free(&b.queue("q").await.unwrap().group("g").unwrap()).await;
    let mut tx = a.transaction();
    tx.put(&ka, "2", "seen").unwrap();
    tx.ack(held);
    let e = tx.commit().await.unwrap_err();
    assert!(matches!(&e, Error::LeaseLost { seq: 2, .. }), "{e:?}");
    assert_eq!(ka.get("2").await.unwrap(), None, "nothing of it applied");
    match tokio::time::timeout(HANG_GUARD, sub_a.next()).await.expect("the stream answers") {
        Some(Err(Error::OwnershipLost { .. })) => {}
        other => panic!("expected OwnershipLost, got {:?}", other.map(|r| r.map(|d| d.seq()))),
    }
    let again = next(&mut sub_b).await;
    assert_eq!(again.seq(), 2, "the new owner delivers it again");
    again.ack_durable().await.unwrap();
    assert_eq!(a.stats().await.unwrap().groups[0].committed, 2);
    drop((sub_a, sub_b));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Regression (the engine's review): a read asked etcd for up to 1,024 messages and cut the
/// answer to size on the client, so 4 MiB of messages in a row made every read fail on the
/// client's answer limit and the groups stalled. Reads now ask for as many as fit, and fewer
/// again when larger messages follow smaller ones. Every reader meets small messages, then
/// large ones, then small ones again: ordered groups, work groups (their first claims read a
/// range; redeliveries read by sequence) and `peek`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_are_read_a_few_at_a_time_by_every_reader() {
    let cluster = etcd::Cluster::start(1).await;
    let b = connect(&cluster, "large").await;
    let q = b.queue("q").await.unwrap();
    let payload = |i: u64| -> Vec<u8> {
        let len = if (31..=60).contains(&i) { 600 << 10 } else { 100 };
        vec![(i % 251) as u8; len]
    };
    for i in 1..=90 {
        q.send(payload(i)).await.unwrap();
    }
    // 30 messages of 600 KiB: 18 MiB, more than four times the client's answer limit.
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for i in 1..=90 {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), &d.payload()[..]), (i, &payload(i)[..]), "ordered delivery {i}");
        d.ack().unwrap();
    }
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let mut seen = BTreeSet::new();
    let mut given_back = Vec::new();
    while seen.len() < 90 {
        let job = tokio::time::timeout(HANG_GUARD, jobs.next()).await.expect("a job").expect("open").unwrap();
        assert_eq!(&job.payload()[..], &payload(job.seq())[..], "job {}", job.seq());
        // Every third large one comes back once: its redelivery is read by sequence.
        if job.attempt() == 1 && job.seq() % 3 == 0 && (31..=60).contains(&job.seq()) {
            given_back.push(job.seq());
            job.retry_after(Duration::ZERO).await.unwrap();
            continue;
        }
        seen.insert(job.seq());
        job.ack().unwrap();
    }
    assert_eq!(seen, (1..=90).collect::<BTreeSet<u64>>());
    assert_eq!(given_back.len(), 10);
    let peeked = b.peek("q", None, 90).await.unwrap();
    assert_eq!(peeked.iter().map(|m| m.seq).collect::<Vec<_>>(), (1..=90).collect::<Vec<_>>());
    assert!(peeked.iter().all(|m| m.payload == payload(m.seq)), "peek returns every payload whole");
    drop((sub, jobs));
    b.shutdown().await.unwrap();
}

/// Idempotency keys across processes: brokers racing one key write it once, and every one of
/// them reports the original; the record is written in the message's own transaction, and goes
/// from etcd on its own (an expiring lease) once its window has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_racing_one_idempotency_key_write_it_once_and_etcd_forgets_it_after_its_window() {
    let cluster = etcd::Cluster::start(1).await;
    let brokers = [
        connect(&cluster, "dedup").await,
        connect(&cluster, "dedup").await,
        connect(&cluster, "dedup").await,
    ];
    let mut queues = Vec::new();
    for b in &brokers {
        queues.push(b.queue("payments").await.unwrap());
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(48));
    let mut tasks = Vec::new();
    for i in 0..48 {
        let (q, start) = (queues[i % 3].clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let key = format!("order-{}", i % 4);
            q.submit(Message::new(format!("attempt {i}")).idempotency_key(key)).await.unwrap()
        }));
    }
    let mut by_key: std::collections::BTreeMap<String, Vec<rockq::Sent>> = Default::default();
    for (i, t) in tasks.into_iter().enumerate() {
        by_key.entry(format!("order-{}", i % 4)).or_default().push(t.await.unwrap());
    }
    let mut originals = BTreeSet::new();
    for (key, outcomes) in &by_key {
        let appended: Vec<_> = outcomes.iter().filter(|o| matches!(o, rockq::Sent::Appended(_))).collect();
        assert_eq!(appended.len(), 1, "{key}: {outcomes:?}");
        let seq = appended[0].seq().unwrap();
        assert!(outcomes.iter().all(|o| o.seq() == Some(seq)), "{key}: every duplicate names the original");
        originals.insert(seq);
    }
    assert_eq!(originals, (1..=4).collect::<BTreeSet<u64>>(), "four keys, four messages");
    let peeked = brokers[0].peek("payments", None, 100).await.unwrap();
    assert_eq!(peeked.len(), 4, "duplicates wrote nothing");
    // A broker that never saw the keys knows them: they are etcd's, not a process's.
    let late = connect(&cluster, "dedup").await;
    let q = late.queue("payments").await.unwrap();
    let again = q.submit(Message::new("again").idempotency_key("order-2")).await.unwrap();
    assert!(
        matches!(again, rockq::Sent::Duplicate(rockq::Original::Appended(s)) if originals.contains(&s)),
        "{again:?}"
    );
    // A short window: the records go under an etcd lease that outlives it by a little, and
    // then etcd deletes them (nothing accumulates, no pass needed).
    q.set_dedup_window(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        q.submit(Message::new("short").idempotency_key("brief")).await.unwrap(),
        rockq::Sent::Appended(5)
    );
    let mut etcd = cluster.client().await;
    let opts = || Some(etcd_client::GetOptions::new().with_prefix().with_count_only());
    assert_eq!(etcd.get("dedup/d/", opts()).await.unwrap().count(), 5, "a record per key");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let left = etcd.get("dedup/d/", opts()).await.unwrap().count();
        // The five-minute records stay; the one-second one goes with its lease.
        if left == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the expired record is still in etcd ({left} records)"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    late.shutdown().await.unwrap();
    for b in brokers {
        b.shutdown().await.unwrap();
    }
}

/// Pause and resume across processes: a broker that never subscribed pauses both group modes
/// through etcd; the broker that runs their subscriptions learns it through its watch and
/// hands out nothing new (acks of what it holds still land); a broker started later finds the
/// groups paused; resuming from anywhere wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_by_any_broker_holds_every_brokers_subscriptions_until_resumed() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "pause").await, connect(&cluster, "pause").await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=6).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    let (g, w) = (qa.group("g").unwrap(), qa.work_group("w").unwrap());
    let mut sub = qa.group("g").unwrap().read_batch(1).subscribe().await.unwrap();
    let mut jobs = w.clone().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    let first = next(&mut sub).await;
    let job = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((first.seq(), job.seq()), (1, 1));
    // `b` knows neither group: etcd does.
    b.pause_group("q", "g").await.unwrap();
    b.pause_group("q", "w").await.unwrap();
    assert!(matches!(b.pause_group("q", "nope").await, Err(Error::NoSuchGroup { .. })));
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !(g.is_paused() && w.is_paused()) {
        assert!(tokio::time::Instant::now() < deadline, "the pause never reached the other broker");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What was handed out still settles; nothing new is handed out (a delivery already read
    // ahead before the pause was learned may come, then nothing).
    first.ack().unwrap();
    job.ack().unwrap();
    a.flush().await.unwrap();
    let quiet = |d: Option<u64>| d.is_none_or(|s| s == 2);
    let mut got = None;
    while let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        let d = d.unwrap();
        assert!(got.is_none() && quiet(Some(d.seq())), "a paused ordered group delivered {}", d.seq());
        got = Some(d.seq());
        d.ack().unwrap();
    }
    let mut claimed = None;
    while let Ok(Some(j)) = tokio::time::timeout(Duration::from_millis(300), jobs.next()).await {
        let j = j.unwrap();
        assert!(claimed.is_none() && quiet(Some(j.seq())), "a paused work group claimed {}", j.seq());
        claimed = Some(j.seq());
        j.ack().unwrap();
    }
    let stats = b.stats().await.unwrap();
    assert!(stats.groups.iter().all(|g| g.paused), "{:?}", stats.groups);
    // A broker started now finds them paused.
    let c = connect(&cluster, "pause").await;
    let qc = c.queue("q").await.unwrap();
    assert!(
        qc.work_group("w").unwrap().is_paused() || {
            // The work group's state loads with its first subscription.
            let mut s = qc.work_group("w").unwrap().subscribe().await.unwrap();
            let paused = qc.work_group("w").unwrap().is_paused();
            assert!(
                tokio::time::timeout(Duration::from_millis(300), s.next()).await.is_err(),
                "claimed while paused"
            );
            paused
        }
    );
    // Resumed by the third broker: the first one's subscriptions go on where they were.
    c.resume_group("q", "g").await.unwrap();
    c.resume_group("q", "w").await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(d.seq(), got.map_or(2, |s| s + 1));
    d.ack().unwrap();
    let j = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(j.seq(), claimed.map_or(2, |s| s + 1));
    j.ack().unwrap();
    drop((sub, jobs));
    for broker in [a, b, c] {
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_group_would_drop_is_refused_and_a_progress_report_goes_with_the_ack() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "outcomes").await;
    let q = broker.queue("q").await.unwrap();
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    q.send("for a result").await.unwrap();
    let job = tokio::time::timeout(Duration::from_secs(30), futures::StreamExt::next(&mut jobs))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The group keeps no outcomes (it cannot be stored here): a result is refused as there.
    assert_eq!(job.set_result("x").unwrap_err().kind(), rockq::ErrorKind::InvalidInput);
    job.progress("half").unwrap();
    assert_eq!(job.last_progress().as_deref(), Some(&b"half"[..]));
    broker.flush().await.unwrap();
    assert_eq!(broker.job("q", "w", 1).await.unwrap().progress.as_deref(), Some(&b"half"[..]));
    job.ack_durable().await.unwrap();
    let s = broker.job("q", "w", 1).await.unwrap();
    assert_eq!((s.state, s.outcome, s.progress), (rockq::JobState::Finished, None, None));
    broker.shutdown().await.unwrap();
}

/// Priorities across processes: prioritised messages one broker sends (a send, a batch, a
/// transaction's send) are claimed by another broker's subscription before the backlog, highest
/// first, as they are embedded; one the first broker claimed ahead of the backlog is never
/// handed out by the second, which drains everything else in order; a broker connecting later
/// reads each message's priority from the index in etcd; the group finishes every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_sent_in_one_broker_are_claimed_first_in_another() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "priorities").await, connect(&cluster, "priorities").await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=50).map(|i| format!("plain {i}"))).await.unwrap();
    let qb = b.queue("q").await.unwrap();
    assert_eq!(qb.send(Message::new("p5").priority(5)).await.unwrap(), 51);
    qb.send_batch([Message::new("p9").priority(9), Message::new("plain 51")]).await.unwrap();
    let mut tx = b.transaction();
    tx.send(&qb, Message::new("p7").priority(7)).unwrap();
    tx.commit().await.unwrap();
    // A call larger than a transaction (its sequences reserved first): its index entries go
    // with the commit that publishes it.
    let bulk = (0..200).map(|i| match i {
        150 => Message::new("p8").priority(8),
        _ => Message::new(format!("bulk {i}")),
    });
    let bulk = bulk.map(|m| etcd::reserved_sized(m, 200));
    assert_eq!(qb.send_batch(bulk).await.unwrap(), 55..=254);
    // `a` sees them published (its namespace watch brings each index entry with the tail).
    tokio::time::timeout(HANG_GUARD, async {
        while qa.last_seq() < 254 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a saw b's sends");
    let group = |q: &rockq::Queue| {
        q.work_group("w").unwrap().lease(Duration::from_secs(3600)).read_batch(1).max_in_flight(1)
    };
    // `b` claims the highest first and holds it.
    let mut in_b = group(&qb).subscribe().await.unwrap();
    let held = tokio::time::timeout(HANG_GUARD, in_b.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((held.seq(), held.priority(), held.payload().as_ref()), (52, 9, &b"p9"[..]));
    // A broker connecting now reads the priorities from etcd.
    let c = connect(&cluster, "priorities").await;
    let priorities: Vec<u8> =
        futures::future::join_all([51, 52, 53, 54, 204, 205].map(|s| c.job("q", "w", s)))
            .await
            .into_iter()
            .map(|s| s.unwrap().priority)
            .collect();
    assert_eq!(priorities, [5, 9, 0, 7, 0, 8]);
    c.shutdown().await.unwrap();
    // `a` drains the rest: the prioritised ones first, then the backlog in order; never p9.
    let mut in_a = group(&qa).subscribe().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..253 {
        let j = tokio::time::timeout(HANG_GUARD, in_a.next()).await.unwrap().unwrap().unwrap();
        got.push(String::from_utf8_lossy(j.payload()).into_owned());
        j.ack().unwrap();
    }
    let mut want: Vec<String> = vec!["p8".into(), "p7".into(), "p5".into()];
    want.extend((1..=51).map(|i| format!("plain {i}")));
    want.extend((0..200).filter(|&i| i != 150).map(|i| format!("bulk {i}")));
    assert_eq!(got, want);
    held.ack_durable().await.unwrap();
    let wg = qa.work_group("w").unwrap();
    tokio::time::timeout(HANG_GUARD, async {
        while wg.committed() < Some(254) {
            a.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every job finished, the offset past all");
    drop((in_a, in_b));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A broker that stopped holding a prioritised job it claimed ahead of the backlog (and having
/// finished another): a broker connecting afterwards reads those claims ahead of its
/// frontier, claims the next prioritised job and the backlog without touching them, and the
/// held one, with its attempt counted, once its lease has run out (on etcd a stopped
/// process's lease holds until then; embedded, a restart frees it at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_made_ahead_by_a_stopped_broker_are_neither_lost_nor_repeated() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let lease = Duration::from_secs(60);
    let b = connect_clock(&cluster, "ahead", &clock).await;
    let q = b.queue("q").await.unwrap();
    q.send_batch((1..=4).map(|i| format!("plain {i}"))).await.unwrap();
    for u in ["u1", "u2", "u3"] {
        q.send(Message::new(u).priority(2)).await.unwrap();
    }
    q.send_batch(["plain 5", "plain 6"]).await.unwrap();
    let group = |q: &rockq::Queue| q.work_group("w").unwrap().lease(lease).read_batch(2).max_in_flight(2);
    let mut sub = group(&q).subscribe().await.unwrap();
    let (u1, u2) = (common::next_job(&mut sub).await, common::next_job(&mut sub).await);
    assert_eq!((u1.payload().as_ref(), u2.payload().as_ref()), (&b"u1"[..], &b"u2"[..]));
    u1.ack_durable().await.unwrap();
    // Stopped without settling u2: its lease record stays in etcd.
    drop((u2, sub));
    drop(b);
    let c = connect_clock(&cluster, "ahead", &clock).await;
    let q = c.queue("q").await.unwrap();
    let mut sub = group(&q).subscribe().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..8 {
        let j = common::next_job(&mut sub).await;
        got.push((String::from_utf8_lossy(j.payload()).into_owned(), j.attempt()));
        j.ack_durable().await.unwrap();
        if got.len() == 7 {
            // Everything else done: u2's lease runs out.
            clock.advance(lease + Duration::from_secs(1));
        }
    }
    let want: Vec<(String, u32)> = ["u3", "plain 1", "plain 2", "plain 3", "plain 4", "plain 5", "plain 6"]
        .iter()
        .map(|s| (s.to_string(), 1))
        .collect();
    assert_eq!(got[..7], want[..]);
    assert_eq!(got[7], ("u2".to_string(), 2), "u2 once its lease ran out, its attempt counted");
    let wg = q.work_group("w").unwrap();
    tokio::time::timeout(HANG_GUARD, async {
        while wg.committed() < Some(9) {
            c.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every job finished once, u1 never again");
    drop(sub);
    c.shutdown().await.unwrap();
}

/// A send call larger than one etcd transaction (1 MiB of values, or more than 127 keys: packed
/// runs of up to 128 small messages each count as one) is written under a reservation of its
/// sequences: it is one call as embedded (contiguous sequences,
/// in order), another broker's sends meanwhile land before or after it, never inside, and
/// the sequences stay dense. A keyed call of that size records every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_call_larger_than_a_transaction_is_one_contiguous_call_beside_other_brokers_sends() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "large").await;
    let b = connect(&cluster, "large").await;
    let qa = a.queue("q").await.unwrap();
    let qb = b.queue("q").await.unwrap();

    // b sends one at a time all along, while a sends two large calls: 1000 messages of 1.3 KiB
    // (two transactions by bytes) and five of 400 KiB (2 MiB: three transactions by bytes).
    let small = tokio::spawn(async move {
        let mut seqs = Vec::new();
        for i in 0..200 {
            seqs.push((qb.send(format!("b{i}")).await.unwrap(), format!("b{i}")));
        }
        seqs
    });
    let first_small = *qa
        .send_batch((0..1000).map(|i| etcd::reserved_sized(Message::new(format!("a{i}")), 1000)))
        .await
        .unwrap()
        .start();
    let big = |i: usize| {
        let mut v = vec![b'x'; 400 * 1024];
        v[0] = b'0' + i as u8;
        v
    };
    let first_big = *qa.send_batch((0..5).map(|i| Message::new(big(i)))).await.unwrap().start();
    let b_seqs = small.await.unwrap();

    let mut expected: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
    for i in 0..1000u64 {
        expected.insert(first_small + i, format!("a{i}").into_bytes());
    }
    for i in 0..5u64 {
        expected.insert(first_big + i, big(i as usize));
    }
    for (seq, p) in &b_seqs {
        assert!(expected.insert(*seq, p.clone().into_bytes()).is_none(), "sequence {seq} given twice");
    }
    assert_eq!(expected.len(), 1205);
    assert_eq!(expected.keys().copied().collect::<Vec<_>>(), (1..=1205).collect::<Vec<_>>(), "dense");
    // Both calls were reserved (a key per message; b's sends, one at a time, a key each).
    let mut client = cluster.client().await;
    assert_eq!(etcd::keys_under(&mut client, "large/m/").await, 1205, "both calls reserved");

    // Read back in order by a third broker, all of it.
    let c = connect(&cluster, "large").await;
    let qc = c.queue("q").await.unwrap();
    let mut sub = qc.group("g").unwrap().subscribe().await.unwrap();
    for (seq, payload) in &expected {
        let d = next(&mut sub).await;
        assert_eq!(d.seq(), *seq);
        assert!(d.payload().as_ref() == payload.as_slice(), "payload of {seq}");
        d.ack().unwrap();
    }
    drop(sub);

    // A keyed submit of 300 messages, 100 of them keyed: all written, every key recorded.
    let batch = || {
        (0..300).map(|i| match i % 3 {
            0 => etcd::reserved_sized(Message::new(format!("k{i}")).idempotency_key(format!("key{i}")), 300),
            _ => etcd::reserved_sized(Message::new(format!("u{i}")), 300),
        })
    };
    let sent = qa.submit_batch(batch()).await.unwrap();
    assert_eq!(sent.len(), 300);
    for (i, s) in sent.iter().enumerate() {
        assert!(!s.is_duplicate(), "{i}");
        assert_eq!(s.seq(), Some(1206 + i as u64));
    }
    // Sent again from the other broker: the keyed ones are duplicates of those sequences.
    let again = qc.submit_batch(batch()).await.unwrap();
    for (i, s) in again.iter().enumerate() {
        if i % 3 == 0 {
            assert!(s.is_duplicate(), "{i}");
            assert_eq!(s.seq(), Some(1206 + i as u64), "the original of {i}");
        } else {
            assert_eq!(s.seq(), Some(1506 + (i - i / 3 - 1) as u64), "{i}");
        }
    }
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.queues[0].last_seq, 1205 + 300 + 200);
    for broker in [a, b, c] {
        broker.shutdown().await.unwrap();
    }
}

fn scheduled(s: rockq::Sent) -> rockq::ScheduledMessage {
    match s {
        rockq::Sent::Scheduled(m) => m,
        other => panic!("expected a scheduled message, got {other:?}"),
    }
}

async fn connect_clock(cluster: &etcd::Cluster, ns: &str, clock: &rockq::ManualClock) -> Broker {
    let options = rockq::Options::new().clock(clock.clone());
    let opts = EtcdOptions::new().options(options).owner_ttl(Duration::from_secs(2));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

/// Two brokers on one clock write delayed messages, cancel and move each other's, and both
/// fire when the clock passes them: every message is appended exactly once, at dense
/// sequences in due order; what one broker wrote fires after it shut down; an idempotency key
/// names the delayed message across brokers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_fire_once_whichever_broker_fires_and_any_broker_cancels_or_moves_them() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_clock(&cluster, "delayed", &clock).await;
    let b = connect_clock(&cluster, "delayed", &clock).await;
    let qa = a.queue("q").await.unwrap();
    let qb = b.queue("q").await.unwrap();
    // 120 from a (three calls of 40, one transaction each), 40 from b; due 10 s to 19.9 s.
    let mut ids = Vec::new();
    for call in 0..4 {
        let q = if call < 3 { &qa } else { &qb };
        let msgs = (0..40).map(|i| {
            let n = call * 40 + i;
            Message::new(format!("m{n}")).deliver_after(Duration::from_millis(10_000 + 60 * n as u64))
        });
        ids.extend(q.submit_batch(msgs).await.unwrap().into_iter().map(|s| scheduled(s).id));
    }
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 160, "ids are unique across brokers");
    // A keyed delayed message: the key names it from the other broker too.
    let keyed = scheduled(
        qa.submit(Message::new("keyed").idempotency_key("once").deliver_after(Duration::from_secs(15)))
            .await
            .unwrap(),
    );
    match qb.submit(Message::new("keyed again").idempotency_key("once")).await.unwrap() {
        rockq::Sent::Duplicate(rockq::Original::Scheduled(id)) => assert_eq!(id, keyed.id),
        other => panic!("expected a duplicate of the delayed message, got {other:?}"),
    }
    // b cancels one of a's; a then finds nothing to cancel. b moves another of a's to 100 s.
    assert!(qb.cancel(ids[0]).await.unwrap());
    assert!(!qa.cancel(ids[0]).await.unwrap(), "cancelled once, by the other broker");
    let moved = qb.reschedule(ids[1], clock.wall_time() + Duration::from_secs(100)).await.unwrap().unwrap();
    assert_eq!(moved.id, ids[1]);
    let listed = a.delayed(Some("q"), 1000).await.unwrap();
    assert_eq!(listed.len(), 160, "159 of the calls and the keyed one");
    assert!(listed.iter().all(|d| d.queue == "q" && d.id != ids[0]));
    assert_eq!(b.delayed(None, 1000).await.unwrap().len(), 160, "every queue's, listed by the other broker");
    let stats = a.stats().await.unwrap();
    assert_eq!(stats.queues[0].scheduled, 160);
    assert_eq!(stats.queues[0].next_due, listed.iter().map(|d| d.due).min());
    assert_eq!(qa.last_seq(), 0, "nothing visible before it is due");

    // Both brokers' timers fire at once: each message is appended once.
    let mut sub = qb.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(30));
    let mut seen = Vec::new();
    for _ in 0..159 {
        let d = next(&mut sub).await;
        seen.push((d.seq(), String::from_utf8(d.payload().to_vec()).unwrap()));
        d.ack().unwrap();
    }
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=159).collect::<Vec<_>>(), "dense");
    let names: Vec<&str> = seen.iter().map(|s| s.1.as_str()).collect();
    let mut expected: Vec<String> = (2..160).map(|n| format!("m{n}")).collect();
    // The keyed one is due at 15 s: between m83 (14.98 s) and m84 (15.04 s).
    expected.insert(82, "keyed".into());
    assert_eq!(names, expected, "each once, in due order");
    common::assert_next_is_sentinel(&qb, &mut sub).await;

    // The moved one was a's; a is gone when it falls due: b fires it.
    a.shutdown().await.unwrap();
    clock.advance(Duration::from_secs(100));
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (161, &b"m1"[..]));
    d.ack().unwrap();
    common::assert_next_is_sentinel(&qb, &mut sub).await;
    assert!(b.delayed(None, 10).await.unwrap().is_empty());
    assert_eq!(b.stats().await.unwrap().queues[0].scheduled, 0);
    assert!(qb.reschedule(ids[1], clock.wall_time()).await.unwrap().is_none(), "fired: not scheduled");
    b.shutdown().await.unwrap();
}

/// A delayed message's record that does not decode (damaged, or written by something else)
/// does not hold up the others: they fire when due, in every queue; the damaged one does not
/// fire, and listing reports it as corrupt (kind `Corrupt`, as the embedded engine reports a
/// record that does not decode) rather than skip it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_record_that_does_not_decode_does_not_hold_up_the_others() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    // A request timeout longer than the hang guard: a damaged record read again and again
    // until the timeout, as if etcd were unreachable, would fail the listing's guard below.
    let options = rockq::Options::new().clock(clock.clone());
    let opts = EtcdOptions::new().options(options).request_timeout(Duration::from_secs(600));
    let broker = Broker::connect_etcd(cluster.endpoints(), "bad-delay", opts).await.expect("connect to etcd");
    let q = broker.queue("q").await.unwrap();
    let other = broker.queue("other").await.unwrap();
    let damaged =
        scheduled(q.submit(Message::new("damaged").deliver_after(Duration::from_secs(5))).await.unwrap());
    q.submit(Message::new("later").deliver_after(Duration::from_secs(8))).await.unwrap();
    other.submit(Message::new("elsewhere").deliver_after(Duration::from_secs(9))).await.unwrap();
    // `<ns>/x/<queue id><id>`: shorter than the due time it starts with. Its due entry stays,
    // first in due order.
    let key = [b"bad-delay/x/".as_slice(), &1u32.to_be_bytes(), &damaged.id.to_be_bytes()].concat();
    cluster.client().await.put(key, b"bad".to_vec(), None).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let mut sub_other = other.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(10));
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (1, &b"later"[..]), "the damaged one does not fire");
    d.ack().unwrap();
    let d = next(&mut sub_other).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (1, &b"elsewhere"[..]));
    d.ack().unwrap();
    common::assert_next_is_sentinel(&q, &mut sub).await;
    let listed = tokio::time::timeout(HANG_GUARD, broker.delayed(None, 10)).await;
    match listed.expect("a damaged record is reported at once, not read again until the request timeout") {
        Err(rockq::Error::Corrupt(e)) => assert!(e.to_string().contains("delayed message"), "{e}"),
        other => panic!("listing must report the damaged record as corrupt, got {other:?}"),
    }
    // Nothing else is due: the timer is not held at the damaged one's due time either.
    assert_eq!(broker.stats().await.unwrap().queues.iter().filter_map(|s| s.next_due).count(), 0);
    broker.shutdown().await.unwrap();
}

/// A delayed message written by a broker that is gone before it falls due is fired by a broker
/// connected later (its timer starts at the earliest due time in the namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_connected_later_fires_what_an_earlier_one_delayed() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_clock(&cluster, "later", &clock).await;
    let q = a.queue("q").await.unwrap();
    q.submit(Message::new("x").deliver_after(Duration::from_secs(5))).await.unwrap();
    a.shutdown().await.unwrap();
    clock.advance(Duration::from_secs(10));
    let b = connect_clock(&cluster, "later", &clock).await;
    let q = b.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (1, &b"x"[..]));
    d.ack().unwrap();
    b.shutdown().await.unwrap();
}

/// A recurring schedule made by one broker fires each occurrence once while two brokers' timers
/// race for it; another broker pauses, resumes and deletes it; it goes on firing after the
/// broker that made it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurring_schedule_fires_each_occurrence_once_across_brokers() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_clock(&cluster, "recurring", &clock).await;
    let b = connect_clock(&cluster, "recurring", &clock).await;
    a.schedule("tick", Duration::from_secs(10), "q", "t").await.unwrap();
    let listed = b.schedules().await.unwrap();
    assert_eq!(
        listed.iter().map(|s| (s.name.as_str(), s.queue.as_str())).collect::<Vec<_>>(),
        [("tick", "q")]
    );
    let q = b.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for seq in 1..=5 {
        clock.advance(Duration::from_secs(10));
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, &b"t"[..]), "one message per occurrence");
        d.ack().unwrap();
    }
    common::assert_next_is_sentinel(&q, &mut sub).await;
    assert_eq!(a.schedules().await.unwrap()[0].fired, 5);

    // Paused by b: nothing while paused, and those firings are not missed ones.
    b.pause_schedule("tick").await.unwrap();
    assert!(a.schedules().await.unwrap()[0].paused);
    clock.advance(Duration::from_secs(30));
    common::assert_next_is_sentinel(&q, &mut sub).await;
    a.resume_schedule("tick").await.unwrap();
    a.shutdown().await.unwrap();
    // a is gone: b fires it alone.
    clock.advance(Duration::from_secs(10));
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (8, &b"t"[..]));
    d.ack().unwrap();
    let s = &b.schedules().await.unwrap()[0];
    assert_eq!((s.fired, s.missed_firings, s.paused), (6, 0, false));
    assert!(b.delete_schedule("tick").await.unwrap());
    assert!(!b.delete_schedule("tick").await.unwrap());
    clock.advance(Duration::from_secs(30));
    common::assert_next_is_sentinel(&q, &mut sub).await;
    assert!(b.schedules().await.unwrap().is_empty());
    assert!(b.delayed(None, 10).await.unwrap().is_empty(), "its pending firing went with it");
    b.shutdown().await.unwrap();
}

/// Large delayed messages (900 KiB each: together over the client's 4 MiB answer limit) are
/// listed and fire, each once, in due order; a reschedule to the time already set is answered
/// (a transaction that deletes and puts one key would be refused by etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_delayed_messages_are_listed_and_fire_and_a_reschedule_in_place_is_answered() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let b = connect_clock(&cluster, "large-delays", &clock).await;
    let q = b.queue("big").await.unwrap();
    let body = vec![b'x'; 900 * 1024];
    let mut ids = Vec::new();
    for i in 0..6u64 {
        let m =
            Message::new(body.clone()).header("n", i.to_string()).deliver_after(Duration::from_secs(10 + i));
        ids.push(scheduled(q.submit(m).await.unwrap()).id);
    }
    let listed = b.delayed(Some("big"), 10).await.unwrap();
    assert_eq!(listed.iter().map(|d| d.id).collect::<Vec<_>>(), ids);
    assert!(listed.iter().all(|d| d.payload_len == body.len()));
    let again = q.reschedule(ids[0], listed[0].due).await.unwrap().expect("still scheduled");
    assert_eq!(again.due, listed[0].due);

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(30));
    for i in 0..6u64 {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.header("n").map(|v| v.to_vec())), (i + 1, Some(i.to_string().into_bytes())));
        assert_eq!(d.payload().len(), body.len());
        d.ack().unwrap();
    }
    common::assert_next_is_sentinel(&q, &mut sub).await;
    b.shutdown().await.unwrap();
}

/// An ack that extends the finished run above a work group's offset moves the offset in its
/// own etcd transaction: the claim record goes with the move, no `Done` is put, one write per
/// round instead of two. An ack above a gap puts its `Done` (a record of its own, over the range
/// record the claim wrote for the three); the ack that closes the gap moves the offset over
/// both, and no record is left below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_moves_the_work_groups_offset_in_its_own_transaction() {
    let cluster = etcd::Cluster::start(1).await;
    let a = connect(&cluster, "ack-move").await;
    let q = a.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let group = q.work_group("w").unwrap();
    let mut jobs = group.clone().read_batch(3).subscribe().await.unwrap();
    let j1 = common::next_job(&mut jobs).await;
    let j2 = common::next_job(&mut jobs).await;
    let j3 = common::next_job(&mut jobs).await;
    a.flush().await.unwrap();
    let mut client = cluster.client().await;
    let mut records = async || {
        let opts = etcd_client::GetOptions::new().with_prefix();
        let got = client.get("ack-move/c/", Some(opts)).await.unwrap();
        // (Not the offset's echo, which every move rewrites: `<u64::MAX>o`.)
        let echo = [[0xff; 8].as_slice(), b"o"].concat();
        got.kvs().iter().map(|kv| kv.key().to_vec()).filter(|k| !k.ends_with(&echo)).collect::<Vec<_>>()
    };
    let own = |seq: u64| [b"ack-move/c/claim:w:q:".as_slice(), &seq.to_be_bytes()].concat();
    let is_run = |key: &Vec<u8>| key.len() == own(0).len() + 1 && key.ends_with(b"r");
    // (One claim, or a first of one job and then the rest: as the subscription's reads go.)
    let claimed = records().await;
    assert!(
        !claimed.is_empty() && claimed.iter().all(is_run),
        "first attempts in range records: {claimed:?}"
    );
    let ack = async |job: rockq::Job| {
        let before = revision(&cluster).await;
        job.ack_durable().await.unwrap();
        a.flush().await.unwrap();
        revision(&cluster).await - before
    };
    assert_eq!(ack(j3).await, 1, "above the gap: its Done");
    assert_eq!(group.committed(), Some(0));
    assert!(records().await.contains(&own(3)), "3's Done, a record of its own");
    assert_eq!(ack(j1).await, 1, "the Done-less ack and the move: one transaction");
    assert_eq!(group.committed(), Some(1));
    assert!(records().await.contains(&own(3)), "3's Done stays above the offset");
    assert_eq!(ack(j2).await, 1, "over 2 and 3 at once");
    assert_eq!(group.committed(), Some(3));
    assert!(records().await.is_empty(), "no record left below the offset");
    // Acks queued by jobs (as a worker pool's) go in the writer's next round: the same.
    q.send_batch(["4", "5"]).await.unwrap();
    let (j4, j5) = (common::next_job(&mut jobs).await, common::next_job(&mut jobs).await);
    a.flush().await.unwrap();
    for (job, seq) in [(j4, 4), (j5, 5)] {
        let before = revision(&cluster).await;
        job.ack().unwrap();
        a.flush().await.unwrap();
        assert_eq!(revision(&cluster).await - before, 1, "the ack and the move: one transaction");
        assert_eq!(group.committed(), Some(seq));
    }
    assert!(records().await.is_empty());
    drop(jobs);
    let b = connect(&cluster, "ack-move").await;
    let stats = b.stats().await.unwrap();
    let w = stats.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!(w.committed, 5, "another broker reads the moved offset");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The namespace's current revision (it moves with every write, and only then).
async fn revision(cluster: &etcd::Cluster) -> i64 {
    let mut client = cluster.client().await;
    let opts = etcd_client::GetOptions::new().with_count_only();
    client.get("revision-probe", Some(opts)).await.unwrap().header().unwrap().revision()
}

/// `Inspector::connect_etcd` reads what the brokers wrote (the same answers as a broker's),
/// writes nothing — not even a delayed message that fell due on its clock, which a broker on
/// that clock fires at once — and refuses a namespace that does not exist without creating it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspector_reads_the_namespace_live_and_writes_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let a = connect_clock(&cluster, "seen", &clock).await;
    let orders = a.queue("orders").await.unwrap();
    orders.send_batch(["o1", "o2", "o3"]).await.unwrap();
    let jobs = a.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2"]).await.unwrap();
    let mut js = jobs.work_group("workers").unwrap().consumer_name("held-here").subscribe().await.unwrap();
    let held = common::next_job(&mut js).await;
    let delayed =
        scheduled(orders.submit(Message::new("later").deliver_after(Duration::from_secs(60))).await.unwrap());

    let inspector = rockq::Inspector::connect_etcd(cluster.endpoints(), "seen", EtcdOptions::new())
        .await
        .expect("inspect the namespace");
    let (mine, theirs) = (a.stats().await.unwrap(), inspector.stats().await.unwrap());
    let lens = |s: &rockq::Stats| s.queues.iter().map(|q| (q.name.clone(), q.len)).collect::<Vec<_>>();
    assert_eq!(lens(&theirs), lens(&mine));
    let pending = inspector.pending("jobs", "workers").await.unwrap();
    assert_eq!(pending, a.pending("jobs", "workers").await.unwrap());
    let claim = pending.iter().find(|p| p.seq == held.seq()).expect("the held job's claim");
    assert_eq!(claim.holder.as_deref(), Some("held-here"));
    let peeked: Vec<u64> = inspector.peek("orders", None, 10).await.unwrap().iter().map(|m| m.seq).collect();
    assert_eq!(peeked, vec![1, 2, 3]);
    assert_eq!(inspector.delayed(Some("orders"), 10).await.unwrap()[0].id, delayed.id);
    // Live: a send after the connection is seen by the next read.
    orders.send("o4").await.unwrap();
    assert_eq!(inspector.peek("orders", Some(4), 10).await.unwrap()[0].payload.as_ref(), b"o4");
    // Reading a dead-letter queue that does not exist creates nothing.
    assert!(matches!(inspector.dead_letters("nothing.dlq", 5).await, Err(Error::NoSuchQueue { .. })));
    drop((held, js));
    a.shutdown().await.unwrap();

    // Past the delayed message's due time on the inspector's clock: a broker would fire it.
    clock.advance(Duration::from_secs(120));
    let before = revision(&cluster).await;
    let options = rockq::Options::new().clock(clock.clone());
    let late =
        rockq::Inspector::connect_etcd(cluster.endpoints(), "seen", EtcdOptions::new().options(options))
            .await
            .unwrap();
    for _ in 0..3 {
        assert_eq!(late.stats().await.unwrap().queues.iter().find(|q| q.name == "orders").unwrap().len, 4);
        assert_eq!(late.delayed(None, 10).await.unwrap().len(), 1, "not fired by an inspection");
        late.pending("jobs", "workers").await.unwrap();
    }
    assert_eq!(revision(&cluster).await, before, "an inspection wrote something");
    drop((late, inspector));
    // The control: a broker on the same clock fires it.
    let b = connect_clock(&cluster, "seen", &clock).await;
    let q = b.queue("orders").await.unwrap();
    let mut sub = q.group("g").unwrap().start_from(rockq::StartFrom::Sequence(5)).subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"later");
    drop(sub);
    b.shutdown().await.unwrap();

    // A namespace that does not exist: refused, and still not there.
    let before = revision(&cluster).await;
    match rockq::Inspector::connect_etcd(cluster.endpoints(), "absent", EtcdOptions::new()).await {
        Err(Error::NoDatabase { path }) => assert!(path.display().to_string().contains("absent"), "{path:?}"),
        other => panic!("expected NoDatabase, got {other:?}"),
    }
    let opts = rockq::Options::new().create_if_missing(false);
    match Broker::connect_etcd(cluster.endpoints(), "absent", EtcdOptions::new().options(opts)).await {
        Err(Error::NoDatabase { .. }) => {}
        other => panic!("expected NoDatabase, got {:?}", other.map(|_| ())),
    }
    assert_eq!(revision(&cluster).await, before, "nothing was created");
}

/// An ordered and a work subscription of groups another broker deleted end with
/// `GroupDeleted` — after what they had read ahead before their watch brought the deletion
/// (`docs/DISTRIBUTED.md`, a difference) — and a job still held fails to settle with it.
async fn end_deleted(ordered: &mut Subscription, jobs: &mut rockq::WorkSubscription, held: rockq::Job) {
    async fn ends<T>(what: &str, mut next: impl AsyncFnMut() -> Option<Result<T, Error>>) {
        // Held, not dropped: a delivery dropped unacknowledged comes back.
        let mut out = Vec::new();
        for _ in 0..16 {
            match tokio::time::timeout(HANG_GUARD, next()).await.expect("the hang guard") {
                Some(Ok(d)) => out.push(d),
                Some(Err(Error::GroupDeleted { .. })) => return,
                Some(Err(e)) => panic!("{what}: {e}"),
                None => panic!("{what}: ended without an error"),
            }
        }
        panic!("{what}: more deliveries than it had read ahead");
    }
    ends("ordered", async || ordered.next().await).await;
    ends("work", async || jobs.next().await).await;
    assert!(matches!(held.ack_durable().await, Err(Error::GroupDeleted { .. })));
}

/// Keys of the namespace `ns` under `kind` (`o/`, `c/`…).
async fn keys_under(cluster: &etcd::Cluster, ns: &str, kind: &str) -> i64 {
    let mut client = cluster.client().await;
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    client.get(format!("{ns}/{kind}"), Some(opts)).await.unwrap().count()
}

/// A group deleted by one broker ends the other broker's subscriptions of it (ordered, work
/// queue) with `GroupDeleted`, its jobs still out fail to settle with it, nothing of the group
/// is left in etcd — not even what the other broker acknowledged and was about to commit — and
/// a later subscribe creates the group anew from its start, in either broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_deleted_by_one_broker_ends_it_in_every_broker_and_a_subscribe_makes_it_anew() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "del").await, connect(&cluster, "del").await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=5).map(|i| format!("m{i}"))).await.unwrap();
    let qb = b.queue("q").await.unwrap();
    let mut ordered = qb.group("o").unwrap().subscribe().await.unwrap();
    for _ in 0..2 {
        next(&mut ordered).await.ack().unwrap();
    }
    ordered.commit().await.unwrap();
    let mut stays = qb.group("stays").unwrap().subscribe().await.unwrap();
    let mut jobs = qb.work_group("w").unwrap().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    let held = common::next_job(&mut jobs).await;
    b.pause_group("q", "w").await.unwrap();
    // Acknowledged here, not yet committed: the deletion must not be undone by the commit.
    next(&mut ordered).await.ack().unwrap();

    assert!(a.delete_group("q", "o").await.unwrap());
    assert!(a.delete_group("q", "w").await.unwrap());
    end_deleted(&mut ordered, &mut jobs, held).await;
    assert!(!a.delete_group("q", "o").await.unwrap(), "already gone");
    assert!(!b.delete_group("q", "never").await.unwrap());
    assert!(!b.delete_group("no-such-queue", "o").await.unwrap());
    drop((ordered, jobs));
    b.flush().await.unwrap();
    // Nothing of either group is left; the other group and the queue are untouched.
    for kind in
        ["o/consumer:o:", "o/consumer:w:", "own/consumer:o:", "k/ordered:o:", "c/claim:w:", "g/group:w:"]
    {
        assert_eq!(keys_under(&cluster, "del", kind).await, 0, "{kind}");
    }
    let groups: Vec<String> =
        a.stats().await.unwrap().groups.into_iter().filter(|g| g.queue == "q").map(|g| g.group).collect();
    assert_eq!(groups, ["stays"]);
    assert_eq!(next(&mut stays).await.seq(), 1);
    assert_eq!(qa.len(), 5);

    // Anew, from the start, in either broker: no offset, no claim, no pause carried over.
    let mut again = subscribe_when_free(&qa.group("o").unwrap()).await;
    assert_eq!(next(&mut again).await.seq(), 1, "its old offset is gone");
    let mut again_w = qb.work_group("w").unwrap().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    assert!(!qb.work_group("w").unwrap().is_paused(), "its settings are gone");
    let job = common::next_job(&mut again_w).await;
    assert_eq!((job.seq(), job.attempt()), (1, 1), "its claims are gone");
    job.ack_durable().await.unwrap();
    drop((again, again_w, stays));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A queue deleted by one broker: nothing of it is left in etcd (messages, tail, groups,
/// claims, delayed messages, idempotency keys); the other broker's subscriptions of its groups
/// end with `GroupDeleted` and its old handle refuses sends with `QueueDeleted` — also a send
/// its writer had before it heard (refused by etcd, then answered as deleted, nothing written);
/// the name makes a new, empty queue with a new id in either broker; deleting again is `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_by_one_broker_is_gone_everywhere_and_its_name_makes_a_new_queue() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "delq").await, connect(&cluster, "delq").await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=5).map(|i| format!("m{i}"))).await.unwrap();
    qa.submit(Message::new("dup").idempotency_key("k1")).await.unwrap();
    qa.submit(Message::new("later").deliver_after(Duration::from_secs(3600))).await.unwrap();
    let other = a.queue("other").await.unwrap();
    other.send("stays").await.unwrap();
    let qb = b.queue("q").await.unwrap();
    let mut ordered = qb.group("o").unwrap().subscribe().await.unwrap();
    next(&mut ordered).await.ack().unwrap();
    ordered.commit().await.unwrap();
    let mut jobs = qb.work_group("w").unwrap().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    let held = common::next_job(&mut jobs).await;
    b.pause_group("q", "w").await.unwrap();
    let old_id = a.stats().await.unwrap().queues.iter().find(|s| s.name == "q").map(|s| s.name.clone());
    assert!(old_id.is_some());

    assert!(a.delete_queue("q").await.unwrap());
    assert!(a.get_queue("q").is_none(), "forgotten by the deleting broker at once");
    end_deleted(&mut ordered, &mut jobs, held).await;
    // The other broker learns it from its namespace watch, without writing anything.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while b.get_queue("q").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the deletion never reached the other broker");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(matches!(qb.send("late").await, Err(Error::QueueDeleted { .. })));
    assert!(matches!(qa.send("late").await, Err(Error::QueueDeleted { .. })));
    assert!(!a.delete_queue("q").await.unwrap(), "already gone");
    assert!(!b.delete_queue("never").await.unwrap());
    drop((ordered, jobs));
    b.flush().await.unwrap();

    // Nothing of it is left but what belongs to others (the other queue's record and tail,
    // the due index entry the firing drops).
    for kind in ["q/q", "o/", "own/", "k/", "c/", "g/", "j/", "x/", "d/", "p/"] {
        assert_eq!(keys_under(&cluster, "delq", kind).await, 0, "{kind}");
    }
    assert_eq!(keys_under(&cluster, "delq", "m/").await, 1, "only the other queue's message");
    assert_eq!(keys_under(&cluster, "delq", "t/").await, 1, "only the other queue's tail");
    let names: Vec<String> = a.stats().await.unwrap().queues.into_iter().map(|q| q.name).collect();
    assert_eq!(names, ["other"]);

    // The name makes a new, empty queue, in either broker; the old handles stay refused.
    let fresh = b.queue("q").await.unwrap();
    assert_eq!(fresh.len(), 0);
    assert_eq!(fresh.send("new").await.unwrap(), 1, "a new queue: sequences from 1");
    let seen = a.queue("q").await.unwrap();
    // (Its tail reaches this broker through the watch.)
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while seen.last_seq() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new queue's send never reached the other broker"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(seen.last_seq(), 1);
    assert!(matches!(qb.send("late").await, Err(Error::QueueDeleted { .. })));
    let mut sub = seen.group("o").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"new", "a new group: no offset carried over");
    drop(sub);
    assert_eq!(other.len(), 1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Adds one to `key` of `kv` `n` times, each by a compare-and-set on the revision it read (a
/// conflict, another writer first: read again).
async fn increment(kv: rockq::Keyspace, key: &'static str, n: u32) {
    for _ in 0..n {
        loop {
            let current = kv.get(key).await.unwrap();
            let value: u32 =
                current.as_ref().map_or(0, |e| std::str::from_utf8(&e.value).unwrap().parse().unwrap());
            let expect = rockq::Expect::from_read(current.as_ref());
            match kv.compare_and_set(key, expect, Some((value + 1).to_string())).await {
                Ok(_) => break,
                Err(e) if e.is_conflict() => continue,
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}

/// Keyspaces across processes: one made by a broker is found by the other (by name at once,
/// listed once its watch brings it); reads see the other's writes at etcd's revisions;
/// compare-and-set fences both (increments from two brokers each count once); what one etcd
/// transaction cannot hold, and a transaction that also sends, are refused whole; large
/// values scan across answers; `stats` counts what etcd holds, whoever wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspaces_are_shared_by_every_broker_and_fenced_by_etcd_revisions() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "kv").await, connect(&cluster, "kv").await);
    let ka = a.kv("counters").await.unwrap();
    let until = tokio::time::Instant::now() + HANG_GUARD;
    while b.get_kv("counters").is_none() {
        assert!(tokio::time::Instant::now() < until, "the other broker never learnt the keyspace");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.kv_names(), ["counters"]);
    let kb = b.kv("counters").await.unwrap();
    let r1 = ka.put("x", "1").await.unwrap();
    let seen = kb.get("x").await.unwrap().unwrap();
    assert_eq!((seen.value.as_ref(), seen.revision), (&b"1"[..], r1));
    let r2 = kb.put("x", "2").await.unwrap();
    assert!(r2 > r1);
    let stale = ka.compare_and_set("x", rockq::Expect::Revision(r1), Some("3")).await.unwrap_err();
    assert!(matches!(&stale, Error::Conflict { found: Some(f), .. } if *f == r2), "{stale:?}");
    assert!(matches!(
        kb.compare_and_set("x", rockq::Expect::Absent, Some("4")).await,
        Err(Error::Conflict { found: Some(_), .. })
    ));
    kb.delete("x").await.unwrap();
    assert_eq!(ka.get("x").await.unwrap(), None);
    // Deleted and written again: a revision read before never holds again (no ABA).
    let r3 = ka.put("x", "5").await.unwrap();
    assert!(matches!(
        kb.compare_and_set("x", rockq::Expect::Revision(r2), Some("6")).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(kb.get("x").await.unwrap().unwrap().revision, r3);

    // Three tasks in each broker, 15 increments each: 90, none lost, none twice.
    let tasks: Vec<_> = (0..3)
        .flat_map(|_| {
            [tokio::spawn(increment(ka.clone(), "hits", 15)), tokio::spawn(increment(kb.clone(), "hits", 15))]
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(HANG_GUARD, t).await.expect("increments hung").unwrap();
    }
    assert_eq!(ka.get("hits").await.unwrap().unwrap().value.as_ref(), b"90");

    // A transaction's writes and conditions are one etcd transaction: a failed condition
    // writes nothing.
    let hits = ka.get("hits").await.unwrap().unwrap();
    let mut tx = a.transaction();
    tx.put(&ka, "side", "1").unwrap();
    tx.expect(&ka, "hits", rockq::Expect::Revision(hits.revision - 1)).unwrap();
    assert!(tx.commit().await.unwrap_err().is_conflict());
    assert_eq!(kb.get("side").await.unwrap(), None);
    let mut tx = b.transaction();
    tx.put(&kb, "side", "1").unwrap();
    tx.put(&kb, "side", "2").unwrap(); // the last write of a key wins
    tx.delete(&kb, "gone").unwrap();
    tx.expect(&kb, "hits", rockq::Expect::Revision(hits.revision)).unwrap();
    let rev = tx.commit().await.unwrap().revision().unwrap();
    let side = ka.get("side").await.unwrap().unwrap();
    assert_eq!((side.value.as_ref(), side.revision), (&b"2"[..], rev));

    // Beyond what one etcd transaction holds (128 operations): refused whole.
    let mut tx = a.transaction();
    for i in 0..200 {
        tx.put(&ka, format!("many/{i:03}"), "v").unwrap();
    }
    assert!(matches!(tx.commit().await, Err(Error::Unsupported(_))));
    assert_eq!(ka.prefix("many/").count().await, 0);
    // An ordered delivery's ack, a keyed send and a write: one transaction, the group's
    // offset committed before it is answered (read by the other broker).
    let q = a.queue("q").await.unwrap();
    q.send("m").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    let mut tx = a.transaction();
    tx.put(&ka, "with-ack", "1").unwrap();
    tx.send(&q, Message::new("m2").idempotency_key("k")).unwrap();
    tx.ack(d);
    let done = tx.commit().await.unwrap();
    assert_eq!(done.sent(), [rockq::Sent::Appended(2)]);
    assert_eq!(kb.get("with-ack").await.unwrap().unwrap().revision, done.revision().unwrap());
    let groups = b.stats().await.unwrap().groups;
    assert_eq!(groups.iter().map(|g| (g.group.as_str(), g.committed)).collect::<Vec<_>>(), [("g", 1)]);
    assert_eq!(next(&mut sub).await.seq(), 2);
    drop(sub);
    ka.delete("with-ack").await.unwrap();

    // Values of 900 KiB: a page of them is larger than one etcd answer (4 MiB); a scan reads
    // them in as many answers as it takes, in order.
    let large = vec![7u8; 900 << 10];
    let blobs = b.kv("blobs").await.unwrap();
    for i in 0..6 {
        blobs.put(format!("b{i}"), large.clone()).await.unwrap();
    }
    let read: Vec<rockq::Entry> =
        futures::TryStreamExt::try_collect(blobs.scan::<&[u8], _>(..)).await.unwrap();
    assert_eq!(
        read.iter().map(|e| e.key.to_vec()).collect::<Vec<_>>(),
        (0..6).map(|i| format!("b{i}").into_bytes()).collect::<Vec<_>>()
    );
    assert!(read.iter().all(|e| e.value.len() == large.len()));

    // Counts: etcd's, whoever wrote.
    let counts = |s: rockq::Stats| s.keyspaces.into_iter().map(|k| (k.name, k.keys)).collect::<Vec<_>>();
    let expected = vec![("blobs".to_owned(), 6), ("counters".to_owned(), 3)];
    assert_eq!(counts(a.stats().await.unwrap()), expected);
    assert_eq!(counts(b.stats().await.unwrap()), expected);
    assert_eq!((ka.len(), kb.len()), (3, 3), "set from etcd by stats");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    // Reconnected: every keyspace and entry is there.
    let c = connect(&cluster, "kv").await;
    assert_eq!(c.kv_names().len(), 2);
    let kc = c.get_kv("counters").expect("loaded at connect");
    assert_eq!((kc.len(), kc.get("hits").await.unwrap().unwrap().value.as_ref()), (3, &b"90"[..]));
    c.shutdown().await.unwrap();
}

/// Transactions from two brokers send with idempotency keys and delays: each key is recorded
/// once across brokers (the others' sends are duplicates naming it, their keyspace writes
/// applied all the same), a delayed send is written with the rest and fired once by whichever
/// broker's timer gets it, and a key named by a plain submit elsewhere makes a transaction's
/// send a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_in_two_brokers_record_each_key_once_and_their_delayed_sends_fire_once() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = rockq::ManualClock::new();
    let brokers =
        [connect_clock(&cluster, "txsend", &clock).await, connect_clock(&cluster, "txsend", &clock).await];
    let mut parts = Vec::new();
    for b in &brokers {
        parts.push((b.clone(), b.queue("invoices").await.unwrap(), b.kv("ledger").await.unwrap()));
    }
    // A key a plain submit recorded before: a transaction's send with it is a duplicate.
    let first = parts[1].1.submit(Message::new("plain").idempotency_key("order-0")).await.unwrap();
    assert_eq!(first, rockq::Sent::Appended(1));
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(24));
    let mut tasks = Vec::new();
    for i in 0..24usize {
        let (b, q, kv) = parts[i % 2].clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut tx = b.transaction();
            tx.put(&kv, format!("t{i:02}"), "1").unwrap();
            tx.send(&q, Message::new(format!("inv {i}")).idempotency_key(format!("order-{}", i % 4)))
                .unwrap();
            let later = Message::new(format!("late {i}")).idempotency_key(format!("late-{}", i % 3));
            tx.send(&q, later.deliver_after(Duration::from_secs(10) + Duration::from_millis(i as u64)))
                .unwrap();
            // No conflict can refuse it (no conditions): a racing tail or key is sent again.
            tx.commit().await.unwrap_or_else(|e| panic!("transaction {i}: {e}")).sent().to_vec()
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(tokio::time::timeout(HANG_GUARD, t).await.expect("transactions hung").unwrap());
    }
    // order-0 was the plain submit's; order-1..3 each appended by exactly one transaction.
    let mut appended = std::collections::BTreeMap::new();
    let mut scheduled = std::collections::BTreeMap::new();
    for (i, sent) in outcomes.iter().enumerate() {
        assert_eq!(sent.len(), 2, "{sent:?}");
        if let rockq::Sent::Appended(s) = sent[0] {
            assert!(appended.insert(i % 4, s).is_none(), "order-{} appended twice: {outcomes:?}", i % 4);
        }
        if let rockq::Sent::Scheduled(m) = sent[1] {
            assert!(scheduled.insert(i % 3, m.id).is_none(), "late-{} scheduled twice: {outcomes:?}", i % 3);
        }
    }
    assert_eq!(appended.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3], "{outcomes:?}");
    assert_eq!(
        appended.values().copied().collect::<BTreeSet<u64>>(),
        (2..=4).collect(),
        "dense after the submit"
    );
    assert_eq!(scheduled.len(), 3, "{outcomes:?}");
    for (i, sent) in outcomes.iter().enumerate() {
        let original = if i % 4 == 0 { 1 } else { appended[&(i % 4)] };
        assert_eq!(sent[0].seq(), Some(original), "transaction {i}'s send names its key's message");
        match sent[1] {
            rockq::Sent::Scheduled(m) => assert_eq!(m.id, scheduled[&(i % 3)]),
            rockq::Sent::Duplicate(rockq::Original::Scheduled(id)) => assert_eq!(id, scheduled[&(i % 3)]),
            other => panic!("transaction {i}'s delayed send: {other:?}"),
        }
    }
    // Every transaction's keyspace write applied, duplicates or not.
    let ledger = parts[0].2.prefix("t").count().await;
    assert_eq!(ledger, 24);
    assert_eq!(brokers[0].peek("invoices", None, 100).await.unwrap().len(), 4, "duplicates wrote nothing");
    assert_eq!(brokers[1].delayed(Some("invoices"), 100).await.unwrap().len(), 3);

    // Both timers run when the clock passes the delayed sends: each fires once.
    let mut sub = parts[1].1.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(30));
    let mut late = Vec::new();
    for seq in 1..=7 {
        let d = next(&mut sub).await;
        assert_eq!(d.seq(), seq);
        if seq > 4 {
            late.push(String::from_utf8(d.payload().to_vec()).unwrap());
        }
        d.ack().unwrap();
    }
    assert!(late.iter().all(|p| p.starts_with("late ")), "{late:?}");
    common::assert_next_is_sentinel(&parts[1].1, &mut sub).await;
    assert!(brokers[0].delayed(None, 10).await.unwrap().is_empty());
    drop((sub, parts));
    for b in brokers {
        b.shutdown().await.unwrap();
    }
}

/// The exactly-once pipeline across processes: worker pools in two brokers take jobs of one
/// work group, and each handler's transaction — a read-modify-write of an account's balance
/// (`get_for_update`), an invoice sent, the job's ack — is one etcd transaction. Concurrent
/// updates of one account conflict (across brokers too) and the job runs again; every order
/// is charged once and invoiced once, none lost, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_in_two_brokers_apply_each_jobs_transaction_exactly_once() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "pipeline").await, connect(&cluster, "pipeline").await);
    let orders = a.queue("orders").await.unwrap();
    const ORDERS: u32 = 40;
    for i in 0..ORDERS {
        orders.send(Message::new(format!("{}", i % 7 + 1)).key(format!("acct-{}", i % 3))).await.unwrap();
    }
    let pool = |broker: &Broker| {
        let broker = broker.clone();
        async move {
            let orders = broker.queue("orders").await.unwrap();
            let invoices = broker.queue("invoices").await.unwrap();
            let balances = broker.kv("balances").await.unwrap();
            let group = orders.work_group("billing").unwrap().retry_policy(
                rockq::RetryPolicy::default()
                    .max_attempts(1000)
                    .backoff(Duration::from_millis(1), Duration::from_millis(5)),
            );
            group.workers(4).spawn(move |task: rockq::Task| {
                let (inv, bal) = (invoices.clone(), balances.clone());
                async move {
                    let tx = task.tx();
                    let account = task.key().unwrap().to_owned();
                    let cur = tx.get_for_update(&bal, &account).await?;
                    let n: u64 = cur.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap());
                    let amount: u64 = String::from_utf8_lossy(task.payload()).parse().unwrap();
                    tx.put(&bal, &account, (n + amount).to_string())?;
                    tx.send(&inv, format!("order {} charged {amount}", task.seq()))?;
                    Ok::<_, rockq::HandlerError>(())
                }
            })
        }
    };
    let (pa, pb) = (pool(&a).await, pool(&b).await);
    let committed =
        |s: rockq::Stats| s.groups.iter().find(|g| g.group == "billing").map_or(0, |g| g.committed);
    tokio::time::timeout(HANG_GUARD, async {
        while committed(a.stats().await.unwrap()) < u64::from(ORDERS) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the pools drain the orders");
    let (ra, rb) = (pa.shutdown().await.unwrap(), pb.shutdown().await.unwrap());
    let balances = b.kv("balances").await.unwrap();
    let mut expected = [0u64; 3];
    for i in 0..ORDERS {
        expected[(i % 3) as usize] += u64::from(i % 7 + 1);
    }
    for (acct, want) in expected.iter().enumerate() {
        let got = balances.get(format!("acct-{acct}")).await.unwrap().unwrap();
        assert_eq!(std::str::from_utf8(&got.value).unwrap(), want.to_string(), "account {acct}");
    }
    // One invoice per order, whichever broker ran it: conflicted attempts sent nothing.
    let invoices = b.peek("invoices", None, 1000).await.unwrap();
    let mut invoiced: Vec<u64> = invoices
        .iter()
        .map(|m| std::str::from_utf8(&m.payload).unwrap().split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    invoiced.sort_unstable();
    assert_eq!(invoiced, (1..=u64::from(ORDERS)).collect::<Vec<_>>());
    assert!(ra.acked + rb.acked == u64::from(ORDERS), "{ra:?} {rb:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A transaction is fenced by its jobs' claims across processes: a broker whose lease ran out
/// on another broker's clock (that one claimed the job since) commits nothing — not its
/// keyspace write, not its send — and is told `LeaseLost`; the job is the other's to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_acking_a_job_another_broker_took_since_applies_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let (clock_a, clock_b) = (rockq::ManualClock::new(), rockq::ManualClock::new());
    let a = connect_clock(&cluster, "fenced-tx", &clock_a).await;
    let b = connect_clock(&cluster, "fenced-tx", &clock_b).await;
    let jobs = a.queue("jobs").await.unwrap();
    jobs.send("j1").await.unwrap();
    let group = |broker: &Broker| {
        let broker = broker.clone();
        async move {
            let q = broker.queue("jobs").await.unwrap();
            q.work_group("w").unwrap().lease(Duration::from_secs(5)).read_batch(1).max_in_flight(1)
        }
    };
    let mut ja = group(&a).await.subscribe().await.unwrap();
    let held = common::next_job(&mut ja).await;
    // On b's clock the lease has run out: b claims the job (a's clock has not moved).
    clock_b.advance(Duration::from_secs(10));
    let mut jb = group(&b).await.subscribe().await.unwrap();
    let taken = common::next_job(&mut jb).await;
    assert_eq!((taken.seq(), taken.attempt()), (1, 2));

    let (kv, out) = (a.kv("state").await.unwrap(), a.queue("out").await.unwrap());
    let mut tx = a.transaction();
    tx.put(&kv, "j1", "done by a").unwrap();
    tx.send(&out, "from a").unwrap();
    tx.ack_job(held);
    let refused = tx.commit().await.unwrap_err();
    assert!(matches!(refused, Error::LeaseLost { seq: 1, .. }), "{refused:?}");
    assert_eq!(kv.get("j1").await.unwrap(), None, "nothing of the transaction applied");
    assert_eq!(b.peek("out", None, 10).await.unwrap().len(), 0);
    // b finishes it, with its own transaction.
    let (kb, outb) = (b.kv("state").await.unwrap(), b.queue("out").await.unwrap());
    let mut tx = b.transaction();
    tx.put(&kb, "j1", "done by b").unwrap();
    tx.send(&outb, "from b").unwrap();
    tx.ack_job(taken);
    tx.commit().await.unwrap();
    assert_eq!(kv.get("j1").await.unwrap().unwrap().value.as_ref(), b"done by b");
    let out: Vec<_> = a.peek("out", None, 10).await.unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(out, [rockq::Bytes::from_static(b"from b")]);
    drop((ja, jb));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
