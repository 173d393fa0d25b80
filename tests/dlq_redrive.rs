//! Dead-letter queues: what a dead letter keeps, consuming a DLQ like any queue, and redrive
//! (back to the origin or elsewhere, limited, resumable, rate-limited).

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Error, Event, ManualClock, Message, Redrive, RetryPolicy};

/// Sends `payloads` to `jobs` and dead-letters each through the group `w` (one failed attempt
/// each, `max_attempts(1)`). Returns the origin sequences.
async fn dead_letter_all(broker: &rockq::Broker, payloads: &[&str]) -> Vec<u64> {
    let q = broker.queue("jobs").await.unwrap();
    let seqs: Vec<u64> = q.send_batch(payloads.iter().copied()).await.unwrap().collect();
    let mut sub = q
        .work_group("w")
        .unwrap()
        .retry_policy(RetryPolicy::default().max_attempts(1))
        .subscribe()
        .await
        .unwrap();
    for _ in &seqs {
        next_job(&mut sub).await.fail_durable("boom").await.unwrap();
    }
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_origin_payload_headers_attempts_error_and_times() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send(Message::new("body").header("trace", "t-1")).await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(
        RetryPolicy::default()
            .max_attempts(2)
            .backoff(Duration::from_secs(1), Duration::from_secs(1))
            .jitter(0.0),
    );
    let mut sub = group.subscribe().await.unwrap();
    next_job(&mut sub).await.fail_durable("first error").await.unwrap();
    clock.advance(Duration::from_secs(1));
    let j = next_job(&mut sub).await;
    assert_eq!(j.attempt(), 2);
    j.fail_durable("second error").await.unwrap();
    assert_eq!(group.committed(), Some(seq), "the offset moved in the same write");

    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 1);
    let d = dlq.peek().await.unwrap().unwrap();
    assert_eq!(d.queue.as_deref(), Some("jobs"));
    assert_eq!(d.seq, Some(seq));
    assert_eq!(d.group.as_deref(), Some("w"));
    assert_eq!(d.attempts, 2);
    assert!(d.reason.contains("second error"), "{}", d.reason);
    assert_eq!(d.payload.as_ref(), b"body");
    assert_eq!(d.headers, vec![("trace".to_string(), bytes::Bytes::from("t-1"))]);
    assert!(d.dead_lettered_at > d.enqueued_at, "dead-lettered one clock-second after sending");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_now_skips_the_remaining_attempts() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("poison").await.unwrap();
    let mut sub = q.work_group("w").unwrap().dead_letter_queue("graveyard").subscribe().await.unwrap();
    next_job(&mut sub).await.dead_letter_durable("cannot parse").await.unwrap();
    let d = broker.dead_letters("graveyard").await.unwrap().peek().await.unwrap().unwrap();
    assert_eq!((d.attempts, d.reason.as_str()), (1, "cannot parse"));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_is_consumed_by_groups_like_any_queue() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    dead_letter_all(&broker, &["a", "b"]).await;
    let dlq = broker.queue("jobs.dlq").await.unwrap();
    let mut sub = dlq.group("inspect").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, 2).await;
    assert_eq!(payloads(&ds), ["a", "b"]);
    assert_eq!(ds[0].header("rockq-dlq-queue").unwrap().as_ref(), b"jobs");
    ds.into_iter().for_each(|d| d.ack().unwrap());
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_moves_dead_letters_back_to_their_origin_with_new_sequences() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let mut events = broker.events();
    let old = dead_letter_all(&broker, &["a", "b", "c"]).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.redrive(Redrive::new()).await.unwrap(), 3);
    assert_eq!(dlq.len().await.unwrap(), 0);
    assert!(dlq.list(10).await.unwrap().is_empty());
    let e = wait_event(&mut events, |e| matches!(e, Event::Redriven { .. })).await;
    assert!(matches!(e, Event::Redriven { dlq_seq: 1, ref queue, .. } if &**queue == "jobs"));

    // The group sees them as new messages, first attempt, after everything it finished.
    let q = broker.queue("jobs").await.unwrap();
    let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
    for payload in ["a", "b", "c"] {
        let j = next_job(&mut sub).await;
        assert_eq!((j.payload().as_ref(), j.attempt()), (payload.as_bytes(), 1));
        assert!(j.seq() > *old.last().unwrap());
        assert!(j.header("rockq-dlq-queue").is_none(), "dead-letter headers are stripped");
        j.ack_durable().await.unwrap();
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_to_another_queue_is_limited_and_resumes_after_a_restart_without_duplicates() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        dead_letter_all(&broker, &["a", "b", "c", "d", "e"]).await;
        let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
        assert_eq!(dlq.redrive(Redrive::new().to("replay").limit(3).batch(2)).await.unwrap(), 3);
        assert_eq!(dlq.len().await.unwrap(), 2);
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 2, "the cursor survived the restart");
    assert_eq!(dlq.redrive(Redrive::new().to("replay")).await.unwrap(), 2);
    let replay = broker.queue("replay").await.unwrap();
    let mut sub = replay.group("g").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, 5).await;
    assert_eq!(payloads(&ds), ["a", "b", "c", "d", "e"]);
    ds.into_iter().for_each(|d| d.ack().unwrap());
    assert_next_is_sentinel(&replay, &mut sub).await;
    broker.shutdown().await.unwrap();
}

/// Redrives of one dead-letter queue at the same time (the CLI and the console, say) move each
/// letter once: each batch compares the cursor it read, so a redrive that lost the race gets
/// `RedriveConflict` (retryable) and moves nothing of that batch; run again, it finds what is
/// left. Without the compare, concurrent redrives of one-letter batches send letters twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redrives_move_each_letter_once_and_a_loser_is_told_to_retry() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let names: Vec<String> = (0..120).map(|i| format!("p{i}")).collect();
    dead_letter_all(&broker, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let redrives = (0..4).map(|_| {
        let dlq = dlq.clone();
        tokio::spawn(async move {
            loop {
                match dlq.redrive(Redrive::new().to("replay").batch(1)).await {
                    Ok(_) => return,
                    Err(e @ Error::RedriveConflict { .. }) => assert!(e.is_retryable(), "{e}"),
                    Err(e) => panic!("a concurrent redrive failed with {e:?}"),
                }
            }
        })
    });
    for r in futures::future::join_all(redrives).await {
        r.unwrap();
    }
    assert_eq!(dlq.len().await.unwrap(), 0, "every letter moved");
    let replay = broker.queue("replay").await.unwrap();
    let mut sub = replay.group("g").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, names.len()).await;
    let mut got = payloads(&ds);
    got.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(got, want, "each letter once");
    ds.into_iter().for_each(|d| d.ack().unwrap());
    assert_next_is_sentinel(&replay, &mut sub).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_with_a_bad_target_or_without_an_origin_moves_nothing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    dead_letter_all(&broker, &["a"]).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert!(matches!(dlq.redrive(Redrive::new().to("bad name")).await, Err(Error::InvalidName(_))));
    assert_eq!(dlq.len().await.unwrap(), 1);

    // A message sent to a DLQ by hand has no origin.
    let manual = broker.dead_letters("manual.dlq").await.unwrap();
    broker.queue("manual.dlq").await.unwrap().send("orphan").await.unwrap();
    assert!(matches!(manual.redrive(Redrive::new()).await, Err(Error::NoOrigin { seq: 1 })));
    assert_eq!(manual.len().await.unwrap(), 1);
    assert_eq!(manual.redrive(Redrive::new().to("jobs")).await.unwrap(), 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_is_paced_by_its_rate_on_the_broker_clock() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    dead_letter_all(&broker, &["a", "b", "c", "d"]).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let task = {
        let dlq = dlq.clone();
        tokio::spawn(async move { dlq.redrive(Redrive::new().batch(2).rate(2.0)).await })
    };
    for _ in 0..2 {
        wait_event(&mut events, |e| matches!(e, Event::Redriven { .. })).await;
    }
    // Two moved at 2/s: the redrive waits for one clock-second before the next batch.
    assert_eq!(dlq.len().await.unwrap(), 2);
    assert!(!task.is_finished());
    clock.advance(Duration::from_secs(1));
    let moved = tokio::time::timeout(HANG_GUARD, task).await.unwrap().unwrap().unwrap();
    assert_eq!(moved, 4);
    assert_eq!(dlq.len().await.unwrap(), 0);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_durable_across_restart() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        dead_letter_all(&broker, &["a"]).await;
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let d = dlq.list(5).await.unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].payload.as_ref(), b"a");
    let q = broker.queue("jobs").await.unwrap();
    let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
    let sentinel = q.send("sentinel").await.unwrap();
    assert_eq!(next_job(&mut sub).await.seq(), sentinel, "a dead letter is finished in its group");
    drop(sub.next());
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_message_is_dead_lettered_with_its_raw_bytes_and_the_group_moves_on() {
    // Regression: a stored message whose envelope does not decode made every claim of it fail
    // the read, released the claim without counting an attempt, and so stalled the work group
    // at that message forever (and its dead-letter write would have failed to decode it too).
    let dir = tempdir();
    let broker = open(dir.path()).await;
    broker.queue("jobs").await.unwrap().send_batch(["1", "2", "3"]).await.unwrap();
    broker.shutdown().await.unwrap();
    corrupt_message(dir.path(), 1, 2, &[42, 0]);
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap();
    let mut sub = group.clone().read_batch(1).subscribe().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        // A hang guard, not a timing assertion: before the fix this never returned.
        let job =
            tokio::time::timeout(Duration::from_secs(60), next_job(&mut sub)).await.expect("group stalled");
        got.push(job.payload().clone());
        job.ack_durable().await.unwrap();
    }
    assert_eq!(got, ["1", "3"]);
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let d = dlq.peek().await.unwrap().expect("the corrupted message is in the dead-letter queue");
    assert_eq!((d.queue.as_deref(), d.seq, d.group.as_deref()), (Some("jobs"), Some(2), Some("w")));
    assert_eq!(d.payload.as_ref(), [42u8, 0], "the stored bytes, as they were");
    assert!(d.reason.contains("corrupt"), "{}", d.reason);
    assert_eq!(group.committed(), Some(3), "the offset passed the dead-lettered message");
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
