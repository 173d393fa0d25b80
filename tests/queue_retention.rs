//! Retention: what each policy deletes (and never deletes), groups that fall behind a trim,
//! the first sequence across restarts, replay with `reset_to`, space reclamation, and the
//! background task. Trims are explicit (`Broker::trim`) except in the background-task test.

mod common;

use std::time::Duration;

use common::*;
use rockq::{Error, Event, ManualClock, ResetTo, Retention, StartFrom};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_acked_deletes_only_what_every_group_finished_and_never_a_claimed_message() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((1..=10).map(|i| format!("m{i}"))).await.unwrap();

    // Ordered group a finishes everything, b finishes 1..=5.
    let mut a = q.group("a").unwrap().subscribe().await.unwrap();
    take(&mut a, 10).await.into_iter().for_each(|d| d.ack().unwrap());
    a.commit().await.unwrap();
    let mut b = q.group("b").unwrap().subscribe().await.unwrap();
    take(&mut b, 5).await.into_iter().for_each(|d| d.ack().unwrap());
    b.commit().await.unwrap();
    // Work group w: 1..=3 acked, 4 claimed and held, 5 acked (above the gap).
    let mut w = q.work_group("w").unwrap().read_batch(1).subscribe().await.unwrap();
    let mut held = None;
    for _ in 0..5 {
        let j = next_job(&mut w).await;
        if j.seq() == 4 {
            held = Some(j);
        } else {
            j.ack_durable().await.unwrap();
        }
    }

    let report = broker.trim().await.unwrap();
    assert_eq!(report.deleted, 3, "w's offset is 3: message 4 is claimed");
    assert_eq!(q.first_seq(), 4);
    let held = held.unwrap();
    assert_eq!(held.seq(), 4);
    held.ack_durable().await.unwrap();
    broker.trim().await.unwrap();
    assert_eq!(q.first_seq(), 6, "now b (offset 5) holds the head");

    // b goes on from 6 without skipping anything.
    let d = next(&mut b).await;
    assert_eq!(d.seq(), 6);
    assert_eq!(q.group("b").unwrap().skipped(), 0);
    drop(d);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_groups_and_a_forever_queue_keep_everything() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let lonely = broker.queue("lonely").await.unwrap();
    lonely.send_batch(["a", "b"]).await.unwrap();
    let log = broker.queue("log").await.unwrap();
    log.set_retention(Retention::Forever).await.unwrap();
    log.send_batch(["a", "b"]).await.unwrap();
    let mut g = log.group("g").unwrap().subscribe().await.unwrap();
    take(&mut g, 2).await.into_iter().for_each(|d| d.ack().unwrap());
    g.commit().await.unwrap();
    assert_eq!(broker.trim().await.unwrap().deleted, 0);
    assert_eq!((lonely.first_seq(), log.first_seq()), (1, 1));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_len_trims_unconsumed_messages_and_groups_behind_skip_with_an_event() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let mut events = broker.events();
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::MaxLen(5)).await.unwrap();
    q.send_batch((1..=20).map(|i| format!("m{i}"))).await.unwrap();
    // Reading one message at a time, so most of the backlog is still unread at the trim.
    let mut ordered = q.group("o").unwrap().read_batch(1).subscribe().await.unwrap();
    let first = next(&mut ordered).await; // 1, handed out and still unacked
    let mut w = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut w).await;
    job.ack_durable().await.unwrap();
    drop(w);

    let report = broker.trim().await.unwrap();
    assert_eq!(report.deleted, 15);
    assert_eq!((q.first_seq(), q.len()), (16, 5));
    // The work group jumped in the same write.
    let e = wait_event(&mut events, |e| matches!(e, Event::Skipped { group, .. } if &**group == "w")).await;
    assert!(matches!(e, Event::Skipped { from: 2, to: 15, .. }));
    assert_eq!(q.work_group("w").unwrap().skipped(), 14);
    // The ordered subscription continues at 16 once its buffer (read before the trim) is gone.
    first.ack().unwrap();
    let mut seqs = Vec::new();
    while seqs.last() != Some(&20) {
        let d = next(&mut ordered).await;
        seqs.push(d.seq());
        d.ack().unwrap();
    }
    assert!(seqs.windows(2).all(|p| p[0] < p[1]));
    assert!(seqs.ends_with(&[16, 17, 18, 19, 20]), "{seqs:?}");
    // At most one message (2) was read ahead before the trim; the rest up to 15 were skipped.
    assert!(q.group("o").unwrap().skipped() >= 13, "{}", q.group("o").unwrap().skipped());
    assert!(seqs.len() <= 6, "{seqs:?}");
    let mut w = q.work_group("w").unwrap().subscribe().await.unwrap();
    assert_eq!(next_job(&mut w).await.seq(), 16);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_trims_by_enqueue_time_on_the_broker_clock() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::MaxAge(Duration::from_secs(60))).await.unwrap();
    q.send_batch(["old1", "old2", "old3"]).await.unwrap();
    clock.advance(Duration::from_secs(30));
    q.send_batch(["mid1", "mid2"]).await.unwrap();
    clock.advance(Duration::from_secs(31)); // old ones are 61 s old, mid ones 31 s
    q.send("new").await.unwrap();
    assert_eq!(broker.trim().await.unwrap().deleted, 3);
    assert_eq!(q.first_seq(), 4);
    clock.advance(Duration::from_secs(30));
    assert_eq!(broker.trim().await.unwrap().deleted, 2);
    assert_eq!(q.first_seq(), 6);
    // A new group starts at the first live message.
    let mut g = q.group("late").unwrap().start_from(StartFrom::Earliest).subscribe().await.unwrap();
    let d = next(&mut g).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (6, &b"new"[..]));
    d.ack().unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_sequence_and_policy_survive_a_restart_and_new_groups_start_there() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.set_retention(Retention::MaxLen(2)).await.unwrap();
        q.send_batch(["a", "b", "c", "d"]).await.unwrap();
        broker.trim().await.unwrap();
        assert_eq!(q.first_seq(), 3);
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!((q.first_seq(), q.last_seq(), q.len()), (3, 4, 2));
    assert_eq!(q.retention(), Retention::MaxLen(2));
    let mut g = q.group("new").unwrap().subscribe().await.unwrap();
    let ds = take(&mut g, 2).await;
    assert_eq!(payloads(&ds), ["c", "d"]);
    ds.into_iter().for_each(|d| d.ack().unwrap());
    assert_eq!(q.send("e").await.unwrap(), 5, "sequences continue after the trimmed head");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_replays_inside_retention_and_refuses_outside_or_while_active() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::Forever).await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    clock.advance(Duration::from_secs(10));
    let t_d = clock.wall_time();
    q.send_batch(["d", "e"]).await.unwrap();
    let group = q.group("g").unwrap();
    {
        let mut sub = group.subscribe().await.unwrap();
        take(&mut sub, 5).await.into_iter().for_each(|d| d.ack().unwrap());
        sub.commit().await.unwrap();
        assert!(matches!(group.reset_to(ResetTo::Sequence(2)).await, Err(Error::Active { .. })));
    }
    assert_eq!(group.reset_to(ResetTo::Sequence(2)).await.unwrap(), 2);
    assert_eq!(group.committed(), Some(1));
    let mut sub = group.subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut sub, 4).await), ["b", "c", "d", "e"]);
    drop(sub);
    assert_eq!(group.reset_to(ResetTo::Time(t_d)).await.unwrap(), 4);
    let mut sub = group.subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"d");
    drop(sub);

    // Outside retention: before the first live message, past the end, or before the oldest.
    q.set_retention(Retention::MaxLen(2)).await.unwrap();
    broker.trim().await.unwrap();
    assert_eq!(q.first_seq(), 4);
    assert!(matches!(group.reset_to(ResetTo::Sequence(2)).await, Err(Error::OutOfRange { first: 4, .. })));
    assert!(matches!(group.reset_to(ResetTo::Sequence(9)).await, Err(Error::OutOfRange { .. })));
    let long_ago = t_d - Duration::from_secs(3600);
    assert!(matches!(group.reset_to(ResetTo::Time(long_ago)).await, Err(Error::OutOfRange { .. })));
    assert_eq!(group.committed(), Some(3), "refused resets changed nothing");
    assert!(matches!(
        q.group("never").unwrap().reset_to(ResetTo::Sequence(4)).await,
        Err(Error::NoSuchGroup { .. })
    ));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_a_large_consumed_backlog_returns_the_space() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let payload = vec![7u8; 1024];
    for _ in 0..40 {
        q.send_batch((0..1000).map(|_| payload.clone())).await.unwrap();
    }
    let mut g = q.group("g").unwrap().read_batch(1024).max_in_flight(4096).subscribe().await.unwrap();
    for _ in 0..40_000 {
        next(&mut g).await.ack().unwrap();
    }
    g.commit().await.unwrap();
    let report = broker.trim().await.unwrap();
    assert_eq!(report.deleted, 40_000);
    assert!(report.compacted);
    assert!(report.bytes_before > 40_000 * 1024 / 2, "{report:?}");
    assert!(report.bytes_after < report.bytes_before / 10, "space was not returned: {report:?}");
    assert_eq!(q.len(), 0);
    assert_next_is_sentinel(&q, &mut g).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_task_trims_on_its_interval() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = rockq::Options::new()
        .durability(rockq::Durability::Buffered)
        .clock(clock.clone())
        .retention_interval(Duration::from_secs(10))
        .open(dir.path())
        .await
        .unwrap();
    let mut events = broker.events();
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let mut g = q.group("g").unwrap().subscribe().await.unwrap();
    take(&mut g, 2).await.into_iter().for_each(|d| d.ack().unwrap());
    g.commit().await.unwrap();
    clock.advance(Duration::from_secs(10));
    let e = wait_event(&mut events, |e| matches!(e, Event::Trimmed { .. })).await;
    assert!(matches!(e, Event::Trimmed { deleted: 2, first_seq: 3, .. }));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_group_resets_to_a_retained_sequence_and_its_claims_are_dropped() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::Forever).await.unwrap();
    q.send_batch(["a", "b", "c", "d"]).await.unwrap();
    let group = q.work_group("w").unwrap();
    {
        let mut sub = group.subscribe().await.unwrap();
        for _ in 0..3 {
            next_job(&mut sub).await.ack_durable().await.unwrap();
        }
        let held = next_job(&mut sub).await; // 4 claimed, attempt 1
        assert!(matches!(group.reset_to(ResetTo::Sequence(2)).await, Err(Error::Active { .. })));
        held.fail_durable("x").await.unwrap(); // waiting for a retry: a claim record with attempt 1
    }
    assert_eq!(group.committed(), Some(3));
    assert_eq!(group.reset_to(ResetTo::Sequence(2)).await.unwrap(), 2);
    assert_eq!(group.committed(), Some(1));
    assert!(matches!(group.reset_to(ResetTo::Sequence(9)).await, Err(Error::OutOfRange { .. })));
    let mut sub = group.subscribe().await.unwrap();
    for expected in [b"b", b"c", b"d"] {
        let j = next_job(&mut sub).await;
        assert_eq!((j.payload().as_ref(), j.attempt()), (&expected[..], 1), "claims were dropped");
        j.ack_durable().await.unwrap();
    }
    drop(sub);
    broker.shutdown().await.unwrap();
    // The reset is durable.
    let broker = open(dir.path()).await;
    assert_eq!(broker.queue("q").await.unwrap().work_group("w").unwrap().committed(), Some(4));
    broker.shutdown().await.unwrap();
}

// Regression: a trim that moved a work group's offset up to its cut stopped there, even when
// every message right above the cut was already finished (acked while the head waited for a
// retry). The offset stayed behind a run of finished messages — lag counted them, their
// `done` records stayed on disk — until some later message finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_past_a_waiting_head_moves_the_offset_over_the_finished_run_above_it() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch((1..=20).map(|i| format!("m{i}"))).await.unwrap();
        let group = q.work_group("w").unwrap();
        let mut w = group.subscribe().await.unwrap();
        let head = next_job(&mut w).await;
        assert_eq!(head.seq(), 1);
        head.retry_after_durable(Duration::from_secs(86_400)).await.unwrap();
        for _ in 2..=20 {
            next_job(&mut w).await.ack_durable().await.unwrap();
        }
        drop(w);
        assert_eq!(group.committed(), Some(0), "the waiting head holds the offset");
        // Keep 19: the trim deletes only the waiting head.
        q.set_retention(Retention::MaxLen(19)).await.unwrap();
        assert_eq!(broker.trim().await.unwrap().deleted, 1);
        assert_eq!(group.committed(), Some(20), "the offset moves over the finished run");
        assert_eq!(group.skipped(), 1);
        assert!(broker.pending("q", "w").await.unwrap().is_empty());
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.work_group("w").unwrap().committed(), Some(20));
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!(g.lag, 0);
    broker.shutdown().await.unwrap();
}
