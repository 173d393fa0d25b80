//! Kept job outcomes (`WorkGroup::keep_outcomes`) and handler results (`Task::set_result`),
//! against a real database on a `ManualClock`: how each way of finishing a job is recorded (an
//! ack with and without a result, alone or in a transaction, from a subscription or a pool; a
//! dead letter by the handler, by exhausted attempts or by an operator; an operator's delete),
//! that an outcome survives a restart and outlives its message, that a retention pass deletes
//! it only once its retention has passed, that the setting is stored and checked like the
//! group's others, and that a result the group would drop, or too large, is refused and changes
//! nothing. `scripts/etcd-semantics.sh` runs them against etcd as well (the Inspector there is
//! `Inspector::connect_etcd`), but those that need an import into a database directory, or a
//! reset of a work group while a dropped job's lease still runs (refused on etcd:
//! `docs/DISTRIBUTED.md`).

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{JOB_LEASE as LEASE, jobs_setup as setup, next_job, open_clock};
use rockq::{Broker, Bytes, ErrorKind, JobOutcome, JobState, ManualClock, OutcomeKind, Retention, WorkGroup};

const KEEP: Duration = Duration::from_secs(3600);

/// The shared test group, keeping outcomes for an hour.
async fn keeping(broker: &Broker) -> WorkGroup {
    common::hourly_workers(broker).await.keep_outcomes(KEEP)
}

async fn outcome(broker: &Broker, seq: u64) -> Option<JobOutcome> {
    let s = broker.job("jobs", "workers", seq).await.unwrap();
    if s.outcome.is_some() {
        assert_eq!(s.state, JobState::Finished, "a job with an outcome is finished");
    }
    s.outcome
}

/// Job `seq` as its records say (`Inspector::job`, beside the running broker): what a lookup
/// after a restart would find.
async fn recorded(dir: &std::path::Path, seq: u64) -> rockq::JobStatus {
    common::inspector(dir).await.job("jobs", "workers", seq).await.unwrap()
}

/// The clock's wall time as the writer stamps it (whole microseconds).
fn now(clock: &ManualClock) -> SystemTime {
    let micros = clock.wall_time().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    UNIX_EPOCH + Duration::from_micros(micros)
}

/// An outcome's fields, to compare (`JobOutcome` is non-exhaustive: not built outside rockq).
type Parts = (OutcomeKind, SystemTime, u32, Option<Bytes>);

fn parts(o: Option<JobOutcome>) -> Option<Parts> {
    o.map(|o| (o.kind, o.finished_at, o.attempt, o.result))
}

fn acked(at: SystemTime, attempt: u32, result: Option<&str>) -> Option<Parts> {
    Some((OutcomeKind::Acked, at, attempt, result.map(|r| Bytes::copy_from_slice(r.as_bytes()))))
}

#[tokio::test]
async fn an_ack_keeps_its_outcome_and_result_through_a_restart_and_past_its_message() {
    let (dir, clock, broker) = setup(3).await;
    let wg = keeping(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    // Attempt 1 of job 1 fails; nothing is kept for a retry.
    let j = next_job(&mut sub).await;
    j.set_result("not this one").unwrap();
    j.fail_durable("flaky").await.unwrap();
    assert_eq!(outcome(&broker, 1).await, None);
    assert_eq!(recorded(dir.path(), 1).await.outcome, None, "nothing written for a retry");
    clock.advance(common::JOB_BACKOFF);
    // Job 1, attempt 2: a result, acked durably.
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (1, 2));
    j.set_result("first").unwrap();
    j.set_result("thumb-1.webp").unwrap(); // the last one set counts
    let at1 = now(&clock);
    j.ack_durable().await.unwrap();
    assert_eq!(parts(outcome(&broker, 1).await), acked(at1, 2, Some("thumb-1.webp")));
    // Job 2: a queued ack without a result, a minute later.
    clock.advance(Duration::from_secs(60));
    let j = next_job(&mut sub).await;
    let at2 = now(&clock);
    j.ack().unwrap();
    broker.flush().await.unwrap();
    assert_eq!(parts(outcome(&broker, 2).await), acked(at2, 1, None));
    // Job 3 is not finished: no outcome.
    assert_eq!(outcome(&broker, 3).await, None);
    assert_eq!(parts(recorded(dir.path(), 2).await.outcome), acked(at2, 1, None));
    assert_eq!(recorded(dir.path(), 3).await.outcome, None);

    // Retention deletes the acked messages: their outcomes stay, so they are finished, not
    // removed.
    let q = broker.queue("jobs").await.unwrap();
    q.set_retention(Retention::UntilAcked).await.unwrap();
    drop(sub);
    assert_eq!(broker.trim().await.unwrap().deleted, 2);
    assert_eq!(parts(outcome(&broker, 1).await), acked(at1, 2, Some("thumb-1.webp")));
    broker.shutdown().await.unwrap();

    let broker = open_clock(dir.path(), &clock).await;
    drop(common::hourly_workers(&broker).await.subscribe().await.unwrap());
    assert_eq!(parts(outcome(&broker, 1).await), acked(at1, 2, Some("thumb-1.webp")));
    assert_eq!(parts(outcome(&broker, 2).await), acked(at2, 1, None));
    assert_eq!(broker.job("jobs", "workers", 3).await.unwrap().state, JobState::Queued);
    broker.shutdown().await.unwrap();

    // Read-only, from the records.
    let inspector = common::inspector(dir.path()).await;
    let s = inspector.job("jobs", "workers", 1).await.unwrap();
    assert_eq!((s.state, parts(s.outcome)), (JobState::Finished, acked(at1, 2, Some("thumb-1.webp"))));
    assert_eq!(inspector.job("jobs", "workers", 3).await.unwrap().outcome, None);
}

#[tokio::test]
async fn dead_letters_and_deletes_record_how_and_why() {
    let (_dir, clock, broker) = setup(4).await;
    let wg = keeping(&broker).await.retry_policy(
        rockq::RetryPolicy::default()
            .max_attempts(1)
            .backoff(common::JOB_BACKOFF, common::JOB_BACKOFF)
            .jitter(0.0),
    );
    let mut sub = wg.subscribe().await.unwrap();
    let at = now(&clock);
    // Job 1: the handler dead-letters it.
    next_job(&mut sub).await.dead_letter_durable("malformed address").await.unwrap();
    // Job 2: its only attempt fails.
    next_job(&mut sub).await.fail_durable("503 from upstream").await.unwrap();
    drop(sub);
    // Job 3: an operator dead-letters it, job 4: an operator deletes it (never claimed).
    broker.dead_letter_job("jobs", "workers", 3, "parked by ops").await.unwrap();
    broker.delete_job("jobs", "workers", 4).await.unwrap();
    broker.flush().await.unwrap();

    let letter = |reason: &str, dlq_seq: u64| OutcomeKind::DeadLettered {
        reason: reason.into(),
        dead_letter_queue: "jobs.dlq".into(),
        dead_letter_seq: dlq_seq,
    };
    let o = outcome(&broker, 1).await.unwrap();
    assert_eq!((o.kind, o.attempt, o.finished_at, o.result), (letter("malformed address", 1), 1, at, None));
    let o = outcome(&broker, 2).await.unwrap();
    let OutcomeKind::DeadLettered { reason, dead_letter_seq, .. } = &o.kind else { panic!("{o:?}") };
    assert!(reason.contains("503 from upstream"), "{reason}");
    assert_eq!((*dead_letter_seq, o.attempt), (2, 1));
    let o = outcome(&broker, 3).await.unwrap();
    assert_eq!((o.kind, o.attempt), (letter("parked by ops", 3), 0));
    let o = outcome(&broker, 4).await.unwrap();
    assert_eq!((o.kind.as_str(), o.attempt), ("deleted", 0));
    // Each recorded letter is the one in the dead-letter queue.
    let letters = broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    let seqs: Vec<_> = letters.iter().map(|l| (l.dlq_seq, l.seq)).collect();
    assert_eq!(seqs, [(1, Some(1)), (2, Some(2)), (3, Some(3))]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn pool_handlers_return_results_alone_and_with_their_transaction() {
    let (_dir, _clock, broker) = setup(4).await;
    let totals = broker.kv("totals").await.unwrap();
    let wg = keeping(&broker).await;
    wg.update().await.unwrap(); // the group exists before the waits start
    let ks = totals.clone();
    let pool = wg.max_in_flight(4).workers(2).spawn(move |task: rockq::Task| {
        let ks = ks.clone();
        async move {
            if task.seq().is_multiple_of(2) {
                // Even jobs write through their transaction: the result goes with that commit.
                task.tx().put(&ks, format!("job-{}", task.seq()), "done")?;
            }
            task.set_result(format!("result of {}", task.seq()))?;
            Ok::<_, rockq::HandlerError>(())
        }
    });
    for seq in 1..=4 {
        let s = tokio::time::timeout(common::HANG_GUARD, broker.wait_job("jobs", "workers", seq))
            .await
            .expect("the job finishes")
            .unwrap();
        let o = s.outcome.expect("kept");
        assert_eq!((o.kind, o.result), (OutcomeKind::Acked, Some(Bytes::from(format!("result of {seq}")))));
    }
    pool.shutdown().await.unwrap();
    assert!(totals.get("job-2").await.unwrap().is_some(), "the transaction committed");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn outcomes_go_once_their_retention_has_passed_and_all_go_when_the_group_stops_keeping_them() {
    let (_dir, clock, broker) = setup(4).await;
    // The messages stay: a job whose outcome went reads as finished, not removed.
    broker.queue("jobs").await.unwrap().set_retention(Retention::Forever).await.unwrap();
    let wg = keeping(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    for _ in 0..3 {
        next_job(&mut sub).await.ack_durable().await.unwrap();
    }
    clock.advance(KEEP / 2);
    next_job(&mut sub).await.ack_durable().await.unwrap();
    // Not yet an hour for any of them.
    assert_eq!(broker.trim().await.unwrap().outcomes_expired, 0);
    clock.advance(KEEP / 2 - Duration::from_secs(1));
    assert_eq!(broker.trim().await.unwrap().outcomes_expired, 0, "one second short");
    clock.advance(Duration::from_secs(1));
    assert_eq!(broker.trim().await.unwrap().outcomes_expired, 3);
    for seq in 1..=3 {
        let s = broker.job("jobs", "workers", seq).await.unwrap();
        assert_eq!((s.state, s.outcome), (JobState::Finished, None), "job {seq}");
    }
    assert!(outcome(&broker, 4).await.is_some());
    // A longer retention keeps the last one; turning it off deletes it at the next pass.
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.work_group("workers").unwrap().keep_outcomes(KEEP * 2).update().await.unwrap();
    clock.advance(KEEP);
    assert_eq!(broker.trim().await.unwrap().outcomes_expired, 0);
    assert!(outcome(&broker, 4).await.is_some());
    jobs.work_group("workers").unwrap().keep_outcomes(Duration::ZERO).update().await.unwrap();
    assert_eq!(broker.trim().await.unwrap().outcomes_expired, 1);
    assert_eq!(outcome(&broker, 4).await, None);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_result_the_group_would_drop_or_too_large_is_refused_and_changes_nothing() {
    let (_dir, _clock, broker) = setup(3).await;
    // A group that keeps no outcomes (the default).
    let mut sub = common::hourly_workers(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    let e = j.set_result("lost").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("keeps no outcomes"), "{e}");
    j.ack_durable().await.unwrap();
    let s = broker.job("jobs", "workers", 1).await.unwrap();
    assert_eq!((s.state, s.outcome), (JobState::Finished, None));
    drop(sub);

    // Kept from now on; a result over the maximum is refused and the one set before stays.
    keeping(&broker).await.update().await.unwrap();
    let mut sub = keeping(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    j.set_result("fits").unwrap();
    let e = j.set_result(vec![0u8; rockq::MAX_RESULT_BYTES + 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    j.extend(LEASE).unwrap(); // nothing changed: still this holder's
    j.ack_durable().await.unwrap();
    assert_eq!(outcome(&broker, 2).await.unwrap().result, Some(Bytes::from("fits")));
    // At the maximum: kept whole.
    let j = next_job(&mut sub).await;
    j.set_result(vec![7u8; rockq::MAX_RESULT_BYTES]).unwrap();
    j.ack_durable().await.unwrap();
    let o = outcome(&broker, 3).await.unwrap();
    assert_eq!(o.result, Some(Bytes::from(vec![7u8; rockq::MAX_RESULT_BYTES])));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_retention_is_stored_with_the_group_and_checked() {
    let (dir, clock, broker) = setup(1).await;
    drop(keeping(&broker).await.subscribe().await.unwrap());
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!(g.keep_outcomes, Some(KEEP));
    broker.shutdown().await.unwrap();

    let broker = open_clock(dir.path(), &clock).await;
    // Joined without naming it: the stored one applies (the ack below is kept).
    let mut sub = common::hourly_workers(&broker).await.subscribe().await.unwrap();
    next_job(&mut sub).await.ack_durable().await.unwrap();
    assert!(outcome(&broker, 1).await.is_some());
    // Named and different: refused, naming the setting.
    let e = common::hourly_workers(&broker).await.keep_outcomes(LEASE).subscribe().await.unwrap_err();
    assert!(
        matches!(&e, rockq::Error::SettingsMismatch { setting, .. } if *setting == "keep_outcomes"),
        "{e}"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn deleting_the_group_deletes_its_outcomes() {
    let (dir, _clock, broker) = setup(1).await;
    let mut sub = keeping(&broker).await.subscribe().await.unwrap();
    next_job(&mut sub).await.ack_durable().await.unwrap();
    drop(sub);
    assert!(outcome(&broker, 1).await.is_some());
    assert!(broker.delete_group("jobs", "workers").await.unwrap());
    // The same name again, from the start: job 1 is queued for it, with nothing kept.
    drop(keeping(&broker).await.subscribe().await.unwrap());
    let s = broker.job("jobs", "workers", 1).await.unwrap();
    assert_eq!((s.state, s.outcome), (JobState::Queued, None));
    let s = recorded(dir.path(), 1).await;
    assert_eq!((s.state, s.outcome), (JobState::Queued, None), "the record went with the group");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_reset_back_drops_the_outcomes_of_the_jobs_that_run_again_and_keeps_the_rest() {
    let (dir, clock, broker) = setup(2).await;
    broker.queue("jobs").await.unwrap().set_retention(Retention::Forever).await.unwrap();
    let mut sub = keeping(&broker).await.subscribe().await.unwrap();
    for _ in 0..2 {
        let j = next_job(&mut sub).await;
        j.set_result(format!("first run of {}", j.seq())).unwrap();
        j.ack_durable().await.unwrap();
    }
    drop(sub);
    // Run job 2 again: its old outcome must not make it read as finished.
    broker.reset_group("jobs", "workers", rockq::ResetTo::Sequence(2)).await.unwrap();
    for s in [broker.job("jobs", "workers", 2).await.unwrap(), recorded(dir.path(), 2).await] {
        assert_eq!((s.state, s.outcome), (JobState::Queued, None));
    }
    assert_eq!(outcome(&broker, 1).await.unwrap().result, Some(Bytes::from("first run of 1")));
    clock.advance(Duration::from_secs(5));
    let mut sub = keeping(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt()), (2, 1));
    j.set_result("second run").unwrap();
    let at = now(&clock);
    j.ack_durable().await.unwrap();
    let second = Some((OutcomeKind::Acked, at, 1, Some(Bytes::from("second run"))));
    assert_eq!(parts(outcome(&broker, 2).await), second);
    assert_eq!(parts(recorded(dir.path(), 2).await.outcome), second);
    broker.shutdown().await.unwrap();
}

async fn progress(broker: &Broker, seq: u64) -> Option<Bytes> {
    broker.job("jobs", "workers", seq).await.unwrap().progress
}

#[tokio::test]
async fn progress_is_seen_at_once_written_by_the_next_round_and_read_back_by_the_next_attempt() {
    let (dir, clock, broker) = setup(2).await;
    let wg = common::hourly_workers(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.last_progress(), progress(&broker, 1).await), (None, None));
    j.progress("10%").unwrap();
    j.progress("40%").unwrap(); // coalesced: the last one is what counts
    assert_eq!(progress(&broker, 1).await, Some(Bytes::from("40%")));
    assert_eq!(j.last_progress(), Some(Bytes::from("40%")));
    broker.flush().await.unwrap();
    // The attempt fails; the report stays for the retry, which resumes from it.
    j.fail_durable("interrupted").await.unwrap();
    let s = broker.job("jobs", "workers", 1).await.unwrap();
    assert_eq!(
        (s.state, s.progress),
        (JobState::RetryWaiting { due_in: common::JOB_BACKOFF }, Some(Bytes::from("40%")))
    );
    drop(sub);
    broker.shutdown().await.unwrap();

    // Written: a restart keeps it, for lookups, the Inspector and the next attempt.
    let inspector = common::inspector(dir.path()).await;
    assert_eq!(inspector.job("jobs", "workers", 1).await.unwrap().progress, Some(Bytes::from("40%")));
    drop(inspector);
    let broker = open_clock(dir.path(), &clock).await;
    let mut sub = common::hourly_workers(&broker).await.subscribe().await.unwrap();
    assert_eq!(progress(&broker, 1).await, Some(Bytes::from("40%")));
    clock.advance(common::JOB_BACKOFF);
    let j = next_job(&mut sub).await;
    assert_eq!((j.seq(), j.attempt(), j.last_progress()), (1, 2, Some(Bytes::from("40%"))));
    j.progress("100%").unwrap();
    // Finished: the report goes with it (the ack in the same round as the report).
    j.ack_durable().await.unwrap();
    let s = broker.job("jobs", "workers", 1).await.unwrap();
    assert_eq!((s.state, s.progress), (JobState::Finished, None));
    drop(sub);
    broker.shutdown().await.unwrap();
    let inspector = common::inspector(dir.path()).await;
    assert_eq!(inspector.job("jobs", "workers", 1).await.unwrap().progress, None, "the record went too");
}

#[tokio::test]
async fn a_report_from_a_lost_lease_or_too_large_is_refused_and_changes_nothing() {
    let (_dir, clock, broker) = setup(1).await;
    let mut sub = common::hourly_workers(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    j.progress("step 1").unwrap();
    let e = j.progress(vec![0u8; rockq::MAX_PROGRESS_BYTES + 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    j.progress(vec![1u8; rockq::MAX_PROGRESS_BYTES]).unwrap(); // at the maximum: fine
    j.progress("step 2").unwrap();
    clock.advance(LEASE);
    let e = j.progress("step 3").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LeaseLost, "{e}");
    assert_eq!(progress(&broker, 1).await, Some(Bytes::from("step 2")));
    broker.flush().await.unwrap();
    drop(j);
    // The next holder reads what the last holder reported before its lease ran out.
    let j = next_job(&mut sub).await;
    assert_eq!((j.attempt(), j.last_progress()), (2, Some(Bytes::from("step 2"))));
    j.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_trim_or_a_reset_past_a_running_job_takes_its_report() {
    let (dir, clock, broker) = setup(3).await;
    let q = broker.queue("jobs").await.unwrap();
    let mut sub = common::hourly_workers(&broker).await.max_in_flight(2).subscribe().await.unwrap();
    let (a, b) = (next_job(&mut sub).await, next_job(&mut sub).await);
    a.progress("a").unwrap();
    b.progress("b").unwrap();
    broker.flush().await.unwrap();
    // Retention keeps one message: jobs 1 and 2 are deleted under their holders.
    q.set_retention(Retention::MaxLen(1)).await.unwrap();
    assert_eq!(broker.trim().await.unwrap().deleted, 2);
    assert_eq!(broker.job("jobs", "workers", 1).await.unwrap().state, JobState::Removed);
    assert!(a.progress("late").is_err(), "the message is gone");
    drop((a, b, sub));
    broker.shutdown().await.unwrap();
    let inspector = common::inspector(dir.path()).await;
    for seq in [1, 2] {
        let s = inspector.job("jobs", "workers", seq).await.unwrap();
        assert_eq!((s.state, s.progress), (JobState::Removed, None), "job {seq}");
    }
    drop(inspector);

    // A reset forgets attempts and reports.
    let broker = open_clock(dir.path(), &clock).await;
    let mut sub = common::hourly_workers(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 3);
    j.progress("half").unwrap();
    broker.flush().await.unwrap();
    drop(j);
    drop(sub);
    broker.reset_group("jobs", "workers", rockq::ResetTo::Sequence(3)).await.unwrap();
    let s = broker.job("jobs", "workers", 3).await.unwrap();
    assert_eq!((s.state, s.attempt, s.progress), (JobState::Queued, 0, None));
    broker.shutdown().await.unwrap();
    let inspector = common::inspector(dir.path()).await;
    assert_eq!(inspector.job("jobs", "workers", 3).await.unwrap().progress, None);
}

#[tokio::test]
async fn export_and_import_carry_outcomes_and_progress_reports() {
    let (dir, clock, broker) = setup(3).await;
    let mut sub = keeping(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    j.set_result("r1").unwrap();
    j.ack_durable().await.unwrap();
    let running = next_job(&mut sub).await;
    running.progress("p2").unwrap();
    broker.flush().await.unwrap();
    let file = dir.path().join("export.jsonl");
    let report = broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    assert_eq!(report.outcomes, 1);
    drop((running, sub));
    broker.shutdown().await.unwrap();

    let target = common::tempdir();
    Broker::import(std::fs::File::open(&file).unwrap(), target.path()).await.unwrap();
    let broker = open_clock(target.path(), &clock).await;
    drop(common::hourly_workers(&broker).await.subscribe().await.unwrap());
    let o = outcome(&broker, 1).await.unwrap();
    assert_eq!((o.kind, o.result), (OutcomeKind::Acked, Some(Bytes::from("r1"))));
    assert_eq!(progress(&broker, 2).await, Some(Bytes::from("p2")));
    broker.shutdown().await.unwrap();
}
