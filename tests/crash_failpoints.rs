//! Fault injection (`cargo test --features failpoints --test crash_failpoints`): a storage error at each
//! write point surfaces as an `Err` to the caller, nothing is half-applied, the broker fails
//! closed with a clear error, and a reopen recovers with every acknowledged write intact.
//! Failpoints are process-global, so the scenarios run one after another in one test.
#![cfg(feature = "failpoints")]

mod common;

use common::*;
use futures::StreamExt;
use rockq::{Durability, Error};

async fn write_error_fails_the_call_and_the_broker_closed_then_reopen_recovers() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch(["a", "b"]).await.unwrap();
        fail::cfg("rockq-writer-write", "return").unwrap();
        assert!(matches!(q.send_batch(["c", "d"]).await, Err(Error::Storage(_))));
        fail::remove("rockq-writer-write");
        // Fail closed: the writer accepts nothing after a write error, with a clear reason.
        assert!(matches!(q.send("e").await, Err(Error::Failed(_))));
        assert!(matches!(broker.queue("other").await, Err(Error::Failed(_))));
        let _ = broker.shutdown().await;
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.last_seq(), 2, "the failed batch left nothing behind");
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut sub, 2).await), ["a", "b"]);
    assert_eq!(q.send("c").await.unwrap(), 3, "writes work again after reopening; no sequence lost");
    broker.shutdown().await.unwrap();
}

/// Regression (review of issue 17): `Delivery::ack_durable` waited forever once the broker
/// failed closed, as no offset becomes durable after a write error.
async fn ack_durable_ends_when_the_broker_fails_closed() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let (a, b) = (next(&mut sub).await, next(&mut sub).await);
    // Waiting on `a`, still out: the offset cannot cover `b` yet.
    let waiting = tokio::spawn(b.ack_durable());
    fail::cfg("rockq-writer-write", "return").unwrap();
    assert!(matches!(q.send("x").await, Err(Error::Storage(_))));
    fail::remove("rockq-writer-write");
    let res =
        tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await.expect("ack_durable hung");
    assert!(matches!(res.unwrap(), Err(Error::Failed(_))));
    drop(a);
    let _ = broker.shutdown().await;
}

async fn sync_error_under_fsync_fails_the_send() {
    let dir = tempdir();
    {
        let broker = open_with(dir.path(), Durability::Fsync).await;
        let q = broker.queue("q").await.unwrap();
        q.send("durable").await.unwrap();
        fail::cfg("rockq-syncer-sync", "return").unwrap();
        assert!(matches!(q.send("unsynced").await, Err(Error::Storage(_))));
        fail::remove("rockq-syncer-sync");
        assert!(matches!(q.send("after").await, Err(Error::Failed(_))));
        let _ = broker.shutdown().await;
    }
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    // The send that failed its sync may or may not be present (documented); the one that
    // resolved Ok is.
    assert!(q.last_seq() >= 1);
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"durable");
    broker.shutdown().await.unwrap();
}

async fn failed_outcome_write_leaves_the_claim_for_redelivery() {
    let dir = tempdir();
    let seq;
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        seq = q.send("job").await.unwrap();
        let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
        let job = next_job(&mut sub).await;
        fail::cfg("rockq-writer-write", "return").unwrap();
        assert!(matches!(job.ack_durable().await, Err(Error::Storage(_))));
        fail::remove("rockq-writer-write");
        let _ = broker.shutdown().await;
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    assert_eq!((job.seq(), job.attempt()), (seq, 2), "at-least-once: redelivered, attempt kept");
    job.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

async fn read_error_ends_the_stream_with_an_error() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send("x").await.unwrap();
    fail::cfg("rockq-read", "return").unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let item = tokio::time::timeout(HANG_GUARD, sub.next()).await.unwrap();
    fail::remove("rockq-read");
    assert!(matches!(item, Some(Err(Error::Storage(_)))), "{item:?}");
    assert!(sub.next().await.is_none());
    drop(sub);
    // Nothing was acknowledged: a new subscription gets the message.
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"x");
    broker.shutdown().await.unwrap();
}

/// `enqueue` returns once the message is queued; only its receipt waits for the sync.
async fn enqueue_returns_before_the_sync_and_the_receipt_after_it() {
    let dir = tempdir();
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    fail::cfg("rockq-syncer-sync", "pause").unwrap();
    let mut receipts = Vec::new();
    for i in 0..5 {
        // A hang guard, not a timing assertion: if `enqueue` waited for the held sync, the
        // test would never end.
        let enqueued = tokio::time::timeout(std::time::Duration::from_secs(60), q.enqueue(format!("m{i}")));
        receipts.push(enqueued.await.expect("enqueue waited for the sync").unwrap());
    }
    for r in &mut receipts {
        assert!(futures::poll!(r).is_pending(), "a receipt resolved before its sync");
    }
    assert_eq!(q.last_seq(), 0, "nothing is visible before its sync");
    fail::remove("rockq-syncer-sync");
    let seqs = futures::future::try_join_all(receipts).await.unwrap();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(q.last_seq(), 5);
    broker.shutdown().await.unwrap();
}

/// Opens a broker with `options` and queue "q" plus `more`, sends one message to "q" and
/// holds the writer inside the write of it until the returned sender is used (or dropped).
/// Returns once the writer is held, with the queues and the held message's receipt. (Nothing
/// that goes through the writer — creating a queue, say — completes while it is held.)
async fn held_writer(
    path: &std::path::Path,
    options: rockq::Options,
    more: &[&str],
) -> (rockq::Broker, Vec<rockq::Queue>, rockq::SendReceipt, std::sync::mpsc::Sender<()>) {
    let broker = options.retention_interval(std::time::Duration::ZERO).open(path).await.unwrap();
    let mut queues = vec![broker.queue("q").await.unwrap()];
    for name in more {
        queues.push(broker.queue(name).await.unwrap());
    }
    let (held, release) = hold_writer(&queues[0]).await;
    (broker, queues, held, release)
}

/// Sends one message to `q` and holds the writer inside the write of it until the returned
/// sender is used (or dropped); returns once the writer is held. Requests sent meanwhile wait
/// in the channel and all go into the round after the held one.
async fn hold_writer(q: &rockq::Queue) -> (rockq::SendReceipt, std::sync::mpsc::Sender<()>) {
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let (reached_tx, release_rx) = (std::sync::Mutex::new(reached_tx), std::sync::Mutex::new(release_rx));
    fail::cfg_callback("rockq-writer-write", move || {
        let _ = reached_tx.lock().unwrap().send(());
        let _ = release_rx.lock().unwrap().recv();
    })
    .unwrap();
    let held = q.enqueue(vec![b'h'; 100]).await.unwrap();
    tokio::task::spawn_blocking(move || reached.recv_timeout(HANG_GUARD).expect("writer never wrote"))
        .await
        .unwrap();
    (held, release)
}

/// Lets a held writer go on (and stops holding later writes).
async fn release_writer(held: rockq::SendReceipt, release: std::sync::mpsc::Sender<()>) {
    fail::remove("rockq-writer-write");
    release.send(()).unwrap();
    held.await.unwrap();
}

/// Backpressure is exact: while the writer is busy, producers can stage `channel_capacity`
/// messages and the next `enqueue` waits for the writer to take them; then everything is
/// written in the order it was staged.
async fn enqueue_waits_while_channel_capacity_messages_are_staged() {
    let dir = tempdir();
    let (broker, queues, held, release) =
        held_writer(dir.path(), rockq::Options::new().channel_capacity(4), &[]).await;
    let q = &queues[0];
    let mut receipts = vec![held];
    // The writer holds the first message inside its write; its permit is back. Four more fit.
    for i in 1..=4 {
        let enqueued = tokio::time::timeout(HANG_GUARD, q.enqueue(format!("m{i}")));
        receipts.push(enqueued.await.expect("enqueue waited below the capacity").unwrap());
    }
    let mut fifth = Box::pin(q.enqueue("m5"));
    assert!(futures::poll!(&mut fifth).is_pending(), "a fifth staged message passed the capacity");
    for r in &mut receipts {
        assert!(futures::poll!(r).is_pending(), "resolved while the write is held");
    }
    fail::remove("rockq-writer-write");
    release.send(()).unwrap();
    receipts.push(tokio::time::timeout(HANG_GUARD, fifth).await.unwrap().unwrap());
    let seqs = futures::future::try_join_all(receipts).await.unwrap();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "written in the order staged");
    broker.shutdown().await.unwrap();
}

/// Regression (staged sends share one completion per round): if the writer thread dies with
/// sends staged or in hand, their receipts fail instead of waiting forever, and later sends
/// are refused.
async fn a_writer_panic_fails_pending_receipts_instead_of_hanging_them() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.send("before").await.unwrap(), 1);
    fail::cfg("rockq-writer-write", "panic").unwrap();
    let in_hand = tokio::time::timeout(HANG_GUARD, q.send("in hand")).await.expect("receipt hung");
    fail::remove("rockq-writer-write");
    assert!(matches!(in_hand, Err(Error::Shutdown | Error::Failed(_))), "{in_hand:?}");
    let after = tokio::time::timeout(HANG_GUARD, q.send("after")).await.expect("send hung");
    assert!(matches!(after, Err(Error::Failed(_))), "{after:?}");
    assert!(matches!(broker.shutdown().await, Err(rockq::Error::WriterPanicked)));
}

/// Regression (the inbox): shutdown used to write everything still staged in one final
/// WriteBatch, however far past `max_batch_bytes`. It writes them in capped rounds first.
async fn shutdown_writes_a_staged_backlog_in_capped_rounds() {
    let dir = tempdir();
    let (broker, queues, held, release) =
        held_writer(dir.path(), rockq::Options::new().max_batch_bytes(1024), &[]).await;
    let q = &queues[0];
    let mut receipts = vec![held];
    // 40 sends of 100 B staged behind the held write: about 4 KiB, four times the cap.
    for i in 0..40u8 {
        receipts.push(q.enqueue(vec![i; 100]).await.unwrap());
    }
    let rounds_before = broker.writer_stats().rounds;
    let shutdown = tokio::spawn({
        let broker = broker.clone();
        async move { broker.shutdown().await }
    });
    fail::remove("rockq-writer-write");
    release.send(()).unwrap();
    tokio::time::timeout(HANG_GUARD, shutdown).await.unwrap().unwrap().unwrap();
    let seqs = futures::future::try_join_all(receipts).await.unwrap();
    assert_eq!(seqs, (1..=41).collect::<Vec<u64>>());
    let rounds = broker.writer_stats().rounds - rounds_before;
    assert!(rounds >= 4, "41 messages of ~110 B under a 1 KiB cap took {rounds} rounds");
    let broker = open(dir.path()).await;
    assert_eq!(broker.queue("q").await.unwrap().last_seq(), 41);
    broker.shutdown().await.unwrap();
}

/// One staged round holding sends to several queues (and a batch among them) gives each queue
/// its own dense sequences, in staging order. The held write makes the mixed round certain.
async fn a_round_mixing_queues_gives_each_queue_dense_sequences() {
    let dir = tempdir();
    let (broker, queues, held, release) = held_writer(dir.path(), rockq::Options::new(), &["b"]).await;
    let (a, b) = (&queues[0], &queues[1]);
    let mut receipts = Vec::new();
    for i in 0..10 {
        receipts.push(("q", a.enqueue(format!("a{i}")).await.unwrap()));
        receipts.push(("b", b.enqueue(format!("b{i}")).await.unwrap()));
    }
    let batch = tokio::spawn({
        let b = b.clone();
        async move { b.send_batch(["x", "y", "z"]).await }
    });
    let tail = b.enqueue("b-last");
    fail::remove("rockq-writer-write");
    release.send(()).unwrap();
    assert_eq!(held.await.unwrap(), 1);
    let mut next = std::collections::HashMap::from([("q", 2u64), ("b", 1u64)]);
    for (queue, r) in receipts {
        let n = next.get_mut(queue).unwrap();
        assert_eq!(r.await.unwrap(), *n, "queue {queue}");
        *n += 1;
    }
    let tail = tail.await.unwrap().await.unwrap();
    let batch = batch.await.unwrap().unwrap();
    // The batch and the last send raced; both come after the ten, contiguous, without overlap.
    assert_eq!(batch.end() - batch.start(), 2);
    let mut after: Vec<u64> = batch.collect();
    after.push(tail);
    after.sort_unstable();
    assert_eq!(after, [11, 12, 13, 14]);
    assert_eq!((a.last_seq(), b.last_seq()), (11, 14));
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13): a reset was undone by a commit pending in the same round. The writer
/// applied `ResetOffset`, then its dirty-group loop wrote the old acknowledged offset to the
/// same key in the same batch: on disk the group resumed after its old acks.
async fn a_reset_wins_over_acks_not_yet_committed() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
        q.send_batch(["1", "2", "3", "4", "5"]).await.unwrap();
        let group = q.group("g").unwrap();
        let mut sub = group.subscribe().await.unwrap();
        let ds = take(&mut sub, 5).await;
        let (held, release) = hold_writer(&hold).await;
        for d in ds {
            d.ack().unwrap(); // dirty: committed by the writer's next round
        }
        drop(sub);
        let mut reset = Box::pin(group.reset_to(rockq::ResetTo::Sequence(1)));
        // One poll queues the reset behind the acks' wake-up: both land in the next round.
        assert!(futures::poll!(&mut reset).is_pending());
        release_writer(held, release).await;
        assert_eq!(reset.await.unwrap(), 1);
        assert_eq!(group.committed(), Some(0), "in memory");
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.group("g").unwrap().committed(), Some(0), "on disk");
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 1);
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13): `Group::reset_to` dropped after its request was queued freed the
/// group's active slot at once, so a new subscriber started from the old offset and the reset
/// then landed under it.
async fn a_dropped_reset_keeps_the_group_until_it_lands() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let group = q.group("g").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    for d in take(&mut sub, 3).await {
        d.ack().unwrap();
    }
    assert_eq!(sub.commit().await.unwrap(), 3);
    drop(sub);
    let (held, release) = hold_writer(&hold).await;
    let mut reset = Box::pin(group.reset_to(rockq::ResetTo::Sequence(2)));
    assert!(futures::poll!(&mut reset).is_pending());
    drop(reset);
    assert!(
        matches!(group.subscribe().await, Err(rockq::Error::Active { .. })),
        "the queued reset still holds the group"
    );
    release_writer(held, release).await;
    // The writer released the group once the reset was durable.
    let mut sub = tokio::time::timeout(HANG_GUARD, async {
        loop {
            match group.subscribe().await {
                Ok(s) => return s,
                Err(rockq::Error::Active { .. }) => tokio::task::yield_now().await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the group was never released");
    assert_eq!(next(&mut sub).await.seq(), 2, "the subscriber starts where the reset put it");
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13): acks a worker pool had queued when `WorkGroup::reset_to` ran were
/// applied after the reset, in the same round, moving the offset (or writing `Done` records)
/// above the reset offset.
async fn a_work_group_reset_wins_over_queued_pool_acks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
        q.send_batch(["1", "2", "3", "4", "5"]).await.unwrap();
        let group = q.work_group("w").unwrap();
        let (gate, started) = (Arc::new(tokio::sync::Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let token = rockq::CancellationToken::new();
        let pool = tokio::spawn({
            let (gate, started) = (gate.clone(), started.clone());
            group.workers(5).shutdown_on(token.clone()).run(move |_task: rockq::Task| {
                let (gate, started) = (gate.clone(), started.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    Ok(())
                }
            })
        });
        while started.load(Ordering::SeqCst) < 5 {
            tokio::task::yield_now().await;
        }
        let (held, release) = hold_writer(&hold).await;
        gate.add_permits(5); // the handlers return: five acks queued behind the held write
        token.cancel();
        // Once the pool has let go of its subscription and jobs, the reset is accepted and
        // queued (a single poll sends it); before that it is refused as active.
        let mut reset = loop {
            let mut reset = Box::pin(group.reset_to(rockq::ResetTo::Sequence(1)));
            match futures::poll!(&mut reset) {
                std::task::Poll::Pending => break reset,
                std::task::Poll::Ready(Err(rockq::Error::Active { .. })) => tokio::task::yield_now().await,
                std::task::Poll::Ready(other) => panic!("{other:?}"),
            }
        };
        release_writer(held, release).await;
        assert_eq!(reset.as_mut().await.unwrap(), 1);
        pool.await.unwrap().unwrap();
        assert_eq!(group.committed(), Some(0), "in memory");
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let group = q.work_group("w").unwrap();
    assert_eq!(group.committed(), Some(0), "on disk");
    let mut jobs = group.subscribe().await.unwrap();
    for seq in 1..=5 {
        let job = next_job(&mut jobs).await;
        assert_eq!((job.seq(), job.attempt()), (seq, 1), "redelivered as new: the reset dropped attempts");
        job.ack_durable().await.unwrap();
    }
    drop(jobs);
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13): an `UntilAcked` trim was computed from durable offsets and applied later
/// without a re-check, so a backwards reset or a new `Earliest` group in between lost
/// messages. The syncer is held, so the reset and the group creation are written but not yet
/// durable when the trim's cut is computed: the cut sees only the old offsets.
async fn an_until_acked_trim_is_clamped_to_offsets_changed_since_its_cut() {
    let dir = tempdir();
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    q.set_retention(rockq::Retention::UntilAcked).await.unwrap();
    q.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
    let (g1, g2) = (q.group("g1").unwrap(), q.group("g2").unwrap());
    let mut sub = g1.subscribe().await.unwrap();
    for d in take(&mut sub, 10).await {
        d.ack().unwrap();
    }
    assert_eq!(sub.commit().await.unwrap(), 10);
    drop(sub);

    fail::cfg("rockq-syncer-sync", "pause").unwrap();
    let mut reset = Box::pin(g1.reset_to(rockq::ResetTo::Sequence(1)));
    assert!(futures::poll!(&mut reset).is_pending(), "reset queued");
    let mut create = Box::pin(g2.subscribe());
    assert!(futures::poll!(&mut create).is_pending(), "new group queued");
    // The cut comes from durable offsets: g1 still at 10, g2 not registered yet.
    let trim = tokio::spawn({
        let broker = broker.clone();
        async move { broker.trim().await }
    });
    // Until the writer has applied the trim: a trim it lets through moves the first sequence
    // as it enters the batch; one clamped to nothing is answered at once.
    while !trim.is_finished() && q.first_seq() == 1 {
        tokio::task::yield_now().await;
    }
    fail::remove("rockq-syncer-sync");
    assert_eq!(reset.await.unwrap(), 1);
    let mut sub2 = create.await.unwrap();
    let report = trim.await.unwrap().unwrap();
    assert_eq!(report.deleted, 0, "clamped to the reset and the new group: {report:?}");
    assert_eq!(q.first_seq(), 1);
    assert_eq!(next(&mut sub2).await.seq(), 1, "the new Earliest group gets everything");
    drop(sub2);
    let mut sub1 = g1.subscribe().await.unwrap();
    assert_eq!(next(&mut sub1).await.seq(), 1, "the reset group replays from 1");
    drop(sub1);
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13): a subscription dropped while its claim loop waited on a full request
/// channel to dead-letter an exhausted message left that message `Settling` forever: never
/// finished, so the group's offset (and `UntilAcked` retention) never passed it again.
async fn a_dead_letter_abandoned_on_a_full_channel_is_retried() {
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = rockq::Options::new()
        .channel_capacity(1)
        .clock(clock.clone())
        .retention_interval(std::time::Duration::ZERO)
        .open(dir.path())
        .await
        .unwrap();
    let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
    q.send("poison").await.unwrap();
    let group = q
        .work_group("w")
        .unwrap()
        .lease(std::time::Duration::from_secs(10))
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1))
        .read_batch(1);
    let mut jobs = group.subscribe().await.unwrap();
    std::mem::forget(next_job(&mut jobs).await); // only its lease can end it
    let (held, release) = hold_writer(&hold).await;
    // One request fills the channel (capacity 1) behind the held write.
    let filler = tokio::spawn({
        let broker = broker.clone();
        async move { broker.queue("filler").await.map(|_| ()) }
    });
    clock.advance(std::time::Duration::from_secs(11));
    // The lease ran out on the only attempt: the next claim marks the message for the dead-
    // letter queue (it stops counting as leased) and blocks sending that to the full channel.
    while group.in_flight() > 0 {
        assert!(futures::poll!(jobs.next()).is_pending());
        tokio::task::yield_now().await;
    }
    drop(jobs); // abandons the dead letter before it was queued
    release_writer(held, release).await;
    filler.await.unwrap().unwrap();

    let mut jobs = group.subscribe().await.unwrap();
    let sentinel = q.send("sentinel").await.unwrap();
    let job = next_job(&mut jobs).await;
    assert_eq!(job.seq(), sentinel);
    job.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(sentinel), "the abandoned message was dead-lettered after all");
    assert_eq!(broker.dead_letters("q.dlq").await.unwrap().len().await.unwrap(), 1);
    drop(jobs);
    broker.shutdown().await.unwrap();
}

/// Fault (issue 13, found when ordered dead letters met resets): a reset the writer refused —
/// a trim applied between the caller's check and the reset's turn deleted its target — still
/// dropped the group's delivery records, so delivery counts were lost (and a dead-lettered
/// message above the offset would have been delivered again).
async fn a_refused_reset_keeps_the_delivery_records() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
    q.set_retention(rockq::Retention::MaxLen(1)).await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let group = q.group("g").unwrap().max_deliveries(5);
    let mut sub = group.subscribe().await.unwrap();
    let mut ds = take(&mut sub, 3).await;
    ds.pop().unwrap().nack(); // 3: one delivery came back, recorded
    for d in ds {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    assert_eq!(sub.commit().await.unwrap(), 2);
    drop(sub);

    let (held, release) = hold_writer(&hold).await;
    let (queued_tx, queued) = std::sync::mpsc::channel();
    let queued_tx = std::sync::Mutex::new(queued_tx);
    fail::cfg_callback("rockq-trim-queued", move || {
        let _ = queued_tx.lock().unwrap().send(());
    })
    .unwrap();
    // MaxLen(1) deletes 1 and 2; the trim is queued before the reset, which still sees 1.
    let trim = tokio::spawn({
        let broker = broker.clone();
        async move { broker.trim().await }
    });
    tokio::task::spawn_blocking(move || queued.recv_timeout(HANG_GUARD).expect("trim never queued"))
        .await
        .unwrap();
    fail::remove("rockq-trim-queued");
    let mut reset = Box::pin(group.reset_to(rockq::ResetTo::Sequence(1)));
    assert!(futures::poll!(&mut reset).is_pending(), "reset queued behind the trim");
    release_writer(held, release).await;
    assert!(matches!(reset.await, Err(rockq::Error::OutOfRange { first: 3, .. })), "refused at its turn");
    assert_eq!(trim.await.unwrap().unwrap().deleted, 2);
    assert_eq!(group.committed(), Some(2), "the offset did not move");
    let mut sub = group.subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.delivery_count()), (3, 2), "its delivery count survived the refusal");
    drop((d, sub));
    broker.shutdown().await.unwrap();
}

/// Fault (found by the model test): an ordered dead letter's round wrote the copy and its mark,
/// and the offset passed the message only in a later round; when none came (a shutdown's last
/// round), acks above it were lost, and those messages were delivered again after a clean
/// restart.
async fn an_ordered_dead_letter_and_the_offset_past_it_are_one_write() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let (q, hold) = (broker.queue("q").await.unwrap(), broker.queue("hold").await.unwrap());
        q.send_batch(["1", "2"]).await.unwrap();
        let mut sub = q.group("g").unwrap().max_deliveries(1).subscribe().await.unwrap();
        let mut ds = take(&mut sub, 2).await;
        ds.pop().unwrap().ack().unwrap();
        assert_eq!(sub.commit().await.unwrap(), 0, "1 is still out");
        let (held, release) = hold_writer(&hold).await;
        drop(ds); // 1 comes back with its last delivery: queued for dead-lettering
        let mut commit = Box::pin(sub.commit());
        assert!(futures::poll!(&mut commit).is_pending(), "queued behind the held write");
        release_writer(held, release).await;
        // The dead letter's round is the commit's round.
        assert_eq!(commit.await.unwrap(), 2);
        drop(sub);
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(broker.dead_letters("q.dlq").await.unwrap().len().await.unwrap(), 1);
    let group = q.group("g").unwrap();
    assert_eq!(group.committed(), Some(2));
    let mut sub = group.subscribe().await.unwrap();
    q.send("3").await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 3, "nothing delivered again");
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// A redrive's batches are atomic, its letters and its cursor in one write: a storage error
/// in the second batch of a `batch(2)` redrive leaves the first batch moved and the cursor
/// after it, the second neither moved nor passed; after a reopen a new redrive moves the rest,
/// and the target holds every letter once.
async fn a_redrive_failing_mid_way_leaves_whole_batches_moved() {
    let dir = tempdir();
    let letters = ["a", "b", "c", "d", "e"];
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("jobs").await.unwrap();
        q.send_batch(letters).await.unwrap();
        let policy = rockq::RetryPolicy::default().max_attempts(1);
        let mut jobs = q.work_group("w").unwrap().retry_policy(policy).subscribe().await.unwrap();
        for _ in letters {
            next_job(&mut jobs).await.fail_durable("boom").await.unwrap();
        }
        drop(jobs);
        broker.flush().await.unwrap();
        let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
        assert_eq!(dlq.len().await.unwrap(), 5);
        // The first write (the first batch) goes through, the next fails.
        fail::cfg("rockq-writer-write", "1*off->return").unwrap();
        let res = dlq.redrive(rockq::Redrive::new().to("replay").batch(2)).await;
        fail::remove("rockq-writer-write");
        assert!(matches!(res, Err(Error::Storage(_))), "{res:?}");
        let _ = broker.shutdown().await;
    }
    let broker = open(dir.path()).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 3, "the first batch moved, the cursor after it");
    let replay = broker.queue("replay").await.unwrap();
    assert_eq!(replay.last_seq(), 2, "the failed batch left nothing in the target");
    assert_eq!(dlq.redrive(rockq::Redrive::new().to("replay").batch(2)).await.unwrap(), 3);
    let mut sub = replay.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut sub, 5).await), letters, "every letter once, in order");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_storage_errors() {
    let scenario = fail::FailScenario::setup();
    write_error_fails_the_call_and_the_broker_closed_then_reopen_recovers().await;
    ack_durable_ends_when_the_broker_fails_closed().await;
    sync_error_under_fsync_fails_the_send().await;
    failed_outcome_write_leaves_the_claim_for_redelivery().await;
    read_error_ends_the_stream_with_an_error().await;
    enqueue_returns_before_the_sync_and_the_receipt_after_it().await;
    enqueue_waits_while_channel_capacity_messages_are_staged().await;
    shutdown_writes_a_staged_backlog_in_capped_rounds().await;
    a_round_mixing_queues_gives_each_queue_dense_sequences().await;
    a_writer_panic_fails_pending_receipts_instead_of_hanging_them().await;
    a_reset_wins_over_acks_not_yet_committed().await;
    a_dropped_reset_keeps_the_group_until_it_lands().await;
    a_work_group_reset_wins_over_queued_pool_acks().await;
    an_until_acked_trim_is_clamped_to_offsets_changed_since_its_cut().await;
    a_dead_letter_abandoned_on_a_full_channel_is_retried().await;
    a_refused_reset_keeps_the_delivery_records().await;
    an_ordered_dead_letter_and_the_offset_past_it_are_one_write().await;
    a_redrive_failing_mid_way_leaves_whole_batches_moved().await;
    scenario.teardown();
}
