//! Delayed messages and recurring schedules, on a `ManualClock`: nothing is visible before it is
//! due, a delayed message gets its sequence when it falls due, cancel and reschedule act only
//! on what is still scheduled, everything survives a restart, and each recurring firing
//! happens once, with missed firings handled by the schedule's policy.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use rockq::{Error, Event, ManualClock, Message, Missed, Recurrence, Sent};

fn scheduled(s: Sent) -> rockq::ScheduledMessage {
    match s {
        Sent::Scheduled(m) => m,
        other => panic!("expected a scheduled message, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_invisible_until_due_then_gets_the_next_sequence() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();

    let later =
        scheduled(q.submit(Message::new("later").deliver_after(Duration::from_secs(10))).await.unwrap());
    assert!(later.due > SystemTime::now(), "due in the future");
    assert_eq!(q.send("now").await.unwrap(), 1, "the delayed message took no sequence");
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (1, &b"now"[..]));
    d.ack().unwrap();
    let stats = broker.stats().await.unwrap();
    assert_eq!(stats.queues[0].scheduled, 1);
    assert_eq!(stats.queues[0].next_due, Some(later.due));

    clock.advance(Duration::from_secs(9));
    // Not yet: the next delivery is a sentinel sent after the advance.
    assert_next_is_sentinel(&q, &mut sub).await;
    clock.advance(Duration::from_secs(1));
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.payload().as_ref()), (3, &b"later"[..]), "appended when due, after the sentinel");
    d.ack().unwrap();
    assert_eq!(broker.stats().await.unwrap().queues[0].scheduled, 0);
    assert!(!q.cancel(later.id).await.unwrap(), "already delivered: nothing to cancel");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_order_not_send_order_decides_sequences_and_deliver_at_in_the_past_is_immediate() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for (name, secs) in [("c", 30), ("a", 10), ("b", 20)] {
        q.submit(Message::new(name).deliver_after(Duration::from_secs(secs))).await.unwrap();
    }
    let past = q.submit(Message::new("past").deliver_at(SystemTime::UNIX_EPOCH)).await.unwrap();
    assert_eq!(past, Sent::Appended(1), "a due time in the past appends at once");
    next(&mut sub).await.ack().unwrap();
    clock.advance(Duration::from_secs(60));
    let got = take(&mut sub, 3).await;
    assert_eq!(payloads(&got), ["a", "b", "c"]);
    assert_eq!(got.iter().map(|d| d.seq()).collect::<Vec<_>>(), [2, 3, 4], "dense, in due order");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_act_only_on_what_is_still_scheduled() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let other = broker.queue("other").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let a = scheduled(q.submit(Message::new("a").deliver_after(Duration::from_secs(10))).await.unwrap());
    let b = scheduled(q.submit(Message::new("b").deliver_after(Duration::from_secs(10))).await.unwrap());
    let c = scheduled(q.submit(Message::new("c").deliver_after(Duration::from_secs(100))).await.unwrap());
    assert_ne!(a.id, b.id);

    assert!(!other.cancel(a.id).await.unwrap(), "an id belongs to its queue");
    assert!(q.cancel(a.id).await.unwrap());
    assert!(!q.cancel(a.id).await.unwrap(), "cancelled once");
    assert!(q.reschedule(a.id, SystemTime::now()).await.unwrap().is_none());
    // c moves before b; b moves later.
    let moved = q.reschedule(c.id, clock.wall_time() + Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(moved.id, c.id);
    q.reschedule(b.id, clock.wall_time() + Duration::from_secs(50)).await.unwrap().unwrap();
    let listed = q.delayed(10).await.unwrap();
    assert_eq!(listed.iter().map(|s| s.id).collect::<Vec<_>>(), [b.id, c.id]);

    clock.advance(Duration::from_secs(10));
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"c");
    d.ack().unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;
    clock.advance(Duration::from_secs(40));
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"b");
    d.ack().unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;
    assert!(q.delayed(10).await.unwrap().is_empty());
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_messages_survive_a_restart_and_fire_once() {
    for mode in [rockq::Durability::Buffered, rockq::Durability::Fsync] {
        survive_a_restart(mode).await;
    }
}

async fn survive_a_restart(mode: rockq::Durability) {
    let dir = tempdir();
    let clock = ManualClock::new();
    let (id, keep) = {
        let broker = open_clock_mode(dir.path(), &clock, mode).await;
        let q = broker.queue("jobs").await.unwrap();
        let gone =
            scheduled(q.submit(Message::new("gone").deliver_after(Duration::from_secs(5))).await.unwrap());
        let keep = scheduled(
            q.submit(Message::new("kept").header("h", "v").key("k1").deliver_after(Duration::from_secs(20)))
                .await
                .unwrap(),
        );
        // A century-long delay is fine: no cap.
        q.submit(Message::new("century").deliver_after(Duration::from_secs(100 * 365 * 24 * 3600)))
            .await
            .unwrap();
        q.cancel(gone.id).await.unwrap();
        broker.shutdown().await.unwrap();
        (gone.id, keep)
    };
    let broker = open_clock_mode(dir.path(), &clock, mode).await;
    let q = broker.queue("jobs").await.unwrap();
    assert_eq!(broker.stats().await.unwrap().queues[0].scheduled, 2);
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(30));
    let d = next(&mut sub).await;
    assert_eq!(
        (d.seq(), d.payload().as_ref(), d.key(), d.header("h").map(|v| v.to_vec())),
        (1, &b"kept"[..], Some("k1"), Some(b"v".to_vec()))
    );
    d.ack().unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;
    broker.shutdown().await.unwrap();

    // Reopened again: it fired once, and ids are never handed out twice.
    let broker = open_clock_mode(dir.path(), &clock, mode).await;
    let q = broker.queue("jobs").await.unwrap();
    assert_eq!(q.last_seq(), 2);
    let fresh = scheduled(q.submit(Message::new("x").deliver_after(Duration::from_secs(1))).await.unwrap());
    assert!(fresh.id > keep.id && fresh.id > id, "ids are not reused across restarts");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_batch_is_atomic_and_the_plain_calls_refuse_what_needs_submit() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let out = q
        .submit_batch([
            Message::new("now"),
            Message::new("later").deliver_after(Duration::from_secs(5)),
            Message::new("now2"),
        ])
        .await
        .unwrap();
    assert_eq!(out[0], Sent::Appended(1));
    assert!(matches!(out[1], Sent::Scheduled(_)));
    assert_eq!(out[2], Sent::Appended(2));

    let delayed = Message::new("d").deliver_after(Duration::from_secs(1));
    assert!(matches!(q.send(delayed.clone()).await, Err(Error::NeedsSubmit { index: 0, .. })));
    assert!(matches!(q.enqueue(delayed.clone()).await, Err(Error::NeedsSubmit { index: 0, .. })));
    assert!(matches!(
        q.send_batch([Message::new("a"), delayed]).await,
        Err(Error::NeedsSubmit { index: 1, .. })
    ));
    assert!(matches!(
        q.send_batch([Message::new("a").idempotency_key("k")]).await,
        Err(Error::NeedsSubmit { index: 0, .. })
    ));
    assert!(matches!(q.submit(Message::new("a").key("")).await, Err(Error::InvalidKey { index: 0, .. })));
    assert!(matches!(
        q.submit(Message::new("a").idempotency_key("x".repeat(rockq::MAX_KEY_LEN + 1))).await,
        Err(Error::InvalidKey { .. })
    ));
    assert_eq!(q.last_seq(), 2, "refusals wrote nothing");
    assert_eq!(broker.stats().await.unwrap().queues[0].scheduled, 1);
    broker.shutdown().await.unwrap();
    assert!(matches!(q.submit("late").await, Err(Error::Shutdown)));
    assert!(matches!(q.cancel(1).await, Err(rockq::Error::Shutdown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_schedule_fires_once_per_interval_and_can_be_paused_resumed_and_deleted() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let mut events = broker.events();
    let first = broker.schedule("tick", Duration::from_secs(60), "ticks", "tick").await.unwrap().unwrap();
    let micros = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros();
    assert_eq!(micros(first), micros(clock.wall_time() + Duration::from_secs(60)));
    let q = broker.queue("ticks").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for n in 1..=3u64 {
        clock.advance(Duration::from_secs(60));
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().as_ref()), (n, &b"tick"[..]));
        d.ack().unwrap();
        let e = wait_event(&mut events, |e| matches!(e, Event::ScheduleFired { .. })).await;
        assert!(matches!(e, Event::ScheduleFired { seq: Some(s), missed: 0, .. } if s == n));
    }
    let info = &broker.schedules().await.unwrap()[0];
    assert_eq!(
        (info.name.as_str(), info.queue.as_str(), info.fired, info.paused),
        ("tick", "ticks", 3, false)
    );
    assert_eq!(info.next, Some(first + Duration::from_secs(180)));

    broker.pause_schedule("tick").await.unwrap();
    clock.advance(Duration::from_secs(600));
    assert_next_is_sentinel(&q, &mut sub).await;
    assert_eq!(broker.schedules().await.unwrap()[0].next, None);
    broker.resume_schedule("tick").await.unwrap();
    clock.advance(Duration::from_secs(60));
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"tick", "resumed: fires at its next firing after now, no catch-up");
    d.ack().unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;

    assert!(broker.delete_schedule("tick").await.unwrap());
    assert!(!broker.delete_schedule("tick").await.unwrap());
    assert!(matches!(broker.pause_schedule("tick").await, Err(rockq::Error::NoSuchSchedule { .. })));
    clock.advance(Duration::from_secs(600));
    assert_next_is_sentinel(&q, &mut sub).await;
    assert!(broker.schedules().await.unwrap().is_empty());
    broker.shutdown().await.unwrap();
}

/// Missed firings while the broker was down: catch up once, or skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firings_missed_while_down_follow_the_schedules_policy() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let every = || Recurrence::every(Duration::from_secs(60));
    {
        let broker = open_clock(dir.path(), &clock).await;
        broker.schedule("once", every(), "catch", "c").await.unwrap();
        // Skips missed firings, and a firing 10 s late is missed.
        let strict = every().on_missed(Missed::Skip).grace(Duration::from_secs(10));
        broker.schedule("skip", strict, "skip", "s").await.unwrap();
        // Skips too, with the default 60 s grace.
        broker.schedule("recent", every().on_missed(Missed::Skip), "recent", "r").await.unwrap();
        broker.shutdown().await.unwrap();
    }
    // Down for ten and a half minutes: ten firings of each fell due, the last 30 s ago.
    clock.advance(Duration::from_secs(630));
    let broker = open_clock(dir.path(), &clock).await;
    let catch = broker.queue("catch").await.unwrap();
    let mut sub = catch.group("g").unwrap().subscribe().await.unwrap();
    // One catch-up message for the nine firings later than the grace, then the tenth (30 s
    // late, within the grace) on time with a message of its own.
    for d in take(&mut sub, 2).await {
        assert_eq!(d.payload().as_ref(), b"c");
        d.ack().unwrap();
    }
    assert_next_is_sentinel(&catch, &mut sub).await;
    // The last firing was within the default grace: "recent" sends it and skips the nine
    // before (the firing due a moment ago is not late because earlier ones were missed).
    let recent = broker.queue("recent").await.unwrap();
    let mut rsub = recent.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut rsub).await.payload().as_ref(), b"r");
    let skip = broker.queue("skip").await.unwrap();
    let list = broker.schedules().await.unwrap();
    let summary: Vec<_> = list.iter().map(|s| (s.name.as_str(), s.fired, s.missed_firings)).collect();
    assert_eq!(summary, [("once", 2, 8), ("recent", 1, 9), ("skip", 0, 10)]);
    assert_eq!(skip.last_seq(), 0, "nothing sent for skipped firings");
    // All continue on their grid: 11 minutes after creation.
    let next_at = list[2].next.unwrap();
    assert!(list.iter().all(|s| s.next == Some(next_at)));
    clock.advance(Duration::from_secs(30));
    let mut ssub = skip.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut ssub).await;
    assert_eq!(d.payload().as_ref(), b"s");
    broker.shutdown().await.unwrap();
}

/// Takes `n` messages from `queue` (group "g"), then proves there is no other.
async fn drain_exactly(broker: &rockq::Broker, queue: &str, n: usize) {
    let q = broker.queue(queue).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, n).await {
        d.ack().unwrap();
    }
    assert_next_is_sentinel(&q, &mut sub).await;
}

/// A stall longer than the interval (here the clock jumps 10.5 s over 1 s schedules): every
/// firing within its grace gets its own message, whatever the policy; only firings later than
/// the grace are missed and follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firings_late_by_less_than_the_grace_each_get_their_own_message() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let every = || Recurrence::every(Duration::from_secs(1));
    broker.schedule("catch", every(), "catch", "c").await.unwrap();
    broker.schedule("skip", every().on_missed(Missed::Skip), "skip", "s").await.unwrap();
    // With a 2 s grace, eight of the ten firings below come too late.
    let tight = || every().grace(Duration::from_secs(2));
    broker.schedule("tight_catch", tight(), "tight_catch", "tc").await.unwrap();
    broker.schedule("tight_skip", tight().on_missed(Missed::Skip), "tight_skip", "ts").await.unwrap();
    let mut events = broker.events();
    clock.advance(Duration::from_millis(10_500)); // ten firings due, 0.5 s to 9.5 s late
    // tight_catch: one catch-up for the eight late firings, then the two on time.
    for (queue, n) in [("catch", 10), ("skip", 10), ("tight_catch", 3), ("tight_skip", 2)] {
        drain_exactly(&broker, queue, n).await;
    }
    let counts = |list: Vec<rockq::ScheduleInfo>| -> Vec<(String, u64, u64)> {
        list.into_iter().map(|s| (s.name, s.fired, s.missed_firings)).collect()
    };
    let expect = |v: [(&str, u64, u64); 4]| -> Vec<(String, u64, u64)> {
        v.into_iter().map(|(n, f, m)| (n.to_owned(), f, m)).collect()
    };
    let list = broker.schedules().await.unwrap();
    // The recurrence reads back typed, grace included.
    let tight = &list[2];
    assert_eq!(
        (tight.interval, tight.grace, tight.cron.as_deref(), tight.missed),
        (Some(Duration::from_secs(1)), Duration::from_secs(2), None, Missed::CatchUpOnce)
    );
    assert_eq!((list[0].grace, list[1].missed), (Duration::from_secs(60), Missed::Skip));
    assert_eq!(
        counts(list),
        expect([("catch", 10, 0), ("skip", 10, 0), ("tight_catch", 3, 7), ("tight_skip", 2, 8)])
    );
    // The catch-up message's event accounts for the seven firings folded into it.
    let folded = wait_event(&mut events, |e| {
        matches!(e, Event::ScheduleFired { schedule, missed, .. } if &**schedule == "tight_catch" && *missed > 0)
    })
    .await;
    assert!(matches!(folded, Event::ScheduleFired { seq: Some(1), missed: 7, .. }), "{folded:?}");
    // A later 3 s step: three firings, 0.5 s to 2.5 s late.
    clock.advance(Duration::from_secs(3));
    for (queue, n) in [("catch", 3), ("skip", 3), ("tight_catch", 3), ("tight_skip", 2)] {
        drain_exactly(&broker, queue, n).await;
    }
    assert_eq!(
        counts(broker.schedules().await.unwrap()),
        expect([("catch", 13, 0), ("skip", 13, 0), ("tight_catch", 6, 7), ("tight_skip", 4, 9)])
    );
    broker.shutdown().await.unwrap();
}

/// Many on-time firings at once (a 1 ms schedule after a 1 s stall) all fire, across several
/// writer batches, in order, and the schedule then continues on its grid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_on_time_firings_at_once_all_fire_across_batches() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let first = broker.schedule("fast", Duration::from_millis(1), "fast", "f").await.unwrap().unwrap();
    clock.advance(Duration::from_secs(1));
    drain_exactly(&broker, "fast", 1000).await;
    let info = &broker.schedules().await.unwrap()[0];
    assert_eq!((info.fired, info.missed_firings), (1000, 0));
    assert_eq!(info.next, Some(first + Duration::from_millis(1000)));
    broker.shutdown().await.unwrap();
}

/// Intervals are stored in whole microseconds: one that rounds to zero is refused, not stored
/// as a schedule that never fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_under_a_microsecond_is_refused_and_writes_nothing() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    for nanos in [0, 1, 999] {
        let every = Recurrence::every(Duration::from_nanos(nanos));
        let err = broker.schedule("z", every, "q", "x").await.unwrap_err();
        assert!(matches!(err, Error::ZeroInterval), "{nanos} ns: {err:?}");
        assert_eq!(err.kind(), rockq::ErrorKind::InvalidInput);
    }
    assert!(broker.schedules().await.unwrap().is_empty());
    // 1.5 µs is kept as 1 µs, and fires.
    let next = broker.schedule("z", Duration::from_nanos(1_500), "q", "x").await.unwrap().unwrap();
    let micros = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros();
    assert_eq!(micros(next), micros(clock.wall_time()) + 1);
    clock.advance(Duration::from_micros(1));
    drain_exactly(&broker, "q", 1).await;
    broker.shutdown().await.unwrap();
}

/// A typed queue builds delayed, keyed and deduplicated messages in one chain, as `Message`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_queue_sends_delayed_and_keyed_values_with_the_message_builder() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("t").await.unwrap();
    let typed = q.typed::<u32>();
    let later = typed.with(&7).key("k").deliver_after(Duration::from_secs(10)).submit().await.unwrap();
    assert!(matches!(later, Sent::Scheduled(_)), "{later:?}");
    let first = typed.with(&8).key("k").idempotency_key("eight").header("h", "v").send().await.unwrap();
    assert!(matches!(typed.with(&8).idempotency_key("eight").submit().await, Ok(Sent::Duplicate(_))));
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!((d.seq(), d.decode::<u32>().unwrap(), d.key()), (first, 8, Some("k")));
    d.ack().unwrap();
    clock.advance(Duration::from_secs(10));
    let d = next(&mut sub).await;
    assert_eq!((d.decode::<u32>().unwrap(), d.key()), (7, Some("k")));
    d.ack().unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_schedule_fires_on_its_expression_and_bad_input_is_refused() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    // Every minute at second 0 (five-field form).
    let first = broker
        .schedule("minutely", Recurrence::cron("* * * * *").unwrap(), "cron", "m")
        .await
        .unwrap()
        .unwrap();
    let secs = first.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(secs % 60, 0, "on a minute boundary");
    let info = &broker.schedules().await.unwrap()[0];
    assert_eq!(
        (info.cron.as_deref(), info.interval),
        (Some("0 * * * * *"), None),
        "normalised to six fields"
    );
    let q = broker.queue("cron").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(60));
    assert_eq!(next(&mut sub).await.payload().as_ref(), b"m");

    assert!(matches!(Recurrence::cron("not cron"), Err(rockq::Error::InvalidCron { .. })));
    assert!(
        matches!(Recurrence::cron("0 0 0 1 1 * 2001"), Err(rockq::Error::InvalidCron { .. })),
        "never fires again"
    );
    assert!(matches!(broker.schedule("z", Duration::ZERO, "q", "x").await, Err(rockq::Error::ZeroInterval)));
    assert!(matches!(
        broker.schedule("bad name", Duration::from_secs(1), "q", "x").await,
        Err(rockq::Error::InvalidName(_))
    ));
    assert!(matches!(
        broker.schedule("n", Duration::from_secs(1), "bad:q", "x").await,
        Err(rockq::Error::InvalidName(_))
    ));
    assert!(matches!(
        broker
            .schedule(
                "n",
                Duration::from_secs(1),
                "q",
                Message::new("x").deliver_after(Duration::from_secs(1))
            )
            .await,
        Err(Error::NeedsSubmit { .. })
    ));
    assert_eq!(broker.schedules().await.unwrap().len(), 1, "refusals wrote nothing");
    broker.shutdown().await.unwrap();
}
