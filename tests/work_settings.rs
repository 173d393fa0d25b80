//! A work group's lease, retry policy, dead-letter queue and key ordering are stored with the
//! group (issue 17, item 8): the first subscribe stores them, later handles that leave a
//! setting unset run with the stored value, an explicit different value is refused with
//! `SettingsMismatch` (nothing written), and `WorkGroup::update` changes them — for live
//! subscriptions and pools too. Each behaviour is proven against a real RocksDB, with time on a
//! `ManualClock`: a lease or a retry delay is shown by what is (not) claimable after advancing
//! the clock, never by waiting.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use rockq::{
    Broker, Durability, Error, Event, GroupStats, HandlerError, ManualClock, Options, RetryPolicy, Task,
};

const MODES: [Durability; 2] = [Durability::Buffered, Durability::Fsync];

/// A policy whose delays are exact (no jitter).
fn policy(attempts: u32, backoff: Duration) -> RetryPolicy {
    RetryPolicy::default().max_attempts(attempts).backoff(backoff, backoff).jitter(0.0)
}

async fn group_stats(broker: &Broker, group: &str, queue: &str) -> GroupStats {
    let stats = broker.stats().await.unwrap();
    stats.groups.into_iter().find(|g| g.group == group && g.queue == queue).expect("the group's stats")
}

/// Opens `path` on `clock` in `mode` after a broker on it was dropped without a shutdown (its
/// writer releases the lock on its own thread: retried, bounded by `HANG_GUARD`).
async fn reopen_clock_after_drop(path: &Path, clock: &ManualClock, mode: Durability) -> Broker {
    reopen_after_drop_with(path, || Options::new().durability(mode).clock(clock.clone())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_subscribe_stores_the_settings_defaults_included() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let p = policy(2, Duration::from_secs(3));
    let sub = q
        .work_group("mailer")
        .unwrap()
        .lease(Duration::from_secs(7))
        .retry_policy(p.clone())
        .dead_letter_queue("mail.dead")
        .ordered_by_key(true)
        .subscribe()
        .await
        .unwrap();
    drop(sub);
    let s = group_stats(&broker, "mailer", "mail").await;
    assert_eq!(
        (s.lease, s.retry_policy.clone(), s.dead_letter_queue.as_deref(), s.ordered_by_key, s.max_attempts()),
        (Some(Duration::from_secs(7)), Some(p), Some("mail.dead"), true, Some(2))
    );

    // Nothing set: the defaults are stored, so a later change of a default cannot move the group.
    drop(q.work_group("plain").unwrap().subscribe().await.unwrap());
    let s = group_stats(&broker, "plain", "mail").await;
    assert_eq!(
        (s.lease, s.retry_policy, s.dead_letter_queue.as_deref(), s.ordered_by_key),
        (Some(Duration::from_secs(30)), Some(RetryPolicy::default()), Some("mail.dlq"), false)
    );
    // An ordered group stores none of them.
    drop(q.group("reader").unwrap().subscribe().await.unwrap());
    let s = group_stats(&broker, "reader", "mail").await;
    assert_eq!((s.lease, s.retry_policy, s.dead_letter_queue), (None, None, None));
    broker.shutdown().await.unwrap();
}

/// A new broker (after the first was dropped, in both modes) with a handle that sets nothing
/// runs with the stored lease, retry delay, attempt limit and dead-letter queue — all four
/// differ from the defaults, and each is observed through what gets claimed when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_broker_runs_a_plain_handle_with_the_stored_settings() {
    for mode in MODES {
        let dir = tempdir();
        let clock = ManualClock::new();
        let broker = open_clock_mode(dir.path(), &clock, mode).await;
        let q = broker.queue("mail").await.unwrap();
        let configured = q
            .work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(10))
            .retry_policy(policy(2, Duration::from_secs(5)))
            .dead_letter_queue("mail.dead");
        drop(configured.subscribe().await.unwrap());
        q.send("m1").await.unwrap();
        drop((configured, q));
        drop(broker);

        let broker = reopen_clock_after_drop(dir.path(), &clock, mode).await;
        let q = broker.queue("mail").await.unwrap();
        let plain = q.work_group("mailer").unwrap().read_batch(1);
        let mut a = plain.subscribe().await.unwrap();
        let mut b = plain.subscribe().await.unwrap();

        // Lease 10 s (default 30 s): 9 s in, the job is still held, and `b` gets the next one.
        let job = next_job(&mut a).await;
        assert_eq!((job.seq(), job.attempt()), (1, 1));
        clock.advance(Duration::from_secs(9));
        let sentinel = q.send("s1").await.unwrap();
        let other = next_job(&mut b).await;
        assert_eq!(other.seq(), sentinel, "{mode:?}: the lease ran out early");
        other.ack_durable().await.unwrap();
        clock.advance(Duration::from_secs(1));
        let again = next_job(&mut b).await;
        assert_eq!((again.seq(), again.attempt()), (1, 2), "{mode:?}: the stored lease ran out");
        drop(job);

        // Retry delay 5 s (default 1 s): 4 s after a failure the message is not due yet.
        let m2 = q.send("m2").await.unwrap();
        let j = next_job(&mut b).await;
        assert_eq!((j.seq(), j.attempt()), (m2, 1));
        j.fail_durable("boom").await.unwrap();
        clock.advance(Duration::from_secs(4));
        let sentinel = q.send("s2").await.unwrap();
        let s = next_job(&mut b).await;
        assert_eq!(s.seq(), sentinel, "{mode:?}: the retry came back before the stored delay");
        s.ack_durable().await.unwrap();
        clock.advance(Duration::from_secs(1));
        let j = next_job(&mut b).await;
        assert_eq!((j.seq(), j.attempt()), (m2, 2));

        // Two attempts (default 5): this failure dead-letters, into the stored queue.
        j.fail_durable("boom again").await.unwrap();
        again.fail_durable("and again").await.unwrap();
        let dead = broker.dead_letters("mail.dead").await.unwrap().list(10).await.unwrap();
        let mut seqs: Vec<_> = dead.iter().map(|d| d.seq).collect();
        seqs.sort();
        assert_eq!(seqs, [Some(1), Some(m2)], "{mode:?}");
        assert!(
            !broker.queue_names().iter().any(|n| n == "mail.dlq"),
            "{mode:?}: nothing in the default queue"
        );
        drop((a, b));
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_setting_that_differs_is_refused_and_nothing_changes() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let stored_policy = policy(3, Duration::from_secs(2));
    drop(
        q.work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(10))
            .retry_policy(stored_policy.clone())
            .subscribe()
            .await
            .unwrap(),
    );
    let before = group_stats(&broker, "mailer", "mail").await;

    let g = || q.work_group("mailer").unwrap();
    let err = g().lease(Duration::from_secs(20)).subscribe().await.unwrap_err();
    match &err {
        Error::SettingsMismatch { queue, group, setting, stored, requested } => {
            assert_eq!(
                (queue.as_str(), group.as_str(), *setting, stored.as_str(), requested.as_str()),
                ("mail", "mailer", "lease", "10s", "20s")
            );
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("lease") && text.contains("10s") && text.contains("20s"), "{text}");
    assert!(text.contains("WorkGroup::update"), "points to update: {text}");

    // Each stored setting is checked, and the error names the one that differs.
    let refused = |r: Result<rockq::WorkSubscription, Error>| match r {
        Err(Error::SettingsMismatch { setting, .. }) => setting,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(g().retry_policy(stored_policy.clone().max_attempts(4)).subscribe().await),
        "retry_policy.max_attempts"
    );
    assert_eq!(
        refused(g().retry_policy(stored_policy.clone().multiplier(3.0)).subscribe().await),
        "retry_policy.multiplier"
    );
    assert_eq!(
        refused(g().retry_policy(RetryPolicy::default()).subscribe().await),
        "retry_policy.max_attempts"
    );
    assert_eq!(refused(g().dead_letter_queue("elsewhere").subscribe().await), "dead_letter_queue");
    assert_eq!(refused(g().ordered_by_key(true).subscribe().await), "ordered_by_key");
    // A worker pool subscribes the same way.
    let pool = g().lease(Duration::from_secs(1)).workers(1).run(|_t: Task| async { Ok(()) }).await;
    assert!(matches!(pool, Err(Error::SettingsMismatch { setting: "lease", .. })), "{pool:?}");

    // Nothing was written: not now, and not after a restart.
    assert_eq!(group_stats(&broker, "mailer", "mail").await, before);
    drop(q);
    broker.shutdown().await.unwrap();
    let broker = open(dir.path()).await;
    assert_eq!(group_stats(&broker, "mailer", "mail").await, before);
    let q = broker.queue("mail").await.unwrap();
    let again = q.work_group("mailer").unwrap().lease(Duration::from_secs(20)).subscribe().await;
    assert!(matches!(again, Err(Error::SettingsMismatch { setting: "lease", .. })), "{again:?}");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_values_equal_to_the_stored_ones_are_accepted() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let g = || {
        q.work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(10))
            .retry_policy(policy(3, Duration::from_secs(2)))
            .dead_letter_queue("mail.dead")
            .ordered_by_key(true)
    };
    let first = g().subscribe().await.unwrap();
    let second = g().subscribe().await.unwrap();
    // Only some of them set, the rest adopted.
    let third = q.work_group("mailer").unwrap().lease(Duration::from_secs(10)).subscribe().await.unwrap();
    drop((first, second, third));
    broker.shutdown().await.unwrap();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    drop(
        q.work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(10))
            .retry_policy(policy(3, Duration::from_secs(2)))
            .dead_letter_queue("mail.dead")
            .ordered_by_key(true)
            .subscribe()
            .await
            .unwrap(),
    );
    broker.shutdown().await.unwrap();
}

/// Two handles racing to create a group with different leases: the writer decides, one
/// stores its lease and the other is refused (never both, never a silent overwrite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_subscribes_with_different_settings_store_one_and_refuse_the_other() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let a = q.work_group("mailer").unwrap().lease(Duration::from_secs(10));
    let b = q.work_group("mailer").unwrap().lease(Duration::from_secs(20));
    let (ra, rb) = tokio::join!(a.subscribe(), b.subscribe());
    let stored = group_stats(&broker, "mailer", "mail").await.lease;
    match (ra, rb) {
        (Ok(_), Err(Error::SettingsMismatch { setting: "lease", .. })) => {
            assert_eq!(stored, Some(Duration::from_secs(10)))
        }
        (Err(Error::SettingsMismatch { setting: "lease", .. }), Ok(_)) => {
            assert_eq!(stored, Some(Duration::from_secs(20)))
        }
        other => panic!("{other:?}"),
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_changes_only_what_it_sets_and_a_reopen_sees_it() {
    for mode in MODES {
        let dir = tempdir();
        let broker = open_with(dir.path(), mode).await;
        let q = broker.queue("mail").await.unwrap();
        let p = policy(3, Duration::from_secs(2));
        drop(
            q.work_group("mailer")
                .unwrap()
                .lease(Duration::from_secs(10))
                .retry_policy(p.clone())
                .subscribe()
                .await
                .unwrap(),
        );

        q.work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(45))
            .dead_letter_queue("mail.dead")
            .update()
            .await
            .unwrap();
        let s = group_stats(&broker, "mailer", "mail").await;
        assert_eq!(
            (s.lease, s.retry_policy.clone(), s.dead_letter_queue.as_deref()),
            (Some(Duration::from_secs(45)), Some(p.clone()), Some("mail.dead")),
            "{mode:?}: the policy, not set, is kept"
        );
        // The old value is now the mismatch; the new one is accepted.
        let old = q.work_group("mailer").unwrap().lease(Duration::from_secs(10)).subscribe().await;
        assert!(matches!(old, Err(Error::SettingsMismatch { setting: "lease", .. })), "{old:?}");
        drop(q.work_group("mailer").unwrap().lease(Duration::from_secs(45)).subscribe().await.unwrap());
        drop(q);
        drop(broker);

        let broker = reopen_after_drop_mode(dir.path(), mode).await;
        let after = group_stats(&broker, "mailer", "mail").await;
        assert_eq!(
            (after.lease, after.retry_policy, after.dead_letter_queue),
            (s.lease, s.retry_policy, s.dead_letter_queue),
            "{mode:?}"
        );
        let q = broker.queue("mail").await.unwrap();
        let old = q.work_group("mailer").unwrap().lease(Duration::from_secs(10)).subscribe().await;
        assert!(matches!(old, Err(Error::SettingsMismatch { setting: "lease", .. })), "{mode:?}: {old:?}");
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_creates_a_missing_group_with_its_settings() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    q.work_group("mailer").unwrap().lease(Duration::from_secs(12)).update().await.unwrap();
    let s = group_stats(&broker, "mailer", "mail").await;
    assert_eq!((s.lease, s.retry_policy), (Some(Duration::from_secs(12)), Some(RetryPolicy::default())));
    assert_eq!(q.work_group("mailer").unwrap().committed(), Some(0));
    broker.shutdown().await.unwrap();
}

/// A subscription that runs before an update claims with the new lease after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_subscription_claims_with_the_updated_lease() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("mail").await.unwrap();
    let group = q.work_group("mailer").unwrap().read_batch(1);
    let mut a = group.clone().lease(Duration::from_secs(3600)).subscribe().await.unwrap();
    let mut b = group.subscribe().await.unwrap();

    q.work_group("mailer").unwrap().lease(Duration::from_secs(10)).update().await.unwrap();
    let seq = q.send("m").await.unwrap();
    let job = next_job(&mut a).await;
    assert_eq!(job.seq(), seq);
    clock.advance(Duration::from_secs(10));
    let again = next_job(&mut b).await;
    assert_eq!((again.seq(), again.attempt()), (seq, 2), "claimed under the 10 s lease, not the hour");
    again.ack_durable().await.unwrap();
    drop(job);
    broker.shutdown().await.unwrap();
}

/// A worker pool started before an update uses the new retry policy and dead-letter queue for
/// the outcomes it records after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pool_follows_an_update_of_the_retry_policy_and_dead_letter_queue() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let q = broker.queue("mail").await.unwrap();
    let group = q.work_group("mailer").unwrap().retry_policy(policy(5, Duration::from_secs(3600)));
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let pool = group.workers(1).spawn(move |t: Task| {
        let tx = tx.clone();
        async move {
            let _ = tx.send((t.seq(), t.attempt()));
            Err(HandlerError::retry("always fails"))
        }
    });

    // Before: a failure waits an hour.
    let m1 = q.send("m1").await.unwrap();
    assert_eq!(recv(&mut seen).await, (m1, 1));
    let e = wait_event(&mut events, |e| matches!(e, Event::Retried { seq, .. } if *seq == m1)).await;
    assert!(matches!(e, Event::Retried { delay, .. } if delay == Duration::from_secs(3600)), "{e:?}");

    q.work_group("mailer")
        .unwrap()
        .retry_policy(policy(2, Duration::from_secs(1)))
        .dead_letter_queue("mail.dead")
        .update()
        .await
        .unwrap();

    // After: the next failure waits one second (not an hour)…
    let m2 = q.send("m2").await.unwrap();
    assert_eq!(recv(&mut seen).await, (m2, 1));
    let e = wait_event(&mut events, |e| matches!(e, Event::Retried { seq, .. } if *seq == m2)).await;
    assert!(matches!(e, Event::Retried { delay, .. } if delay == Duration::from_secs(1)), "{e:?}");
    clock.advance(Duration::from_secs(1));
    assert_eq!(recv(&mut seen).await, (m2, 2), "retried after the updated delay");
    // …and its second attempt is the last (not the fifth), dead-lettered into the new queue.
    wait_event(&mut events, |e| matches!(e, Event::DeadLettered { seq, .. } if *seq == m2)).await;
    let dead = broker.dead_letters("mail.dead").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.seq).collect::<Vec<_>>(), [Some(m2)]);

    pool.shutdown().await.unwrap();
    broker.shutdown().await.unwrap();
}

/// The next (sequence, attempt) a pool's handler reported.
async fn recv(seen: &mut tokio::sync::mpsc::UnboundedReceiver<(u64, u32)>) -> (u64, u32) {
    tokio::time::timeout(HANG_GUARD, seen.recv())
        .await
        .expect("hung waiting for a handler")
        .expect("pool gone")
}

/// Pause, resume and reset rewrite or sit beside the settings record: none may lose the stored
/// settings, live or after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_reset_keep_the_stored_settings() {
    for mode in MODES {
        let dir = tempdir();
        let broker = open_with(dir.path(), mode).await;
        let q = broker.queue("mail").await.unwrap();
        q.send("m").await.unwrap();
        let group = q
            .work_group("mailer")
            .unwrap()
            .lease(Duration::from_secs(10))
            .retry_policy(policy(3, Duration::from_secs(2)))
            .dead_letter_queue("mail.dead");
        drop(group.subscribe().await.unwrap());
        let stored = group_stats(&broker, "mailer", "mail").await;
        let terms =
            |s: &GroupStats| (s.lease, s.retry_policy.clone(), s.dead_letter_queue.clone(), s.ordered_by_key);

        broker.pause_group("mail", "mailer").await.unwrap();
        let paused = group_stats(&broker, "mailer", "mail").await;
        assert!(paused.paused);
        assert_eq!(terms(&paused), terms(&stored), "{mode:?}: a pause kept them");
        drop(q);
        broker.shutdown().await.unwrap();

        let broker = open_with(dir.path(), mode).await;
        let after = group_stats(&broker, "mailer", "mail").await;
        assert!(after.paused);
        assert_eq!(terms(&after), terms(&stored), "{mode:?}: restored with the pause");
        let q = broker.queue("mail").await.unwrap();
        q.work_group("mailer").unwrap().resume().await.unwrap();
        broker.reset_group("mail", "mailer", rockq::ResetTo::Sequence(1)).await.unwrap();
        assert_eq!(terms(&group_stats(&broker, "mailer", "mail").await), terms(&stored), "{mode:?}");
        // Still enforced: the stored lease, not a default, is what a new handle must match.
        let other = q.work_group("mailer").unwrap().lease(Duration::from_secs(30)).subscribe().await;
        assert!(matches!(other, Err(Error::SettingsMismatch { setting: "lease", .. })), "{other:?}");
        drop(q);
        broker.shutdown().await.unwrap();

        let broker = open_with(dir.path(), mode).await;
        let last = group_stats(&broker, "mailer", "mail").await;
        assert!(!last.paused);
        assert_eq!(terms(&last), terms(&stored), "{mode:?}");
        broker.shutdown().await.unwrap();
    }
}

/// Overwrites the settings record of `group` on `queue` with `value`, through RocksDB directly
/// (the broker must be shut down).
fn put_settings_record(path: &Path, group: &str, queue: &str, value: &[u8]) {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), path, &cfs).unwrap();
    let meta = db.cf_handle("rockq.meta").unwrap();
    db.put_cf(meta, format!("group:{group}:{queue}"), value).unwrap();
}

/// A record an older build wrote (version 1: pause flag and dead-letter queue, no lease or
/// policy) still opens; the first subscribe adopts its settings (and the recorded queue for a
/// dead-letter queue it does not set) and stores them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_from_an_older_build_is_completed_by_the_next_subscribe() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    drop(q.work_group("mailer").unwrap().subscribe().await.unwrap());
    drop(q);
    broker.shutdown().await.unwrap();
    // version 1, paused, "legacy.dlq".
    put_settings_record(dir.path(), "mailer", "mail", &[&[1u8, 1, 10][..], b"legacy.dlq"].concat());

    let broker = open(dir.path()).await;
    let s = group_stats(&broker, "mailer", "mail").await;
    assert_eq!(
        (s.paused, s.dead_letter_queue.as_deref(), s.lease, s.retry_policy),
        (true, Some("legacy.dlq"), None, None),
        "nothing stored but the pause and the queue"
    );
    let q = broker.queue("mail").await.unwrap();
    // Any explicit value is taken: nothing is stored to differ from.
    drop(q.work_group("mailer").unwrap().lease(Duration::from_secs(12)).subscribe().await.unwrap());
    let s = group_stats(&broker, "mailer", "mail").await;
    assert_eq!(
        (s.paused, s.dead_letter_queue.as_deref(), s.lease, s.retry_policy),
        (true, Some("legacy.dlq"), Some(Duration::from_secs(12)), Some(RetryPolicy::default()))
    );
    drop(q);
    broker.shutdown().await.unwrap();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let other = q.work_group("mailer").unwrap().lease(Duration::from_secs(30)).subscribe().await;
    assert!(matches!(other, Err(Error::SettingsMismatch { setting: "lease", .. })), "{other:?}");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused_before_anything_is_written() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mail").await.unwrap();
    let zero = q.work_group("mailer").unwrap().lease(Duration::ZERO);
    assert!(matches!(zero.subscribe().await, Err(Error::InvalidOption(m)) if m.contains("lease")));
    assert!(matches!(zero.update().await, Err(Error::InvalidOption(m)) if m.contains("lease")));
    let own = q.work_group("mailer").unwrap().dead_letter_queue("mail");
    assert!(matches!(own.update().await, Err(Error::InvalidOption(_))));
    let bad = q.work_group("mailer").unwrap().dead_letter_queue("no spaces");
    assert!(matches!(bad.update().await, Err(Error::InvalidName(_))));
    assert_eq!(q.work_group("mailer").unwrap().committed(), None, "no group was created");
    assert!(broker.stats().await.unwrap().groups.is_empty());

    // On an existing group, a refused update leaves the stored settings as they were.
    drop(q.work_group("mailer").unwrap().lease(Duration::from_secs(10)).subscribe().await.unwrap());
    let before = group_stats(&broker, "mailer", "mail").await;
    assert!(zero.update().await.is_err());
    assert_eq!(group_stats(&broker, "mailer", "mail").await, before);
    broker.shutdown().await.unwrap();
}
