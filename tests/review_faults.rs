//! Regressions for the faults an outside review found in the claim and dead-letter paths
//! (issue 13). The ones that need a held writer or sync are in `tests/faults.rs`.

mod common;

use std::time::Duration;

use common::*;
use rockq::{ManualClock, Message, RetryPolicy, StartFrom};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_mid_batch_strands_none_of_the_claims_after_it() {
    // Fault: a record that does not decode in the middle of a claim batch made the read return
    // the good prefix, and the claims after the bad record were cleared with it: they stayed
    // leased until the lease ran out and came back with attempt + 1 (with max_attempts(1):
    // dead-lettered without ever being delivered).
    let dir = tempdir();
    let clock = ManualClock::new();
    {
        let broker = open_clock(dir.path(), &clock).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch(["1", "2", "3", "4", "5"]).await.unwrap();
        broker.shutdown().await.unwrap();
    }
    corrupt_message(dir.path(), 1, 3, &[42, 0]);
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(RetryPolicy::default().max_attempts(1)).read_batch(5);
    let mut jobs = group.subscribe().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let job = next_job(&mut jobs).await;
        seen.push((job.seq(), job.attempt()));
        job.ack_durable().await.unwrap();
    }
    // Nobody's lease ran out (the clock never moved): 4 and 5 come on their first attempt.
    assert_eq!(seen, [(1, 1), (2, 1), (4, 1), (5, 1)]);
    let dlq = broker.dead_letters("q.dlq").await.unwrap();
    let letters = dlq.list(10).await.unwrap();
    assert_eq!(letters.iter().map(|d| d.seq).collect::<Vec<_>>(), [Some(3)], "only the corrupt one");
    drop(jobs);
    broker.shutdown().await.unwrap();
}

/// A message with as many headers as the envelope holds: its dead-letter copy cannot add the
/// six `rockq-dlq-*` headers.
fn header_stuffed() -> Message {
    (0..65_530).fold(Message::new("stuffed"), |m, i| m.header(format!("{i}"), ""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_dead_letter_cannot_hold_its_headers_still_leaves_the_group() {
    // Fault: when the dead-letter copy could not be encoded (65,530+ headers), the outcome was
    // refused and the message was left `Settling` (exhausted path) or came back forever
    // (`Job::dead_letter`): the group's offset never passed it, and retention never trimmed
    // the queue again.
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send(header_stuffed()).await.unwrap();
    q.send(header_stuffed()).await.unwrap();
    let group = q
        .work_group("w")
        .unwrap()
        .lease(Duration::from_secs(10))
        .retry_policy(RetryPolicy::default().max_attempts(1))
        .read_batch(1);
    let mut jobs = group.subscribe().await.unwrap();

    // 1: dead-lettered by the consumer.
    let job = next_job(&mut jobs).await;
    assert_eq!(job.seq(), 1);
    job.dead_letter_durable("poison").await.expect("the dead letter is written, headers dropped");

    // 2: its lease runs out on its only attempt, so the next claim dead-letters it unseen.
    let job = next_job(&mut jobs).await;
    assert_eq!(job.seq(), 2);
    std::mem::forget(job); // neither released nor settled: only the lease can end it
    clock.advance(Duration::from_secs(11));
    let sentinel = q.send("sentinel").await.unwrap();
    let job = next_job(&mut jobs).await;
    assert_eq!(job.seq(), sentinel);
    job.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(sentinel), "both stuffed messages left the group");

    let letters = broker.dead_letters("q.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(letters.len(), 2);
    for d in &letters {
        // 65,530 + 6 origin headers > 65,535: one original header gives way.
        assert!(d.reason.contains("1 original headers dropped"), "{}", d.reason);
        assert_eq!(d.headers.len(), 65_529, "as many original headers as fit are kept");
        assert_eq!(d.payload.as_ref(), b"stuffed");
    }
    assert!(letters[0].reason.starts_with("poison"), "{}", letters[0].reason);
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_claim_reads_at_most_four_mib_and_releases_the_rest_unread() {
    // Fault: a claim read `claim_batch` messages with no byte cap (`claim_batch` ×
    // `max_message_bytes` in one buffer, up to 64 × 64 MiB).
    let dir = tempdir();
    let broker = rockq::Options::new()
        .max_message_bytes(8 << 20)
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(dir.path())
        .await
        .unwrap();
    let q = broker.queue("q").await.unwrap();
    let big = vec![7u8; 3 << 20];
    q.send_batch([big.clone(), big.clone(), big.clone()]).await.unwrap();
    let group = q.work_group("w").unwrap().start_from(StartFrom::Earliest).read_batch(3).max_in_flight(3);
    let mut jobs = group.subscribe().await.unwrap();
    let first = next_job(&mut jobs).await;
    // 3 MiB + 3 MiB crosses the cap: the batch read stops at two, the third claim is let go.
    assert_eq!(jobs.in_flight(), 2, "the third claim was released, not held unread");
    let second = next_job(&mut jobs).await;
    let third = next_job(&mut jobs).await;
    let got: Vec<_> =
        [&first, &second, &third].iter().map(|j| (j.seq(), j.attempt(), j.payload().len())).collect();
    assert_eq!(got, [(1, 1, 3 << 20), (2, 1, 3 << 20), (3, 1, 3 << 20)], "released uncounted");
    for j in [first, second, third] {
        j.ack_durable().await.unwrap();
    }
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_group_reset_is_not_kept_out_by_a_lease_that_ran_out() {
    // Fault (issue 13, found by the model test once resets were among its operations): a job
    // whose lease ran out still counted as held, so `reset_to` answered `Active` until some
    // claim happened to take the message back, although nobody held it any more.
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send("1").await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut jobs = group.subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    drop(jobs);
    clock.advance(Duration::from_secs(11));
    assert!(matches!(job.ack_durable().await, Err(rockq::AckError::LeaseLost { .. })));
    assert_eq!(group.reset_to(rockq::ResetTo::Sequence(1)).await.unwrap(), 1);
    let mut jobs = group.subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    assert_eq!((job.seq(), job.attempt()), (1, 1), "the reset dropped the old attempt");
    job.ack_durable().await.unwrap();
    drop(jobs);
    broker.shutdown().await.unwrap();
}
