//! Work-queue groups: competing consumers, leases and fencing, retries with backoff, attempts
//! that survive restarts, and the in-flight bound. Time is a `ManualClock`: it moves only
//! when a test advances it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Error, Event, ManualClock, RetryPolicy, StartFrom};

fn no_jitter(max_attempts: u32, backoff: Duration) -> RetryPolicy {
    RetryPolicy::default().max_attempts(max_attempts).backoff(backoff, backoff * 100).jitter(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_consumers_get_each_message_exactly_once_in_a_clean_run() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let n = 300u64;
    // One call: on etcd (scripts/etcd-semantics.sh) larger than a transaction, so reserved.
    q.send_batch((0..n).map(|i| format!("m{i}"))).await.unwrap();

    let seen: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let stop = rockq::CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut sub = q.work_group("w").unwrap().read_batch(8).subscribe().await.unwrap();
        let (seen, stop) = (seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let job = tokio::select! {
                    j = sub.next() => j.expect("stream ended").expect("stream error"),
                    _ = stop.cancelled() => return,
                };
                assert_eq!(job.attempt(), 1);
                let seq = job.seq();
                job.ack_durable().await.unwrap();
                let mut s = seen.lock().unwrap();
                *s.entry(seq).or_default() += 1;
                if s.len() as u64 == n {
                    stop.cancel();
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(HANG_GUARD, t).await.expect("hung").unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
    assert!(seen.values().all(|&c| c == 1), "a message was delivered twice: {seen:?}");
    // Every ack resolved after its outcome was durable, so the offset is at the end.
    assert_eq!(q.work_group("w").unwrap().committed(), Some(n));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_redelivers_with_the_next_attempt_and_fences_the_old_holder() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("slow").await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut a = group.subscribe().await.unwrap();
    let mut b = group.subscribe().await.unwrap();

    let old = next_job(&mut a).await;
    assert_eq!((old.seq(), old.attempt()), (seq, 1));
    clock.advance(Duration::from_secs(10));
    let new = next_job(&mut b).await;
    assert_eq!((new.seq(), new.attempt()), (seq, 2));
    wait_event(&mut events, |e| matches!(e, Event::LeaseExpired { seq: s, attempt: 1, .. } if *s == seq))
        .await;

    // The old holder can no longer do anything with it, whatever it tries.
    assert!(matches!(old.extend(Duration::from_secs(60)), Err(Error::LeaseLost { attempt: 1, .. })));
    assert!(matches!(old.ack_durable().await, Err(Error::LeaseLost { .. })));
    assert_eq!(group.committed(), Some(0), "a fenced ack must not move the offset");

    new.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(seq));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_fences_even_if_nobody_claimed_the_message_again() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.work_group("w").unwrap().lease(Duration::from_secs(5)).subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    clock.advance(Duration::from_secs(5));
    assert!(matches!(job.nack_durable().await, Err(Error::LeaseLost { .. })));
    let again = next_job(&mut sub).await;
    assert_eq!(again.attempt(), 2);
    again.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_lease_past_its_original_deadline() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("long").await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut a = group.subscribe().await.unwrap();
    let job = next_job(&mut a).await;
    clock.advance(Duration::from_secs(8));
    job.extend(Duration::from_secs(10)).unwrap();
    clock.advance(Duration::from_secs(8)); // 16 s after the claim: past the first deadline

    // Another consumer gets the next message, not the extended one.
    let mut b = group.subscribe().await.unwrap();
    let sentinel = q.send("sentinel").await.unwrap();
    let other = next_job(&mut b).await;
    assert_eq!(other.seq(), sentinel);
    job.ack_durable().await.unwrap();
    other.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(sentinel));
    assert!(seq < sentinel);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_message_waits_for_its_backoff_without_holding_a_slot_or_blocking_later_ones() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    let first = q.send_batch(["a", "b", "c"]).await.unwrap();
    let group =
        q.work_group("w").unwrap().max_in_flight(1).retry_policy(no_jitter(5, Duration::from_secs(10)));
    let mut sub = group.subscribe().await.unwrap();

    let a = next_job(&mut sub).await;
    assert_eq!(a.seq(), *first.start());
    a.fail_durable("flaky").await.unwrap();
    let retried = wait_event(&mut events, |e| matches!(e, Event::Retried { .. })).await;
    assert!(
        matches!(retried, Event::Retried { attempt: 1, delay, ref error, .. } if delay == Duration::from_secs(10) && error == "flaky")
    );
    assert_eq!(group.waiting(), 1);

    // With max_in_flight(1), b and c still flow while a waits.
    for expected in [b"b", b"c"] {
        let j = next_job(&mut sub).await;
        assert_eq!(j.payload().as_ref(), expected);
        j.ack_durable().await.unwrap();
    }
    assert_eq!(group.committed(), Some(0), "the offset waits for a");

    clock.advance(Duration::from_secs(10));
    let a2 = next_job(&mut sub).await;
    assert_eq!((a2.seq(), a2.attempt()), (*first.start(), 2));
    a2.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(*first.end()));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_overrides_the_backoff() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("x").await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(no_jitter(5, Duration::from_secs(3600)));
    let mut sub = group.subscribe().await.unwrap();
    next_job(&mut sub).await.retry_after_durable(Duration::from_secs(3)).await.unwrap();

    clock.advance(Duration::from_secs(2));
    let sentinel = q.send("sentinel").await.unwrap();
    let s = next_job(&mut sub).await;
    assert_eq!(s.seq(), sentinel, "not due yet");
    s.ack_durable().await.unwrap();
    clock.advance(Duration::from_secs(1));
    let again = next_job(&mut sub).await;
    assert_eq!((again.seq(), again.attempt()), (seq, 2));
    again.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_job_releases_it_at_once_and_counts_the_attempt() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("dropped").await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(no_jitter(2, Duration::from_secs(1)));
    let mut sub = group.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.attempt(), 1);
    drop(j);
    let j = next_job(&mut sub).await; // no clock movement needed
    assert_eq!((j.seq(), j.attempt()), (seq, 2));
    drop(j);
    // Two attempts used up: the next claim dead-letters it instead of delivering it again.
    let e = tokio::select! {
        e = wait_event(&mut events, |e| matches!(e, Event::DeadLettered { .. })) => e,
        j = sub.next() => panic!("delivered a third time: {j:?}"),
    };
    assert!(matches!(e, Event::DeadLettered { seq: s, attempts: 2, .. } if s == seq));
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 1);
    assert_eq!(group.committed(), Some(seq));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_and_finished_messages_survive_a_restart() {
    let dir = tempdir();
    let (s1, s3);
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("jobs").await.unwrap();
        let r = q.send_batch(["one", "two", "three"]).await.unwrap();
        (s1, s3) = (*r.start(), *r.end());
        let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
        let jobs = [next_job(&mut sub).await, next_job(&mut sub).await, next_job(&mut sub).await];
        let [j1, j2, j3] = jobs;
        assert_eq!(j1.seq(), s1);
        // 2 and 3 finish above the gap that 1 leaves; 1 is still held when the process stops.
        j2.ack_durable().await.unwrap();
        j3.ack_durable().await.unwrap();
        std::mem::forget(j1); // as if the process died while handling it
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap();
    assert_eq!(group.committed(), Some(s1 - 1));
    let mut sub = group.subscribe().await.unwrap();
    let j1 = next_job(&mut sub).await;
    assert_eq!((j1.seq(), j1.attempt()), (s1, 2), "the attempt from before the restart counts");
    j1.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(s3), "2 and 3 were already finished");
    // Nothing else comes back: the next job is the sentinel.
    let sentinel = q.send("sentinel").await.unwrap();
    let s = next_job(&mut sub).await;
    assert_eq!(s.seq(), sentinel);
    s.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_time_survives_a_restart() {
    let dir = tempdir();
    let seq;
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("jobs").await.unwrap();
        seq = q.send("x").await.unwrap();
        let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
        next_job(&mut sub).await.retry_after_durable(Duration::from_secs(3600)).await.unwrap();
        broker.shutdown().await.unwrap();
    }
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap();
    assert_eq!(group.waiting(), 1);
    let mut sub = group.subscribe().await.unwrap();
    let sentinel = q.send("sentinel").await.unwrap();
    let s = next_job(&mut sub).await;
    assert_eq!(s.seq(), sentinel, "the retry is not due after a restart");
    s.ack_durable().await.unwrap();
    clock.advance(Duration::from_secs(3600));
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (seq, 2));
    j.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_and_work_groups_are_independent_and_a_name_keeps_its_mode() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        let seqs = q.send_batch(["x", "y"]).await.unwrap();
        let mut ordered = q.group("audit").unwrap().subscribe().await.unwrap();
        let mut work = q.work_group("workers").unwrap().subscribe().await.unwrap();
        for seq in seqs.clone() {
            let d = next(&mut ordered).await;
            assert_eq!(d.seq(), seq);
            d.ack().unwrap();
            let j = next_job(&mut work).await;
            assert_eq!(j.seq(), seq);
            j.ack_durable().await.unwrap();
        }
        assert!(matches!(
            q.work_group("audit").unwrap().subscribe().await,
            Err(Error::WrongMode { existing: "ordered", .. })
        ));
        assert!(matches!(
            q.group("workers").unwrap().subscribe().await,
            Err(Error::WrongMode { existing: "work-queue", .. })
        ));
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert!(matches!(q.group("workers").unwrap().subscribe().await, Err(Error::WrongMode { .. })));
    assert!(matches!(q.work_group("audit").unwrap().subscribe().await, Err(Error::WrongMode { .. })));
    assert_eq!(q.work_group("workers").unwrap().committed(), Some(2));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_in_flight_bound_is_reported_as_saturation() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let group = q.work_group("w").unwrap().max_in_flight(1).saturation_after(Duration::from_secs(1));
    let mut sub = group.subscribe().await.unwrap();
    let held = next_job(&mut sub).await;

    let mut pending = sub.next();
    assert!(futures::poll!(&mut pending).is_pending(), "the bound is hit");
    clock.advance(Duration::from_secs(1));
    tokio::select! {
        e = wait_event(&mut events, |e| matches!(e, Event::Saturated { .. })) => {
            assert!(matches!(e, Event::Saturated { max_in_flight: 1, .. }));
        }
        _ = &mut pending => panic!("a job came through a full bound"),
    }
    assert_eq!(group.saturations(), 1);
    held.ack_durable().await.unwrap();
    let b = tokio::time::timeout(HANG_GUARD, pending).await.unwrap().unwrap().unwrap();
    assert_eq!(b.payload().as_ref(), b"b");
    b.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_claimed_but_never_handed_out_are_released_without_counting() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let group = q.work_group("w").unwrap().read_batch(3);
    let mut sub = group.subscribe().await.unwrap();
    let a = next_job(&mut sub).await; // b and c were claimed with it
    drop(sub);
    a.ack_durable().await.unwrap();
    let mut sub = group.subscribe().await.unwrap();
    for payload in [b"b", b"c"] {
        let j = next_job(&mut sub).await;
        assert_eq!((j.payload().as_ref(), j.attempt()), (&payload[..], 1));
        j.ack_durable().await.unwrap();
    }
    broker.shutdown().await.unwrap();
}

/// Jobs claimed ahead wait in the subscription while their leases run: one whose lease ran out
/// before `next()` handed it out is released unseen, its attempt not counted (the claim that
/// follows hands it out again as attempt 1), and no job is handed out with a lease already
/// gone. The job that was handed out counts its attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_job_whose_lease_ran_out_is_released_unseen_and_its_attempt_not_counted() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let lease = Duration::from_secs(30);
    let mut sub = q.work_group("w").unwrap().lease(lease).read_batch(3).subscribe().await.unwrap();
    let first = next_job(&mut sub).await; // b and c were claimed with it
    assert_eq!((first.seq(), first.attempt()), (1, 1));
    clock.advance(lease + Duration::from_secs(1));
    let mut again = Vec::new();
    for _ in 0..3 {
        let j = next_job(&mut sub).await;
        again.push((j.seq(), j.attempt()));
        j.ack_durable().await.expect("a job handed out holds its lease");
    }
    again.sort();
    assert_eq!(again, [(1, 2), (2, 1), (3, 1)], "only the job handed out counted its attempt");
    assert!(matches!(first.ack_durable().await, Err(Error::LeaseLost { .. })));
    broker.shutdown().await.unwrap();
}

/// The cancel safety of the outcome methods: `ack_durable` dropped after its first poll had
/// queued the ack, which completes anyway; dropped before it was ever polled, the job is
/// released and its attempt counts; `nack_durable` dropped after its first poll still
/// schedules the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_outcome_future_completes_once_queued_and_releases_the_job_before() {
    use futures::FutureExt;
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let group = q.work_group("w").unwrap().read_batch(1).retry_policy(RetryPolicy::default().max_attempts(5));
    let mut sub = group.subscribe().await.unwrap();
    let a = next_job(&mut sub).await;
    assert_eq!((a.seq(), a.attempt()), (1, 1));
    let _ = a.ack_durable().now_or_never(); // polled once, then dropped
    broker.flush().await.unwrap();
    assert_eq!(group.committed(), Some(1), "the queued ack completed");
    let b = next_job(&mut sub).await;
    assert_eq!((b.seq(), b.attempt()), (2, 1));
    drop(b.ack_durable()); // never polled: the job is dropped unsettled
    let b = next_job(&mut sub).await;
    assert_eq!((b.seq(), b.attempt()), (2, 2), "released, its attempt counted");
    let _ = b.nack_durable().now_or_never();
    broker.flush().await.unwrap();
    let status = broker.job("jobs", "w", 2).await.unwrap();
    assert!(
        matches!(status.state, rockq::JobState::RetryWaiting { .. }) && status.attempt == 2,
        "the queued retry was written: {status:?}"
    );
    assert_eq!(group.committed(), Some(1));
    broker.shutdown().await.unwrap();
}

/// `next()` is cancel safe: a `select!` that drops it for another branch, again and again,
/// loses no job and hands none out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_next_loses_no_job_and_hands_none_out_twice() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let n = 300u64;
    q.send_batch((0..n).map(|i| i.to_string())).await.unwrap();
    let mut sub = q.work_group("w").unwrap().read_batch(7).subscribe().await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let (mut dropped, mut polls) = (0u64, 0u64);
    while (seen.len() as u64) < n {
        polls += 1;
        assert!(polls < 100 * n, "jobs stopped coming: {} of {n}", seen.len());
        // Every other round another branch is ready at once: `next()` is polled once and, if
        // it is not ready (a claim or a read in flight), dropped.
        let other_ready = polls % 2 == 0;
        tokio::select! {
            biased;
            j = sub.next() => {
                let j = j.expect("stream ended").expect("a job");
                assert!(seen.insert(j.seq()), "job {} handed out twice", j.seq());
                assert_eq!(j.attempt(), 1, "job {} was released and claimed again", j.seq());
                j.ack().unwrap();
            }
            _ = std::future::ready(()), if other_ready => dropped += 1,
        }
    }
    assert!(dropped > 0);
    broker.flush().await.unwrap();
    assert_eq!(q.work_group("w").unwrap().committed(), Some(n));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_after_shutdown_are_refused() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.work_group("w").unwrap().subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    broker.shutdown().await.unwrap();
    assert!(matches!(j.extend(Duration::from_secs(1)), Err(Error::Shutdown)));
    assert!(matches!(j.ack_durable().await, Err(Error::Shutdown)));
    assert!(sub.next().await.is_none(), "the stream ends at shutdown");
    assert!(matches!(q.work_group("w").unwrap().subscribe().await, Err(Error::Shutdown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_dead_letter_queue_names_are_rejected_at_subscribe() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let bad = q.work_group("w").unwrap().dead_letter_queue("no spaces").subscribe().await;
    assert!(matches!(bad, Err(Error::InvalidName(_))));
    let long = broker.queue(&"q".repeat(rockq::MAX_NAME_LEN)).await.unwrap();
    let too_long = long.work_group("w").unwrap().subscribe().await;
    assert!(matches!(too_long, Err(Error::DeadLetterName { .. })));
    assert_eq!(q.work_group("w").unwrap().committed(), None, "nothing was created");
    broker.shutdown().await.unwrap();
}

/// Many consumers, random outcomes (ack, drop, stall past the lease) and a clock moving under
/// them: a message is never held by two consumers whose leases are both valid, and exactly one
/// ack per message wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_consumers_hold_a_message_under_valid_leases_and_one_ack_wins() {
    use std::collections::HashMap;
    use std::time::Instant;

    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let n = 120u64;
    q.send_batch((0..n).map(|i| format!("{i}"))).await.unwrap();
    let lease = Duration::from_secs(10);
    let group =
        q.work_group("w").unwrap().lease(lease).read_batch(4).retry_policy(no_jitter(1000, Duration::ZERO));

    // Per sequence: each holder's lease deadline, or None once it let go (dropped).
    type Holders = HashMap<u64, Vec<(u32, Option<Instant>)>>;
    let holders: Arc<Mutex<Holders>> = Arc::default();
    let wins: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let stop = rockq::CancellationToken::new();
    let mut tasks = Vec::new();
    for worker in 0..6u64 {
        let mut sub = group.subscribe().await.unwrap();
        let (holders, wins, stop) = (holders.clone(), wins.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (worker + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut next_rand = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut stalled: Vec<rockq::Job> = Vec::new();
            let settle =
                |wins: &Mutex<HashMap<u64, u32>>, seq: u64, ok: bool, stop: &rockq::CancellationToken| {
                    if ok {
                        let mut w = wins.lock().unwrap();
                        *w.entry(seq).or_default() += 1;
                        if w.len() as u64 == n {
                            stop.cancel();
                        }
                    }
                };
            loop {
                let job = tokio::select! {
                    j = sub.next() => j.expect("stream ended").expect("stream error"),
                    _ = stop.cancelled() => return,
                };
                // The exact deadline (not `lease_remaining`, which would race the clock).
                #[allow(deprecated)]
                let (seq, attempt, deadline) = (job.seq(), job.attempt(), job.lease_deadline());
                {
                    let mut h = holders.lock().unwrap();
                    let entry = h.entry(seq).or_default();
                    // Lease intervals [deadline - lease, deadline) of holders that did not let go
                    // never overlap (recording order between consumers does not matter).
                    for (a, d) in entry.iter() {
                        if let Some(d) = d {
                            assert!(
                                *d <= deadline - lease || deadline <= *d - lease,
                                "seq {seq}: attempts {a} and {attempt} held it under valid leases at once"
                            );
                        }
                    }
                    entry.push((attempt, Some(deadline)));
                }
                match next_rand() % 10 {
                    0..=5 => {
                        let ok = job.ack_durable().await.is_ok();
                        settle(&wins, seq, ok, &stop);
                    }
                    6 | 7 => {
                        // Let go: from now on another consumer may hold it.
                        let mut h = holders.lock().unwrap();
                        if let Some(e) =
                            h.get_mut(&seq).and_then(|v| v.iter_mut().find(|(a, _)| *a == attempt))
                        {
                            e.1 = None;
                        }
                        drop(h);
                        drop(job);
                    }
                    _ => stalled.push(job),
                }
                // Stalled jobs try their luck later: a win only while their lease is valid.
                if next_rand() % 4 == 0
                    && let Some(job) = stalled.pop()
                {
                    let seq = job.seq();
                    let ok = job.ack_durable().await.is_ok();
                    settle(&wins, seq, ok, &stop);
                }
            }
        }));
    }
    let driver = {
        let (clock, stop) = (clock.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
                clock.advance(Duration::from_secs(3));
            }
        })
    };
    for t in tasks {
        tokio::time::timeout(HANG_GUARD, t).await.expect("hung").unwrap();
    }
    driver.await.unwrap();
    let wins = wins.lock().unwrap().clone();
    assert_eq!(wins.len() as u64, n);
    assert!(wins.values().all(|&w| w == 1), "two holders both won: {wins:?}");
    assert_eq!(group.committed(), Some(n));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_ack_is_queued_at_once_and_ack_durable_returns_once_the_offset_is_written() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut sub = group.subscribe().await.unwrap();
    let (a, b, c) = (next_job(&mut sub).await, next_job(&mut sub).await, next_job(&mut sub).await);

    // Sync, fenced now: an expired lease is refused before anything is queued.
    clock.advance(Duration::from_secs(11));
    assert!(matches!(c.ack(), Err(rockq::Error::LeaseLost { seq: 3, attempt: 1, .. })));
    let a2 = {
        // The expired messages come back: take the first two again.
        let (x, y) = (next_job(&mut sub).await, next_job(&mut sub).await);
        drop((a, b));
        (x, y)
    };
    a2.0.ack().unwrap();
    broker.flush().await.unwrap();
    assert_eq!(group.committed(), Some(1), "a queued ack is durable after a flush");
    a2.1.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(2), "ack_durable returned with the offset written");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_remaining_follows_the_broker_clock_and_extensions() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.work_group("w").unwrap().lease(Duration::from_secs(30)).subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    assert_eq!(job.lease_remaining(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(10));
    assert_eq!(job.lease_remaining(), Duration::from_secs(20));
    job.extend(Duration::from_secs(30)).unwrap();
    assert_eq!(job.lease_remaining(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(45));
    assert_eq!(job.lease_remaining(), Duration::ZERO);
    assert!(job.ack().is_err());
    broker.shutdown().await.unwrap();
}

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
async fn a_job_finished_above_a_reset_runs_again_and_its_new_ack_holds_across_a_restart() {
    // Fault (found by the model test once priorities let a job finish above the offset): a
    // reset to the offset the group already had kept what was finished above it as finished.
    // The job ran again, but its second ack was taken for a duplicate: no `Done` record was
    // written, and after a restart the job ran a third time.
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2"]).await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10)).max_in_flight(2).read_batch(2);
    let mut jobs = group.subscribe().await.unwrap();
    let (one, two) = (next_job(&mut jobs).await, next_job(&mut jobs).await);
    two.ack_durable().await.unwrap();
    drop((one, jobs));
    assert_eq!(group.committed(), Some(0), "1 is unfinished: the offset stays");
    // On etcd a dropped job's lease stands in etcd until it runs out, and the subscription's
    // end reaches the store a moment later: the reset is refused as `Active` until both have.
    clock.advance(Duration::from_secs(11));
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        match group.reset_to(rockq::ResetTo::Sequence(1)).await {
            Ok(seq) => break assert_eq!(seq, 1),
            Err(Error::Active { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("reset: {e}"),
        }
    }
    let mut jobs = group.subscribe().await.unwrap();
    let (one, two) = (next_job(&mut jobs).await, next_job(&mut jobs).await);
    assert_eq!((one.seq(), two.seq(), two.attempt()), (1, 2, 1), "both run again");
    two.ack_durable().await.unwrap();
    drop((one, jobs));
    broker.shutdown().await.unwrap();
    // (On etcd, 1's lease outlives the process until it runs out; embedded, a restart frees it.)
    clock.advance(Duration::from_secs(11));
    let broker = open_clock(dir.path(), &clock).await;
    let group = broker.queue("q").await.unwrap().work_group("w").unwrap();
    let mut jobs = group.subscribe().await.unwrap();
    let one = next_job(&mut jobs).await;
    assert_eq!(one.seq(), 1);
    one.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(2), "2's second ack was recorded: it does not run again");
    assert_eq!(broker.job("q", "w", 2).await.unwrap().state, rockq::JobState::Finished);
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
    assert!(matches!(job.ack_durable().await, Err(rockq::Error::LeaseLost { .. })));
    assert_eq!(group.reset_to(rockq::ResetTo::Sequence(1)).await.unwrap(), 1);
    let mut jobs = group.subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    assert_eq!((job.seq(), job.attempt()), (1, 1), "the reset dropped the old attempt");
    job.ack_durable().await.unwrap();
    drop(jobs);
    broker.shutdown().await.unwrap();
}
