//! One dead letter on its own (`DeadLetters::redrive_one`, `DeadLetters::delete`), against a
//! real database: a letter in the middle of the queue leaves the listing, the count, the
//! group's `dlq_depth` and every later redrive, while the letters around it stay; the cursor
//! moves over settled letters once it reaches them; it all survives a restart; what is gone is
//! refused by name and changes nothing.

mod common;

use common::{open, reopen_after_drop, tempdir};
use rockq::{Broker, ErrorKind, Inspector, Redrive};

/// A dead-letter queue `jobs.dlq` holding letters of `jobs`#1..=n (sent there directly, with
/// their origin headers as a group's dead letters carry them).
async fn letters(broker: &Broker, n: u64) -> rockq::DeadLetters {
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=n).map(|i| format!("job {i}"))).await.unwrap();
    let wg = jobs.work_group("workers").unwrap().read_batch(n as usize).max_in_flight(n as usize);
    let mut sub = wg.subscribe().await.unwrap();
    for _ in 0..n {
        common::next_job(&mut sub).await.dead_letter_durable("poison").await.unwrap();
    }
    broker.dead_letters("jobs.dlq").await.unwrap()
}

fn seqs(ls: &[rockq::DeadLetter]) -> Vec<u64> {
    ls.iter().map(|d| d.dlq_seq).collect()
}

fn depth(stats: &rockq::Stats) -> u64 {
    stats.groups.iter().find(|g| g.group == "workers").unwrap().dlq_depth
}

#[tokio::test]
async fn a_letter_in_the_middle_leaves_listing_count_depth_and_later_redrives() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 5).await;
    assert_eq!((dlq.len().await.unwrap(), depth(&broker.stats().await.unwrap())), (5, 5));

    dlq.delete(3).await.unwrap();
    let (queue, seq) = dlq.redrive_one(4, None).await.unwrap();
    assert_eq!((queue.as_str(), seq), ("jobs", 6), "appended to its origin queue");
    assert_eq!(broker.peek("jobs", Some(6), 10).await.unwrap()[0].payload, "job 4");
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [1, 2, 5]);
    assert_eq!(seqs(&dlq.list(2).await.unwrap()), [1, 2]);
    assert_eq!(dlq.len().await.unwrap(), 3);
    assert_eq!(depth(&broker.stats().await.unwrap()), 3);

    // A redrive of everything moves the three left, not 3 or 4 again.
    broker.queue("quarantine").await.unwrap();
    let moved = dlq.redrive(Redrive::new().to("quarantine")).await.unwrap();
    assert_eq!(moved, 3);
    let q: Vec<_> =
        broker.peek("quarantine", None, 10).await.unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(q, ["job 1", "job 2", "job 5"]);
    assert_eq!((dlq.len().await.unwrap(), depth(&broker.stats().await.unwrap())), (0, 0));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn settling_the_next_letter_moves_the_cursor_over_those_settled_after_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 4).await;
    dlq.delete(2).await.unwrap();
    dlq.delete(3).await.unwrap();
    // 1 is the next: settling it covers 2 and 3 too.
    dlq.delete(1).await.unwrap();
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [4]);
    // A redrive now starts at 4 (no conflict with marks left behind).
    assert_eq!(dlq.redrive(Redrive::new()).await.unwrap(), 1);
    assert!(dlq.is_empty().await.unwrap());
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn settled_letters_stay_settled_across_a_restart_and_in_the_inspector() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 4).await;
    dlq.delete(2).await.unwrap();
    broker.shutdown().await.unwrap();
    drop(broker);
    let broker = reopen_after_drop(dir.path()).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [1, 3, 4]);
    assert_eq!(depth(&broker.stats().await.unwrap()), 3);
    let inspector = Inspector::open(dir.path()).await.unwrap();
    let seen: Vec<_> =
        inspector.dead_letters("jobs.dlq", 10).await.unwrap().iter().map(|d| d.dlq_seq).collect();
    assert_eq!(seen, [1, 3, 4]);
    assert_eq!(depth(&inspector.stats().await.unwrap()), 3);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_letter_already_settled_or_never_written_is_refused_and_nothing_changes() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 3).await;
    dlq.delete(2).await.unwrap();
    dlq.redrive(Redrive::new().limit(1)).await.unwrap();
    let jobs_last = broker.stats().await.unwrap().queues.iter().find(|q| q.name == "jobs").unwrap().last_seq;
    for (seq, what) in [(1, "redriven"), (2, "deleted"), (9, "never written"), (0, "zero")] {
        let e = dlq.delete(seq).await.unwrap_err();
        assert!(matches!(e, rockq::Error::NoSuchLetter { seq: s, .. } if s == seq), "{what}: {e}");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let e = dlq.redrive_one(seq, None).await.unwrap_err();
        assert!(matches!(e, rockq::Error::NoSuchLetter { .. }), "{what}: {e}");
    }
    let e = dlq.redrive_one(3, Some("bad name!")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    // Nothing moved: one letter left, the origin queue as it was.
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [3]);
    let last = broker.stats().await.unwrap().queues.iter().find(|q| q.name == "jobs").unwrap().last_seq;
    assert_eq!(last, jobs_last);
    broker.shutdown().await.unwrap();
    assert_eq!(dlq.delete(3).await.unwrap_err().kind(), ErrorKind::Shutdown);
}

#[tokio::test]
async fn deleting_a_dead_letter_queue_forgets_its_marks() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 3).await;
    dlq.delete(2).await.unwrap();
    assert!(broker.delete_queue("jobs.dlq").await.unwrap());
    // A new queue of the same name starts clean: its letter 2 is listed.
    let again = broker.queue("jobs.dlq").await.unwrap();
    again.send_batch(["a", "b", "c"]).await.unwrap();
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [1, 2, 3]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_a_purge_of_the_dead_letter_queue_later_letters_are_redriven_and_settled() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let dlq = letters(&broker, 2).await;
    assert_eq!(broker.purge_queue("jobs.dlq").await.unwrap(), 2);
    // Two more dead letters (3 and 4 in the dead-letter queue).
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["job 3", "job 4", "job 5"]).await.unwrap();
    let mut sub = jobs.work_group("workers").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        common::next_job(&mut sub).await.dead_letter_durable("again").await.unwrap();
    }
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [3, 4, 5]);
    dlq.delete(4).await.unwrap();
    // The head moved past the stored cursor: a redrive still agrees on where it starts.
    assert_eq!(dlq.redrive(Redrive::new().limit(1)).await.unwrap(), 1);
    assert_eq!(seqs(&dlq.list(10).await.unwrap()), [5]);
    assert_eq!(dlq.redrive(Redrive::new()).await.unwrap(), 1);
    assert!(dlq.is_empty().await.unwrap());
    broker.shutdown().await.unwrap();
}
