//! Issue 15 (scale): a large backlog of waiting retries, long finished runs above a gap, and
//! retention over many queues — each against a real database, on a `ManualClock`.

mod common;

use std::time::Duration;

use common::*;
use rockq::{ManualClock, Retention};

const BACKLOG: u64 = 5_000;
const RETRY_IN: Duration = Duration::from_secs(24 * 3600);

/// Thousands of retries waiting a day survive a restart as waiting (attempt kept), a fresh
/// message is claimed at once past them, and they come back only when due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_waiting_backlog_survives_a_restart_and_does_not_block_fresh_work() {
    let dir = tempdir();
    let clock = ManualClock::new();
    {
        let broker = open_clock(dir.path(), &clock).await;
        let q = broker.queue("jobs").await.unwrap();
        let mut sent = 0;
        while sent < BACKLOG {
            q.send_batch((0..1000).map(|i| format!("m{}", sent + i))).await.unwrap();
            sent += 1000;
        }
        let group = q.work_group("w").unwrap().read_batch(512).max_in_flight(1024);
        let mut js = group.subscribe().await.unwrap();
        for _ in 0..BACKLOG {
            next_job(&mut js).await.retry_after_durable(RETRY_IN).await.unwrap();
        }
        assert_eq!(group.waiting(), BACKLOG as usize);
        drop(js);
        broker.shutdown().await.unwrap();
    }
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap().read_batch(512).max_in_flight(1024);
    assert_eq!(group.waiting(), BACKLOG as usize, "every retry still waits after the restart");
    assert_eq!(group.committed(), Some(0));
    let fresh = q.send("fresh").await.unwrap();
    let mut js = group.subscribe().await.unwrap();
    let job = next_job(&mut js).await;
    assert_eq!((job.seq(), job.attempt()), (fresh, 1), "the fresh message, not a waiting one");
    job.ack_durable().await.unwrap();
    // Due: every one comes back, oldest first, with its second attempt.
    clock.advance(RETRY_IN);
    for seq in 1..=BACKLOG {
        let job = next_job(&mut js).await;
        assert_eq!((job.seq(), job.attempt()), (seq, 2));
        job.ack_durable().await.unwrap();
    }
    assert_eq!(group.waiting(), 0);
    drop(js);
    assert_eq!(group.committed(), Some(BACKLOG + 1));
    broker.shutdown().await.unwrap();
}

/// Thousands of acks above a head that waits for its retry: when the head finishes, the offset
/// jumps over all of them (their `Done` records go with one range delete), nothing is pending,
/// and after a restart nothing is delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_closing_over_thousands_of_finished_messages_moves_the_offset_at_once() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let n = 3_000u64;
    {
        let broker = open_clock(dir.path(), &clock).await;
        let q = broker.queue("jobs").await.unwrap();
        q.send_batch((0..n).map(|i| format!("m{i}"))).await.unwrap();
        let group = q.work_group("w").unwrap().read_batch(256).max_in_flight(512);
        let mut js = group.subscribe().await.unwrap();
        let head = next_job(&mut js).await;
        assert_eq!(head.seq(), 1);
        head.retry_after_durable(Duration::from_secs(60)).await.unwrap();
        for _ in 2..=n {
            next_job(&mut js).await.ack_durable().await.unwrap();
        }
        assert_eq!(group.committed(), Some(0), "the head holds the offset");
        let pending = broker.pending("jobs", "w").await.unwrap();
        assert_eq!(pending.len(), 1, "only the head is pending: {:?}", pending.first());
        let stats = broker.stats().await.unwrap();
        assert_eq!(stats.groups[0].lag, 1, "finished messages above the gap are not lag");
        clock.advance(Duration::from_secs(60));
        let head = next_job(&mut js).await;
        assert_eq!((head.seq(), head.attempt()), (1, 2));
        head.ack_durable().await.unwrap();
        assert_eq!(group.committed(), Some(n), "the offset jumped over the finished run");
        assert!(broker.pending("jobs", "w").await.unwrap().is_empty());
        drop(js);
        broker.shutdown().await.unwrap();
    }
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let group = q.work_group("w").unwrap();
    assert_eq!(group.committed(), Some(n));
    let next = q.send("after").await.unwrap();
    let mut js = group.subscribe().await.unwrap();
    assert_eq!(next_job(&mut js).await.seq(), next, "nothing finished is delivered again");
    drop(js);
    broker.shutdown().await.unwrap();
}

/// A retention pass over many queues trims them all in one writer round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_retention_pass_trims_every_queue_in_one_round() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let queues = 300;
    for i in 0..queues {
        let q = broker.queue(&format!("tenant-{i}")).await.unwrap();
        q.send_batch((0..5).map(|j| format!("m{j}"))).await.unwrap();
        q.set_retention(Retention::MaxLen(2)).await.unwrap();
    }
    let before = broker.writer_stats().rounds;
    let report = broker.trim().await.unwrap();
    let rounds = broker.writer_stats().rounds - before;
    assert_eq!(report.trimmed.len(), queues);
    assert_eq!(report.deleted, 3 * queues as u64);
    assert_eq!(rounds, 1, "{queues} trims in one round");
    let stats = broker.stats().await.unwrap();
    assert!(stats.queues.iter().all(|q| q.len == 2 && q.first_seq == 4), "every queue keeps its last 2");
    broker.shutdown().await.unwrap();
}
