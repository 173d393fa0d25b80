//! Worker pools: handler results decide outcomes, panics count as failed attempts, the
//! concurrency limit holds, and shutdown drains then releases without counting.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use rockq::{CancellationToken, Event, HandlerError, ManualClock, RetryPolicy, Task};
use tokio::sync::{Barrier, Notify, mpsc};

fn immediate_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::default().max_attempts(max_attempts).backoff(Duration::ZERO, Duration::ZERO).jitter(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_results_decide_outcomes_and_panics_count_as_failed_attempts() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    let payloads = ["ok1", "panic", "retry", "ok2", "dead", "ok3"];
    q.send_batch(payloads).await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(immediate_retries(2));
    let token = CancellationToken::new();
    let pool = group.workers(3).shutdown_on(token.clone());
    let run = tokio::spawn(pool.run(|task: Task| async move {
        match task.payload().as_ref() {
            b"panic" => panic!("handler blew up on {}", task.seq()),
            b"retry" => Err(HandlerError::retry_after("try again", Duration::ZERO)),
            b"dead" => Err(HandlerError::dead_letter("unprocessable")),
            _ => Ok(()),
        }
    }));

    let (mut acked, mut dead) = (Vec::new(), Vec::new());
    while acked.len() + dead.len() < payloads.len() {
        match wait_event(&mut events, |e| matches!(e, Event::Acked { .. } | Event::DeadLettered { .. })).await
        {
            Event::Acked { seq, .. } => acked.push(seq),
            Event::DeadLettered { seq, attempts, reason, .. } => dead.push((seq, attempts, reason)),
            _ => unreachable!(),
        }
    }
    token.cancel();
    let report = tokio::time::timeout(HANG_GUARD, run).await.unwrap().unwrap().unwrap();

    acked.sort();
    dead.sort();
    assert_eq!(acked, [1, 4, 6]);
    assert_eq!(dead.len(), 3);
    assert_eq!((dead[0].0, dead[0].1), (2, 2), "panic twice, then dead");
    assert!(dead[0].2.contains("handler panicked: handler blew up on 2"), "{}", dead[0].2);
    assert_eq!((dead[1].0, dead[1].1), (3, 2), "retry twice, then dead");
    assert_eq!((dead[2].0, dead[2].1, dead[2].2.as_str()), (5, 1, "unprocessable"));
    assert_eq!((report.acked, report.failed, report.panicked, report.released), (3, 3, 2, 0));
    assert_eq!(group.committed(), Some(6));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_exactly_its_concurrency_at_once() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((0..40).map(|i| format!("{i}"))).await.unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    // The first four handlers meet at a barrier: the pool must run four at once or hang.
    let barrier = Arc::new(Barrier::new(4));
    let token = CancellationToken::new();
    let handler = {
        let (running, peak, done, barrier, token) =
            (running.clone(), peak.clone(), done.clone(), barrier.clone(), token.clone());
        move |task: Task| {
            let (running, peak, done, barrier, token) =
                (running.clone(), peak.clone(), done.clone(), barrier.clone(), token.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                if task.seq() <= 4 {
                    barrier.wait().await;
                }
                tokio::task::yield_now().await;
                running.fetch_sub(1, Ordering::SeqCst);
                if done.fetch_add(1, Ordering::SeqCst) + 1 == 40 {
                    token.cancel();
                }
                Ok(())
            }
        }
    };
    let group = q.work_group("w").unwrap();
    let report = tokio::time::timeout(HANG_GUARD, group.workers(4).shutdown_on(token).run(handler))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.acked, 40);
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert_eq!(group.committed(), Some(40));
    broker.shutdown().await.unwrap();
}

/// Handler that reports its start and then waits for `go` (or forever, for payload "stuck").
fn gated(
    started: mpsc::UnboundedSender<u64>,
    go: Arc<Notify>,
) -> impl Fn(Task) -> futures::future::BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static {
    use futures::FutureExt;
    move |task: Task| {
        let (started, go) = (started.clone(), go.clone());
        async move {
            // Registered before reporting the start, so no `notify_waiters` can be missed.
            let notified = go.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            started.send(task.seq()).unwrap();
            if task.payload().as_ref() == b"stuck" {
                futures::future::pending::<()>().await;
            }
            notified.await;
            Ok(())
        }
        .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_pool_lets_running_handlers_finish() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let (tx, mut started) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let group = q.work_group("w").unwrap();
    let run = tokio::spawn(group.workers(2).shutdown_on(token.clone()).run(gated(tx, go.clone())));
    started.recv().await.unwrap();
    started.recv().await.unwrap();
    token.cancel();
    go.notify_waiters(); // both finish during the drain (the clock never moves)
    let report = tokio::time::timeout(HANG_GUARD, run).await.unwrap().unwrap().unwrap();
    assert_eq!((report.acked, report.released), (2, 0));
    assert_eq!(group.committed(), Some(2));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_still_running_at_the_drain_deadline_are_released_without_counting() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("stuck").await.unwrap();
    let (tx, mut started) = mpsc::unbounded_channel();
    let token = CancellationToken::new();
    let group = q.work_group("w").unwrap();
    let pool = group.workers(1).shutdown_on(token.clone()).drain_timeout(Duration::ZERO);
    let run = tokio::spawn(pool.run(gated(tx, Arc::new(Notify::new()))));
    assert_eq!(started.recv().await, Some(seq));
    token.cancel();
    let report = tokio::time::timeout(HANG_GUARD, run).await.unwrap().unwrap().unwrap();
    assert_eq!((report.acked, report.released), (0, 1));

    let mut sub = group.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (seq, 1), "the stopped attempt was not counted");
    j.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_shutdown_waits_for_pools_to_drain_and_their_acks_land() {
    let dir = tempdir();
    let (seq, committed);
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("jobs").await.unwrap();
        seq = q.send("a").await.unwrap();
        let (tx, mut started) = mpsc::unbounded_channel();
        let go = Arc::new(Notify::new());
        let run = tokio::spawn(q.work_group("w").unwrap().workers(1).run(gated(tx, go.clone())));
        started.recv().await.unwrap();
        let shutdown = tokio::spawn({
            let broker = broker.clone();
            async move { broker.shutdown().await }
        });
        go.notify_one();
        let report = tokio::time::timeout(HANG_GUARD, run).await.unwrap().unwrap().unwrap();
        assert_eq!(report.acked, 1);
        tokio::time::timeout(HANG_GUARD, shutdown).await.unwrap().unwrap().unwrap();
        committed = q.work_group("w").unwrap().committed();
    }
    assert_eq!(committed, Some(seq));
    let broker = open(dir.path()).await;
    assert_eq!(broker.queue("jobs").await.unwrap().work_group("w").unwrap().committed(), Some(seq));
    broker.shutdown().await.unwrap();
}

/// A handler as a type, through the `Handler` trait.
struct Upper(Arc<std::sync::Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl rockq::Handler for Upper {
    async fn handle(&self, task: Task, _: &()) -> Result<(), HandlerError> {
        let text = std::str::from_utf8(task.payload())?;
        self.0.lock().unwrap().push(text.to_uppercase());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_type_works_and_question_mark_retries() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch([&b"abc"[..], &[0xff, 0xfe][..]]).await.unwrap();
    let out = Arc::new(std::sync::Mutex::new(Vec::new()));
    let token = CancellationToken::new();
    let group = q.work_group("w").unwrap().retry_policy(RetryPolicy::default().max_attempts(1));
    let run = tokio::spawn(group.workers(2).shutdown_on(token.clone()).run(Upper(out.clone())));
    let (mut acked, mut dead) = (None, None);
    while acked.is_none() || dead.is_none() {
        match wait_event(&mut events, |e| matches!(e, Event::Acked { .. } | Event::DeadLettered { .. })).await
        {
            e @ Event::Acked { .. } => acked = Some(e),
            e => dead = Some(e),
        }
    }
    assert!(matches!(acked, Some(Event::Acked { seq: 1, .. })));
    let dead = dead.unwrap();
    assert!(
        matches!(dead, Event::DeadLettered { seq: 2, ref reason, .. } if reason.contains("utf-8")),
        "{dead:?}"
    );
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(*out.lock().unwrap(), ["ABC"]);
    broker.shutdown().await.unwrap();
}

/// Yields until `cond` holds; fails with `what` after the hang guard.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    tokio::time::timeout(HANG_GUARD, async {
        while !cond() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect(what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_a_long_handler_lease_alive() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send("long").await.unwrap();
    let (tx, mut tasks) = mpsc::unbounded_channel::<Task>();
    let go = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(9));
    let handler = {
        let go = go.clone();
        move |task: Task| {
            let (tx, go) = (tx.clone(), go.clone());
            async move {
                tx.send(task).unwrap();
                go.notified().await;
                Ok(())
            }
        }
    };
    // No prefetch: the pool must not claim the sentinel below while its one handler is busy.
    let pool = group.workers(1).prefetch(0).heartbeat(true).shutdown_on(token.clone());
    let run = tokio::spawn(pool.run(handler));
    let task = tasks.recv().await.unwrap();
    // Four steps of 4 s: 16 s in all, well past the 9 s lease; the heartbeat (every 3 s)
    // extends it after each step. Each step waits until the extension happened.
    for _ in 0..4 {
        clock.advance(Duration::from_secs(4));
        // The clock stands still between advances: a renewed lease has exactly 9 s left.
        wait_until("no heartbeat", || task.lease_remaining() >= Duration::from_secs(9)).await;
    }
    let mut other = group.subscribe().await.unwrap();
    let sentinel = q.send("sentinel").await.unwrap();
    let s = next_job(&mut other).await;
    assert_eq!(s.seq(), sentinel, "the heartbeated message stayed with its holder");
    s.ack_durable().await.unwrap();
    go.notify_one();
    wait_until("the long handler's ack did not land", || group.committed() == Some(sentinel)).await;
    token.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.acked, report.unsettled), (1, 0));
    assert!(seq < sentinel);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_waited_in_the_pool_starts_with_a_full_lease() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seqs: Vec<u64> = q.send_batch(["first", "second", "third"]).await.unwrap().collect();
    let (tx, mut tasks) = mpsc::unbounded_channel::<Task>();
    let go = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let lease = Duration::from_secs(10);
    let group = q.work_group("w").unwrap().lease(lease);
    let handler = handing_over(tx, go.clone());
    // One handler and a prefetch of one: the second job is claimed while the first runs, and
    // waits in the pool for it.
    let run = tokio::spawn(group.clone().workers(1).prefetch(1).shutdown_on(token.clone()).run(handler));
    let first = tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap();
    assert_eq!(first.seq(), seqs[0]);
    wait_until("the second job was never claimed ahead", || group.in_flight() >= 2).await;
    // The clock stands still: a job handed out at once has its whole lease.
    assert_eq!(first.lease_remaining(), lease);
    // The second job's lease runs while it waits: 4 s of 10 left when its handler starts...
    clock.advance(Duration::from_secs(6));
    go.notify_one();
    let second = tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap();
    assert_eq!(second.seq(), seqs[1]);
    // ... renewed to the whole lease as it starts.
    assert_eq!(second.lease_remaining(), lease, "the handler got what was left of the lease");
    // The third is claimed under the 10 s lease; shortened before it starts, the group's lease
    // as it stands applies to it.
    wait_until("the third job was never claimed ahead", || group.in_flight() >= 2).await;
    let short = Duration::from_secs(5);
    q.work_group("w").unwrap().lease(short).update().await.unwrap();
    go.notify_one();
    let third = tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap();
    assert_eq!((third.seq(), third.lease_remaining()), (seqs[2], short));
    go.notify_one();
    wait_until("the acks did not land", || group.committed() == Some(seqs[2])).await;
    token.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.acked, report.unsettled), (3, 0));
    broker.shutdown().await.unwrap();
}

// Jobs claimed ahead wait in the pool's feed (up to 16 a worker) as well as in the
// subscription's buffer: one whose lease ran out there is given back unrun, not run under a
// lost lease (its outcome would be refused, and the job run twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_lease_ran_out_while_it_waited_in_the_pool_is_not_run_under_it() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let seqs: Vec<u64> = q.send_batch(["a", "b", "c", "d", "e"]).await.unwrap().collect();
    let (tx, mut tasks) = mpsc::unbounded_channel::<Task>();
    let go = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let lease = Duration::from_secs(10);
    let group = q.work_group("w").unwrap().lease(lease);
    // One handler and four claimed ahead: they wait in the feed while the first runs.
    let run = tokio::spawn(
        group.clone().workers(1).prefetch(4).shutdown_on(token.clone()).run(handing_over(tx, go.clone())),
    );
    let first = tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap();
    assert_eq!(first.seq(), seqs[0]);
    wait_until("the others were never claimed ahead", || group.in_flight() >= 5).await;
    // The running job keeps its lease; the waiting ones' run out.
    first.extend(Duration::from_secs(60)).unwrap();
    clock.advance(lease + Duration::from_secs(1));
    let mut seen = vec![(first.seq(), first.attempt())];
    while seen.len() < seqs.len() {
        go.notify_one();
        let t = tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap();
        assert!(!t.lease_remaining().is_zero(), "job {} was run under a lease that had run out", t.seq());
        seen.push((t.seq(), t.attempt()));
    }
    go.notify_one();
    wait_until("the acks did not land", || group.committed() == Some(seqs[4])).await;
    token.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.acked, report.unsettled), (5, 0), "{seen:?}");
    // Each ran once. (The lapsed ones at attempt 1 or 2: their release races the group's
    // expiry, which counts a lease that ran out.)
    let mut ran: Vec<u64> = seen.iter().map(|&(s, _)| s).collect();
    ran.sort();
    assert_eq!(ran, seqs, "{seen:?}");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_handlers_stay_busy_reports_saturation() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let (tx, mut started) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let token = CancellationToken::new();
    let group = q.work_group("w").unwrap().saturation_after(Duration::from_secs(1));
    let run = tokio::spawn(group.workers(1).shutdown_on(token.clone()).run(gated(tx, go.clone())));
    started.recv().await.unwrap();
    clock.advance(Duration::from_secs(1));
    let e = wait_event(&mut events, |e| matches!(e, Event::Saturated { .. })).await;
    assert!(matches!(e, Event::Saturated { max_in_flight: 1, .. }));
    assert_eq!(group.saturations(), 1);
    go.notify_one();
    started.recv().await.unwrap();
    go.notify_one();
    wait_event(&mut events, |e| matches!(e, Event::Acked { seq: 2, .. })).await;
    token.cancel();
    assert_eq!(run.await.unwrap().unwrap().acked, 2);
    broker.shutdown().await.unwrap();
}

// Regression guard for the pool's shared feed: jobs go to whichever handler is free, so one
// stuck job never holds up the jobs claimed with it (handing each worker a batch would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_job_does_not_hold_up_the_jobs_claimed_with_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let payloads: Vec<String> =
        std::iter::once("stuck".to_string()).chain((1..=40).map(|i| format!("m{i}"))).collect();
    q.send_batch(payloads).await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Notify::new());
    let handler = {
        let (done, all) = (done.clone(), all.clone());
        move |task: Task| {
            let (done, all) = (done.clone(), all.clone());
            async move {
                if task.payload().as_ref() == b"stuck" {
                    futures::future::pending::<()>().await;
                }
                if done.fetch_add(1, Ordering::SeqCst) + 1 == 40 {
                    all.notify_one();
                }
                Ok(())
            }
        }
    };
    // Prefetch 40: the stuck job and all the others are claimed in one batch.
    let pool = q.work_group("w").unwrap().workers(2).prefetch(40).spawn(handler);
    tokio::time::timeout(HANG_GUARD, all.notified())
        .await
        .expect("the other jobs waited behind the stuck one");
    assert_eq!(done.load(Ordering::SeqCst), 40);
    pool.abort();
    broker.shutdown().await.unwrap();
}

// A pool with the default (adaptive) prefetch that drains a backlog, stopped by its token,
// reports exactly the jobs it ran, commits them all, and leaves nothing leased: the permits it
// holds back from its subscription are never jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_pool_drains_a_backlog_and_leaves_nothing_leased() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    // A backlog large enough that the pool grows and shrinks several times on RocksDB; a tenth of
    // it on etcd (see `against_etcd`).
    let n = if against_etcd() { 2_000u64 } else { 20_000 };
    // Calls of 1,000: on etcd (scripts/etcd-semantics.sh) larger than a transaction, so
    // reserved.
    for chunk in 0..n / 1000 {
        q.send_batch((chunk * 1000..(chunk + 1) * 1000).map(|i| format!("m{i}"))).await.unwrap();
    }
    let done = Arc::new(AtomicUsize::new(0));
    let token = CancellationToken::new();
    let handler = {
        let (done, token) = (done.clone(), token.clone());
        move |_task: Task| {
            if done.fetch_add(1, Ordering::SeqCst) + 1 == n as usize {
                token.cancel();
            }
            async { Ok(()) }
        }
    };
    let group = q.work_group("w").unwrap();
    let report = tokio::time::timeout(HANG_GUARD, group.workers(4).shutdown_on(token).run(handler))
        .await
        .expect("pool hung")
        .unwrap();
    assert_eq!((report.acked, report.failed, report.unsettled), (n, 0, 0));
    assert_eq!(group.committed(), Some(n));
    assert_eq!(group.in_flight(), 0);
    assert!(broker.pending("jobs", "w").await.unwrap().is_empty());
    broker.shutdown().await.unwrap();
}
