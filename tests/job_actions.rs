//! An operator's actions on one job of a work group (`Broker::retry_job_now`, `delete_job`,
//! `dead_letter_job`), against a real database on a `ManualClock`: what each does to the job,
//! what it refuses (and that a refusal changes nothing), that a live lease is never taken from
//! its holder while an expired one is fenced, and that the result survives a restart.

mod common;

use std::time::Duration;

use common::{
    JOB_BACKOFF as BACKOFF, JOB_LEASE as LEASE, hourly_workers as workers, jobs_setup as setup, next_job,
    open_clock, tempdir,
};
use rockq::{ErrorKind, ManualClock};

fn group(stats: &rockq::Stats) -> &rockq::GroupStats {
    stats.groups.iter().find(|g| g.group == "workers").unwrap()
}

#[tokio::test]
async fn retry_now_makes_a_waiting_job_claimable_at_once_with_its_attempts_and_across_a_restart() {
    let (dir, clock, broker) = setup(1).await;
    let mut sub = workers(&broker).await.subscribe().await.unwrap();
    next_job(&mut sub).await.fail_durable("downstream 503").await.unwrap();
    drop(sub);
    let p = broker.pending("jobs", "workers").await.unwrap();
    assert!(p[0].retry_at.unwrap() > clock.wall_time() + BACKOFF / 2, "waits an hour: {p:?}");

    broker.retry_job_now("jobs", "workers", 1).await.unwrap();
    let p = broker.pending("jobs", "workers").await.unwrap();
    assert_eq!((p.len(), p[0].attempt, p[0].last_error.as_deref()), (1, 1, Some("downstream 503")));
    assert!(p[0].retry_at.unwrap() <= clock.wall_time(), "due now: {p:?}");

    // Durable: reopened, the job is due now, not in an hour.
    broker.shutdown().await.unwrap();
    let broker = open_clock(dir.path(), &clock).await;
    let mut sub = workers(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (1, 2), "the next attempt, no clock moved");
    j.ack_durable().await.unwrap();
    assert_eq!(group(&broker.stats().await.unwrap()).committed, 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_finishes_a_job_without_running_it_and_the_others_still_run() {
    let (_dir, _clock, broker) = setup(5).await;
    let wg = workers(&broker).await;
    // Created, nothing claimed yet: delete 3 before any worker saw it.
    let sub = wg.subscribe().await.unwrap();
    drop(sub);
    broker.delete_job("jobs", "workers", 3).await.unwrap();
    let mut sub = wg.subscribe().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let j = next_job(&mut sub).await;
        seen.push(j.seq());
        j.ack_durable().await.unwrap();
    }
    assert_eq!(seen, [1, 2, 4, 5], "3 never ran");
    let g = group(&broker.stats().await.unwrap()).clone();
    assert_eq!((g.committed, g.lag), (5, 0));
    // Finished: a second delete finds no job.
    let e = broker.delete_job("jobs", "workers", 3).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchJob { seq: 3, .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn dead_letter_moves_the_job_with_its_reason_and_the_group_moves_past_it() {
    let (_dir, _clock, broker) = setup(2).await;
    let mut sub = workers(&broker).await.subscribe().await.unwrap();
    next_job(&mut sub).await.fail_durable("bad address").await.unwrap();
    broker.dead_letter_job("jobs", "workers", 1, "parked by ops").await.unwrap();
    let letters = broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    let d = &letters[0];
    assert_eq!(
        (d.queue.as_deref(), d.seq, d.group.as_deref(), d.attempts, d.reason.as_str(), &d.payload[..]),
        (Some("jobs"), Some(1), Some("workers"), 1, "parked by ops", &b"job 1"[..])
    );
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 2);
    j.ack_durable().await.unwrap();
    assert_eq!(group(&broker.stats().await.unwrap()).committed, 2);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_live_lease_is_refused_and_an_expired_one_is_fenced() {
    let (_dir, clock, broker) = setup(2).await;
    let mut sub = workers(&broker).await.subscribe().await.unwrap();
    let held = next_job(&mut sub).await;
    assert_eq!(held.seq(), 1);
    for e in [
        broker.delete_job("jobs", "workers", 1).await.unwrap_err(),
        broker.dead_letter_job("jobs", "workers", 1, "x").await.unwrap_err(),
        broker.retry_job_now("jobs", "workers", 1).await.unwrap_err(),
    ] {
        assert!(matches!(e, rockq::Error::JobState { state: "leased", seq: 1, .. }), "{e}");
        assert_eq!(e.kind(), ErrorKind::Conflict);
    }
    // Refused changed nothing: the holder still acks.
    held.ack_durable().await.unwrap();

    // An expired lease: the operator's delete wins, the old holder's ack is refused.
    let stale = next_job(&mut sub).await;
    assert_eq!(stale.seq(), 2);
    clock.advance(LEASE + Duration::from_secs(1));
    broker.delete_job("jobs", "workers", 2).await.unwrap();
    let e = stale.ack_durable().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LeaseLost, "{e}");
    assert_eq!(group(&broker.stats().await.unwrap()).committed, 2);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn what_an_action_does_not_apply_to_is_refused_with_a_typed_error_and_changes_nothing() {
    let (_dir, _clock, broker) = setup(3).await;
    let _sub = workers(&broker).await.subscribe().await.unwrap();
    // Not waiting for a retry: nothing to retry now.
    let e = broker.retry_job_now("jobs", "workers", 2).await.unwrap_err();
    assert!(matches!(e, rockq::Error::JobState { state: "claimable now", action: "retry now", .. }), "{e}");
    // Never sent.
    let e = broker.delete_job("jobs", "workers", 99).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchJob { seq: 99, .. }), "{e}");
    let e = broker.delete_job("jobs", "workers", 0).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchJob { seq: 0, .. }), "{e}");
    // No such group, an ordered group, a bad name.
    let e = broker.delete_job("jobs", "nobody", 1).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "{e}");
    let q = broker.queue("jobs").await.unwrap();
    drop(q.group("billing").unwrap().subscribe().await.unwrap());
    let e = broker.delete_job("jobs", "billing", 1).await.unwrap_err();
    assert!(matches!(e, rockq::Error::NoSuchGroup { .. }), "{e}");
    let e = broker.delete_job("jobs", "bad name!", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    // Nothing moved, nothing dead-lettered.
    let stats = broker.stats().await.unwrap();
    let g = group(&stats);
    assert_eq!((g.committed, g.lag, g.dlq_depth), (0, 3, 0));
    // After shutdown: refused.
    broker.shutdown().await.unwrap();
    let e = broker.delete_job("jobs", "workers", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shutdown, "{e}");
}

#[tokio::test]
async fn in_a_group_ordered_by_key_a_parked_job_can_be_deleted_and_its_key_goes_on_in_order() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let jobs = broker.queue("jobs").await.unwrap();
    for (i, key) in ["a", "a", "a", "b"].iter().enumerate() {
        jobs.send(rockq::Message::new(format!("job {}", i + 1)).key(*key)).await.unwrap();
    }
    let wg =
        jobs.work_group("workers").unwrap().lease(LEASE).ordered_by_key(true).read_batch(4).max_in_flight(4);
    let mut sub = wg.subscribe().await.unwrap();
    let first = next_job(&mut sub).await;
    let other = next_job(&mut sub).await;
    assert_eq!((first.seq(), other.seq()), (1, 4), "2 and 3 park behind 1");
    // 2 is parked behind key a's head: not leased, so it can be deleted.
    broker.delete_job("jobs", "workers", 2).await.unwrap();
    first.ack_durable().await.unwrap();
    other.ack_durable().await.unwrap();
    let next = next_job(&mut sub).await;
    assert_eq!(next.seq(), 3, "key a goes on with 3");
    next.ack_durable().await.unwrap();
    let stats = broker.stats().await.unwrap();
    assert_eq!(group(&stats).committed, 4);
    broker.shutdown().await.unwrap();
}
