//! Worker pools that can be cancelled (issue 13): a `run` future dropped, a run task aborted, a
//! `PoolHandle` aborted or shut down — the jobs they held come back without their attempt
//! counted; and oversized pools are a typed error.

mod common;

use std::time::Duration;

use common::*;
use rockq::{Broker, Error, HandlerError, ManualClock, Options, RetryPolicy, Task};
use tokio::sync::mpsc;

/// A handler that reports its job's sequence, then waits forever (until aborted).
fn stuck(
    tx: mpsc::UnboundedSender<u64>,
) -> impl Fn(Task) -> futures::future::BoxFuture<'static, Result<(), HandlerError>> {
    move |task: Task| {
        let tx = tx.clone();
        Box::pin(async move {
            let _ = tx.send(task.seq());
            futures::future::pending::<()>().await;
            Ok(())
        })
    }
}

/// After a pool was stopped from outside, the job must come back with the same attempt and
/// nothing may be dead-lettered (the group allows one attempt).
async fn assert_released_uncounted(broker: &Broker, q: &rockq::Queue, seq: u64) {
    let group = q.work_group("w").unwrap().retry_policy(RetryPolicy::default().max_attempts(1));
    let mut sub = group.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (seq, 1), "the interrupted attempt was not counted");
    j.ack_durable().await.unwrap();
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert!(dlq.list(10).await.unwrap().is_empty(), "nothing was dead-lettered");
}

/// One job on queue `jobs`, a group `w` allowing one attempt, and the channel a `stuck`
/// handler reports on.
struct One {
    _dir: tempfile::TempDir,
    broker: Broker,
    q: rockq::Queue,
    seq: u64,
    group: rockq::WorkGroup,
    tx: mpsc::UnboundedSender<u64>,
    started: mpsc::UnboundedReceiver<u64>,
}

async fn one_job() -> One {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("a").await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(RetryPolicy::default().max_attempts(1));
    let (tx, started) = mpsc::unbounded_channel();
    One { _dir: dir, broker, q, seq, group, tx, started }
}

// Fault (issue 13, "Pools that can be cancelled"): dropping a `run` future — here as the
// losing branch of a `select!` — counted the running job's attempt and skipped the drain, so
// with max_attempts(1) the job was dead-lettered without a fair try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_future_dropped_by_select_releases_its_job_without_counting() {
    let One { _dir, broker, q, seq, group, tx, mut started } = one_job().await;
    let run = group.workers(1).run(stuck(tx));
    // The handler starts, then the pool future loses the race and is dropped mid-handler.
    tokio::select! {
        r = run => panic!("the pool stopped by itself: {r:?}"),
        s = started.recv() => assert_eq!(s, Some(seq)),
    }
    assert_released_uncounted(&broker, &q, seq).await;
    broker.shutdown().await.unwrap();
}

// Fault (issue 13, "Pools that can be cancelled"): `JoinHandle::abort` on a spawned `run`
// counted the attempt of every job the pool held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_run_task_releases_its_jobs_without_counting() {
    let One { _dir, broker, q, seq, group, tx, mut started } = one_job().await;
    let run = tokio::spawn(group.workers(1).run(stuck(tx)));
    assert_eq!(started.recv().await, Some(seq));
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert_released_uncounted(&broker, &q, seq).await;
    broker.shutdown().await.unwrap();
}

// Issue 13: `PoolHandle::abort` stops at once and releases held jobs without counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_handle_abort_releases_without_counting() {
    let One { _dir, broker, q, seq, group, tx, mut started } = one_job().await;
    let pool = group.workers(1).spawn(stuck(tx));
    assert_eq!(started.recv().await, Some(seq));
    pool.abort();
    assert_released_uncounted(&broker, &q, seq).await;
    broker.shutdown().await.unwrap();
}

// Issue 13: `Workers::spawn` + `PoolHandle::shutdown` drains and reports what ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_handle_shutdown_drains_and_reports_what_ran() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["ok", "ok", "fail", "dead"]).await.unwrap();
    let group = q
        .work_group("w")
        .unwrap()
        .retry_policy(RetryPolicy::default().max_attempts(1).backoff(Duration::ZERO, Duration::ZERO));
    let pool = group.workers(2).spawn(|task: Task| async move {
        match task.payload().as_ref() {
            b"fail" => Err(HandlerError::retry("no")),
            b"dead" => Err(HandlerError::dead_letter("bad")),
            _ => Ok(()),
        }
    });
    let mut finished = 0;
    while finished < 4 {
        wait_event(&mut events, |e| {
            matches!(e, rockq::Event::Acked { .. } | rockq::Event::DeadLettered { .. })
        })
        .await;
        finished += 1;
    }
    let report = tokio::time::timeout(HANG_GUARD, pool.shutdown()).await.unwrap().unwrap();
    assert_eq!(
        (report.acked, report.failed, report.panicked, report.released, report.unsettled),
        (2, 2, 0, 0, 0)
    );
    assert_eq!(group.committed(), Some(4));
    broker.shutdown().await.unwrap();
}

// Issue 13: a pool whose size cannot be allocated is a typed error, not a panic or an OOM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_pools_are_a_typed_error() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap();
    let handler = |_t: Task| async { Ok::<(), HandlerError>(()) };
    let err = group.workers(usize::MAX).run(handler).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    let err = group.workers(1).prefetch(usize::MAX).spawn(handler).shutdown().await.unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    let err = Options::new().channel_capacity(usize::MAX).open(tempdir().path()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    broker.shutdown().await.unwrap();
}

// Issue 13 (a pool's default prefetch): `prefetch` defaulted to 64 whatever the concurrency, so a one-handler pool claimed
// (and ran the leases of) 64 jobs while its docs said it held at most `concurrency`. Now the
// default is `concurrency`, and the pool holds at most `concurrency + prefetch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_holds_at_most_concurrency_plus_its_default_prefetch() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((0..20).map(|i| format!("m{i}"))).await.unwrap();
    let group = q.work_group("w").unwrap();
    let (tx, mut started) = mpsc::unbounded_channel();
    let pool = group.workers(1).spawn(stuck(tx));
    started.recv().await.unwrap();
    // The running job came from the pool's first claim, so that claim is complete: it held
    // at most one batch (64 jobs before the fix, here at most concurrency + prefetch = 2).
    let held = broker.pending("jobs", "w").await.unwrap().len();
    assert!((1..=2).contains(&held), "the pool holds {held} jobs");
    assert!(group.in_flight() <= 2, "{}", group.in_flight());
    pool.abort();
    broker.shutdown().await.unwrap();
}

// The pool's feed: jobs claimed ahead and waiting for a worker (not only the running one) are
// also the pool's to give back, uncounted, when it is aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_pool_releases_its_waiting_jobs_without_counting_too() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seqs = q.send_batch((1..=5).map(|i| format!("m{i}"))).await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(RetryPolicy::default().max_attempts(1));
    let (tx, mut started) = mpsc::unbounded_channel();
    // One stuck handler; its first claim (a batch of four) puts one job in its hands, one in
    // its feed and two in its subscription's buffer.
    let pool = group.workers(1).prefetch(4).spawn(stuck(tx));
    assert_eq!(started.recv().await, Some(*seqs.start()));
    tokio::time::timeout(HANG_GUARD, async {
        while group.in_flight() < 4 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the pool did not claim ahead");
    pool.abort();
    // Every one comes back at attempt 1 (one attempt allowed: a counted one would have been
    // dead-lettered instead).
    let mut sub = group.subscribe().await.unwrap();
    // (In any order: the aborted pool's task gives them back as it unwinds.)
    let mut got = Vec::new();
    for _ in seqs.clone() {
        let j = next_job(&mut sub).await;
        got.push((j.seq(), j.attempt()));
        j.ack_durable().await.unwrap();
    }
    got.sort_unstable();
    assert_eq!(got, seqs.map(|s| (s, 1)).collect::<Vec<_>>(), "an attempt was counted");
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert!(dlq.list(10).await.unwrap().is_empty(), "nothing was dead-lettered");
    broker.shutdown().await.unwrap();
}
