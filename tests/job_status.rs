//! Where one job of a work group stands (`Broker::job`) and waiting for it to finish
//! (`Broker::wait_job`), against a real database on a `ManualClock`: every state a job passes
//! through with its attempts, last error, holder and remaining times; what survives a restart;
//! what retention's deletions look like; that a wait ends exactly when the job is final (polled
//! by hand: pending after every step before); and that a lookup of what does not exist is a
//! typed error that changes nothing. Run against etcd too (scripts/etcd-semantics.sh).

mod common;

use std::time::Duration;

use common::{
    JOB_BACKOFF as BACKOFF, JOB_LEASE as LEASE, jobs_setup as setup, next_job, open_clock, tempdir,
};
use rockq::{Broker, ErrorKind, JobState, JobStatus, ManualClock, Retention, WorkGroup};

/// The shared test group, its consumer named so that holders can be checked.
async fn workers(broker: &Broker) -> WorkGroup {
    common::hourly_workers(broker).await.consumer_name("worker-a")
}

async fn status(broker: &Broker, seq: u64) -> JobStatus {
    broker.job("jobs", "workers", seq).await.unwrap()
}

/// State, attempts, last error and holder, for one comparison.
fn summary(s: &JobStatus) -> (JobState, u32, Option<&str>, Option<&str>) {
    (s.state, s.attempt, s.last_error.as_deref(), s.holder.as_deref())
}

#[tokio::test]
async fn a_job_is_queued_leased_waiting_for_a_retry_expired_and_finished_with_its_attempts() {
    let (_dir, clock, broker) = setup(1).await;
    let wg = workers(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 1);
    // The claim's record (which names the holder) is written by the writer's next round.
    broker.flush().await.unwrap();
    let s = status(&broker, 1).await;
    assert_eq!(s.seq, 1);
    assert_eq!(summary(&s), (JobState::Leased { lease_remaining: LEASE }, 1, None, Some("worker-a")));
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        status(&broker, 1).await.state,
        JobState::Leased { lease_remaining: LEASE - Duration::from_secs(10) }
    );

    // Failed: waits for its retry, with the error, held by nobody.
    j.fail_durable("downstream 503").await.unwrap();
    let s = status(&broker, 1).await;
    assert_eq!(summary(&s), (JobState::RetryWaiting { due_in: BACKOFF }, 1, Some("downstream 503"), None));
    clock.advance(BACKOFF - Duration::from_secs(1));
    assert_eq!(status(&broker, 1).await.state, JobState::RetryWaiting { due_in: Duration::from_secs(1) });
    // Due: queued again, its attempts and error kept.
    clock.advance(Duration::from_secs(1));
    let s = status(&broker, 1).await;
    assert_eq!(summary(&s), (JobState::Queued, 1, Some("downstream 503"), None));

    // The second attempt's lease runs out: expired, still naming who held it.
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (1, 2));
    broker.flush().await.unwrap();
    assert_eq!(status(&broker, 1).await.holder.as_deref(), Some("worker-a"));
    clock.advance(LEASE);
    let s = status(&broker, 1).await;
    assert_eq!((s.state, s.attempt, s.holder.as_deref()), (JobState::Expired, 2, Some("worker-a")));
    assert!(!s.state.is_final());
    drop(j); // (its in-flight place; the lease is gone already)

    // The third attempt acks: settling until the writer has it, then finished.
    let j = next_job(&mut sub).await;
    assert_eq!(j.attempt(), 3);
    j.ack().unwrap();
    let state = status(&broker, 1).await.state;
    assert!(matches!(state, JobState::Settling | JobState::Finished), "{state:?}");
    broker.flush().await.unwrap();
    let s = status(&broker, 1).await;
    assert_eq!(summary(&s), (JobState::Finished, 0, None, None));
    assert!(s.state.is_final());
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn jobs_never_claimed_are_queued_and_a_lookup_changes_nothing() {
    let (_dir, _clock, broker) = setup(4).await;
    let wg = workers(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    // Ahead of everything claimed: queued, no attempts.
    for seq in [3, 4] {
        assert_eq!(summary(&status(&broker, seq).await), (JobState::Queued, 0, None, None));
    }
    // The lookups moved nothing: the jobs still come in order, each on its first attempt.
    let mut seen = Vec::new();
    for _ in 0..4 {
        let j = next_job(&mut sub).await;
        seen.push((j.seq(), j.attempt()));
        j.ack_durable().await.unwrap();
    }
    assert_eq!(seen, [(1, 1), (2, 1), (3, 1), (4, 1)]);
    for seq in 1..=4 {
        assert_eq!(status(&broker, seq).await.state, JobState::Finished);
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn attempts_errors_and_retry_times_survive_a_restart_and_a_lease_held_at_the_stop_is_queued() {
    let (dir, clock, broker) = setup(2).await;
    let mut sub = workers(&broker).await.subscribe().await.unwrap();
    next_job(&mut sub).await.fail_durable("bad gateway").await.unwrap();
    let held = next_job(&mut sub).await;
    assert_eq!(held.seq(), 2);
    broker.flush().await.unwrap();
    drop(held);
    drop(sub);
    broker.shutdown().await.unwrap();

    let broker = open_clock(dir.path(), &clock).await;
    let _sub = workers(&broker).await.subscribe().await.unwrap();
    clock.advance(Duration::from_secs(60));
    let s = status(&broker, 1).await;
    assert_eq!(
        summary(&s),
        (JobState::RetryWaiting { due_in: BACKOFF - Duration::from_secs(60) }, 1, Some("bad gateway"), None)
    );
    // Nobody holds a lease from before the restart: claimable at once, its attempt counted.
    let s = status(&broker, 2).await;
    assert!(matches!(s.state, JobState::Queued | JobState::Expired), "{s:?}");
    assert_eq!(s.attempt, 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn dead_lettered_and_deleted_jobs_are_finished_and_retention_deletions_are_removed() {
    let (_dir, _clock, broker) = setup(5).await;
    let wg = workers(&broker).await;
    drop(wg.subscribe().await.unwrap());
    broker.dead_letter_job("jobs", "workers", 1, "parked by ops").await.unwrap();
    broker.delete_job("jobs", "workers", 2).await.unwrap();
    broker.flush().await.unwrap();
    for seq in [1, 2] {
        assert_eq!(summary(&status(&broker, seq).await), (JobState::Finished, 0, None, None));
    }
    assert_eq!(status(&broker, 3).await.state, JobState::Queued);
    // Retention keeps the last message: 1 to 4 are deleted, finished or not.
    let q = broker.queue("jobs").await.unwrap();
    q.set_retention(Retention::MaxLen(1)).await.unwrap();
    assert_eq!(broker.trim().await.unwrap().deleted, 4);
    for seq in 1..=4 {
        let s = status(&broker, seq).await;
        assert_eq!(summary(&s), (JobState::Removed, 0, None, None), "job {seq}");
        assert!(s.state.is_final());
    }
    assert_eq!(status(&broker, 5).await.state, JobState::Queued);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn in_a_group_ordered_by_key_a_job_behind_its_key_is_parked() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let jobs = broker.queue("jobs").await.unwrap();
    for key in ["a", "a", "b"] {
        jobs.send(rockq::Message::new("x").key(key)).await.unwrap();
    }
    let wg =
        jobs.work_group("workers").unwrap().lease(LEASE).ordered_by_key(true).read_batch(3).max_in_flight(3);
    let mut sub = wg.subscribe().await.unwrap();
    let first = next_job(&mut sub).await;
    let other = next_job(&mut sub).await;
    assert_eq!((first.seq(), other.seq()), (1, 3));
    assert_eq!(status(&broker, 2).await.state, JobState::Parked);
    first.ack_durable().await.unwrap();
    let next = next_job(&mut sub).await;
    assert_eq!(next.seq(), 2);
    assert!(matches!(status(&broker, 2).await.state, JobState::Leased { .. }));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn what_does_not_exist_is_a_typed_error() {
    let (_dir, _clock, broker) = setup(2).await;
    // No work group yet.
    let e = broker.job("jobs", "workers", 1).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "{e}");
    let _sub = workers(&broker).await.subscribe().await.unwrap();
    // Never sent.
    for seq in [0, 3, u64::MAX] {
        let e = broker.job("jobs", "workers", seq).await.unwrap_err();
        assert!(matches!(e, rockq::Error::NoSuchJob { .. }), "{seq}: {e}");
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
    // An ordered group has no jobs; no such queue; bad names.
    let q = broker.queue("jobs").await.unwrap();
    drop(q.group("billing").unwrap().subscribe().await.unwrap());
    let e = broker.job("jobs", "billing", 1).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "{e}");
    let e = broker.job("nothing", "workers", 1).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "{e}");
    for (queue, group) in [("bad name!", "workers"), ("jobs", ""), ("jobs", "bad/name")] {
        let e = broker.job(queue, group, 1).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{queue:?} {group:?}: {e}");
    }
    // A deleted group; then after shutdown.
    drop(_sub);
    broker.delete_group("jobs", "workers").await.unwrap();
    let e = broker.job("jobs", "workers", 1).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Deleted | ErrorKind::NotFound), "{e}");
    broker.shutdown().await.unwrap();
    let e = broker.job("jobs", "workers", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shutdown, "{e}");
}

#[tokio::test]
async fn a_wait_ends_when_the_job_is_finished_and_not_before() {
    let (_dir, clock, broker) = setup(2).await;
    let wg = workers(&broker).await.max_in_flight(2);
    let mut sub = wg.subscribe().await.unwrap();
    let mut wait = Box::pin(broker.wait_job("jobs", "workers", 1));
    assert!(futures::poll!(&mut wait).is_pending(), "queued");
    let j = next_job(&mut sub).await;
    broker.flush().await.unwrap();
    assert!(futures::poll!(&mut wait).is_pending(), "leased");
    j.fail_durable("flaky").await.unwrap();
    assert!(futures::poll!(&mut wait).is_pending(), "waiting for its retry");
    clock.advance(BACKOFF);
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (1, 2));
    // Another job finishing does not end this wait.
    let other = next_job(&mut sub).await;
    assert_eq!(other.seq(), 2);
    other.ack_durable().await.unwrap();
    assert!(futures::poll!(&mut wait).is_pending(), "job 2 finished, not job 1");
    // The ack: the wait ends once it is durable, woken by the writer (no clock moves).
    j.ack().unwrap();
    let done = tokio::time::timeout(common::HANG_GUARD, wait).await.expect("the wait was not woken").unwrap();
    assert_eq!((done.seq, done.state), (1, JobState::Finished));
    assert_eq!(status(&broker, 1).await.state, JobState::Finished);
    // Already final: at once.
    assert_eq!(broker.wait_job("jobs", "workers", 2).await.unwrap().state, JobState::Finished);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_wait_ends_with_a_dead_letter_a_removal_a_deletion_or_the_shutdown() {
    let (_dir, _clock, broker) = setup(3).await;
    drop(workers(&broker).await.subscribe().await.unwrap());
    // Dead-lettered by an operator: finished.
    let mut wait = Box::pin(broker.wait_job("jobs", "workers", 1));
    assert!(futures::poll!(&mut wait).is_pending());
    broker.dead_letter_job("jobs", "workers", 1, "bad data").await.unwrap();
    let s = tokio::time::timeout(common::HANG_GUARD, wait).await.unwrap().unwrap();
    assert_eq!(s.state, JobState::Finished);
    // Deleted by retention before it ran: removed.
    let mut wait = Box::pin(broker.wait_job("jobs", "workers", 2));
    assert!(futures::poll!(&mut wait).is_pending());
    let q = broker.queue("jobs").await.unwrap();
    q.set_retention(Retention::MaxLen(1)).await.unwrap();
    broker.trim().await.unwrap();
    let s = tokio::time::timeout(common::HANG_GUARD, wait).await.unwrap().unwrap();
    assert_eq!(s.state, JobState::Removed);
    // The group deleted under a wait, or the broker shut down.
    let mut wait = Box::pin(broker.wait_job("jobs", "workers", 3));
    assert!(futures::poll!(&mut wait).is_pending());
    broker.delete_group("jobs", "workers").await.unwrap();
    let e = tokio::time::timeout(common::HANG_GUARD, wait).await.unwrap().unwrap_err();
    assert!(matches!(e, rockq::Error::GroupDeleted { .. }), "{e}");
    drop(workers(&broker).await.subscribe().await.unwrap());
    wait = Box::pin(broker.wait_job("jobs", "workers", 3));
    assert!(futures::poll!(&mut wait).is_pending());
    let (stop, e) = tokio::join!(broker.shutdown(), wait);
    stop.unwrap();
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Shutdown);
    let e = broker.wait_job("jobs", "workers", 3).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shutdown);
}

#[tokio::test]
async fn a_wait_ends_as_the_shutdown_starts_not_after_the_pools_drained() {
    let (_dir, _clock, broker) = setup(1).await;
    // A handler that holds its job until the test lets it go: the shutdown's drain waits for it.
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let gate = release.clone();
    let _pool = workers(&broker).await.workers(1).spawn(move |task: rockq::Task| {
        let (started_tx, gate) = (started_tx.clone(), gate.clone());
        async move {
            let _ = started_tx.send(task.seq());
            let _permit = gate.acquire().await;
            Ok(())
        }
    });
    assert_eq!(tokio::time::timeout(common::HANG_GUARD, started.recv()).await.unwrap(), Some(1));
    let wait = broker.wait_job("jobs", "workers", 1);
    // One task polls both (current-thread runtime): the wait must give up as the shutdown
    // starts, so that the shutdown gets polled again and the handler is let go.
    let (stopped, waited) = tokio::time::timeout(common::HANG_GUARD, async {
        tokio::join!(broker.shutdown(), async {
            let r = wait.await;
            release.add_permits(1);
            r
        })
    })
    .await
    .expect("the wait held the shutdown up");
    stopped.unwrap();
    assert_eq!(waited.unwrap_err().kind(), ErrorKind::Shutdown);
}
