//! Issue 13 (bad numbers): bad numeric input panicked — `Instant + Duration::MAX` in leases,
//! retry delays, extensions and intervals, `Duration::from_secs_f64` in redrive pacing and
//! backoff, `Semaphore::new` above its permit limit. Property: whatever numbers the builders
//! get (0, 1, MAX, huge and tiny floats, NaN, infinities), a real broker in a tempdir either
//! refuses them with a typed `InvalidOption` or works — it never panics.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;
use rockq::{Error, Event, HandlerError, ManualClock, Options, Redrive, RetryPolicy, Task};

/// 100 years and a day: past every clamp.
const PAST_EVERY_CLAMP: Duration = Duration::from_secs(101 * 365 * 24 * 3600);

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::from_secs(1 << 40)),
        (0u64..5, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

fn count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(2),
        Just(usize::MAX),
        Just(tokio::sync::Semaphore::MAX_PERMITS),
        Just(tokio::sync::Semaphore::MAX_PERMITS + 1),
        Just(rockq::Workers::MAX_POOL + 1),
        0usize..64,
        any::<usize>(),
    ]
}

/// A broker-level size: mostly valid (so most cases get past open), sometimes out of range.
fn open_count() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 1usize..10_000,
        1 => Just(0usize),
        1 => Just(usize::MAX),
        1 => Just(tokio::sync::Semaphore::MAX_PERMITS),
        1 => Just(tokio::sync::Semaphore::MAX_PERMITS + 1),
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-1.0),
        Just(1e-300),
        Just(f64::MIN_POSITIVE),
        Just(f64::MAX),
        Just(1e-10),
        any::<f64>(),
    ]
}

#[derive(Debug, Clone)]
struct Input {
    channel_capacity: usize,
    max_batch_messages: usize,
    max_batch_bytes: usize,
    max_message_bytes: usize,
    retention_interval: Duration,
    metrics_interval: Duration,
    lease: Duration,
    saturation_after: Duration,
    max_in_flight: usize,
    claim_batch: usize,
    max_attempts: u32,
    backoff: (Duration, Duration),
    multiplier: f64,
    jitter: f64,
    extend: Duration,
    retry_after: Duration,
    concurrency: usize,
    prefetch: usize,
    drain_timeout: Duration,
    handler_delay: Duration,
    redrive_rate: f64,
    redrive_batch: usize,
    read_batch: usize,
    max_unacked: usize,
}

fn input() -> impl Strategy<Value = Input> {
    (
        (
            open_count(),
            open_count(),
            open_count(),
            prop_oneof![6 => Just(1usize << 20), 1 => Just(0), 1 => Just(64 << 20), 1 => Just(usize::MAX)],
        ),
        (duration(), duration(), duration(), duration()),
        (
            count(),
            count(),
            prop_oneof![Just(0u32), Just(1), Just(2), Just(u32::MAX)],
            (duration(), duration()),
        ),
        (float(), float(), duration(), duration()),
        (prop_oneof![Just(0usize), Just(1), Just(3), Just(usize::MAX)], count(), duration(), duration()),
        (float(), count(), count(), count()),
    )
        .prop_map(|(a, b, c, d, e, f)| Input {
            channel_capacity: a.0,
            max_batch_messages: a.1,
            max_batch_bytes: a.2,
            max_message_bytes: a.3,
            retention_interval: b.0,
            metrics_interval: b.1,
            lease: b.2,
            saturation_after: b.3,
            max_in_flight: c.0,
            claim_batch: c.1,
            max_attempts: c.2,
            backoff: c.3,
            multiplier: d.0,
            jitter: d.1,
            extend: d.2,
            retry_after: d.3,
            concurrency: e.0,
            prefetch: e.1.min(8).max(if e.1 > rockq::Workers::MAX_POOL { e.1 } else { 0 }),
            drain_timeout: e.2,
            handler_delay: e.3,
            redrive_rate: f.0,
            redrive_batch: f.1,
            read_batch: f.2,
            max_unacked: f.3,
        })
}

/// Cases that got past open (checked below, so the property does not pass vacuously).
static FULL_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn run(i: Input) {
    let dir = tempdir();
    let clock = ManualClock::new();
    let opened = Options::new()
        .durability(rockq::Durability::Buffered)
        .clock(clock.clone())
        .channel_capacity(i.channel_capacity)
        .max_batch_messages(i.max_batch_messages)
        .max_batch_bytes(i.max_batch_bytes)
        .max_message_bytes(i.max_message_bytes)
        .retention_interval(i.retention_interval)
        .metrics_interval(i.metrics_interval)
        .open(dir.path())
        .await;
    let bad_open = i.channel_capacity == 0
        || i.channel_capacity > tokio::sync::Semaphore::MAX_PERMITS
        || i.max_batch_messages == 0
        || i.max_batch_bytes == 0
        || i.max_message_bytes == 0
        || i.max_message_bytes > 64 << 20;
    let broker = match opened {
        Ok(b) => {
            assert!(!bad_open, "accepted {i:?}");
            b
        }
        Err(e) => {
            assert!(bad_open && matches!(e, Error::InvalidOption(_)), "{e:?} for {i:?}");
            return;
        }
    };
    // Both background tasks tick at least once (a huge interval is clamped, not overflowed).
    clock.advance(PAST_EVERY_CLAMP);
    let q = broker.queue("q").await.unwrap();
    for p in ["a", "b", "c", "d"] {
        q.send(p).await.unwrap();
    }

    // Ordered group settings.
    FULL_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut ordered = q
        .group("o")
        .unwrap()
        .read_batch(i.read_batch)
        .max_in_flight(i.max_unacked)
        .subscribe()
        .await
        .unwrap();
    next(&mut ordered).await.ack().unwrap();
    drop(ordered);

    // Work group settings, job outcomes with extreme delays.
    let policy = RetryPolicy::default()
        .max_attempts(i.max_attempts)
        .backoff(i.backoff.0, i.backoff.1)
        .multiplier(i.multiplier)
        .jitter(i.jitter);
    let _ = policy.delay_after(u32::MAX);
    let group = q
        .work_group("w")
        .unwrap()
        .lease(i.lease)
        .saturation_after(i.saturation_after)
        .max_in_flight(i.max_in_flight)
        .read_batch(i.claim_batch)
        .retry_policy(policy);
    // A lease under 1 ms is refused, typed, and stores nothing; the shortest one is taken.
    let group = if i.lease < Duration::from_millis(1) {
        let refused = group.subscribe().await;
        assert!(matches!(refused, Err(Error::InvalidOption(_))), "{refused:?}");
        assert_eq!(group.committed(), None, "nothing written");
        group.lease(Duration::from_millis(1))
    } else {
        group
    };
    let mut sub = group.subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    let _ = job.lease_remaining();
    job.extend(i.extend).unwrap();
    let _ = broker.pending("q", "w").await.unwrap();
    let _ = broker.stats().await.unwrap();
    match job.retry_after_durable(i.retry_after).await {
        Ok(()) => {}
        // `extend(0)` ends the lease now: the outcome is refused, typed.
        Err(rockq::Error::LeaseLost { .. }) => assert!(i.extend.is_zero(), "{i:?}"),
        Err(e) => panic!("{e:?}"),
    }
    let job = next_job(&mut sub).await;
    job.nack_durable().await.unwrap(); // backoff from the policy
    let job = next_job(&mut sub).await;
    job.dead_letter_durable("one").await.unwrap();
    drop(sub);
    let _ = broker.pending("q", "w").await.unwrap();

    // A worker pool with extreme sizes and delays.
    let delay = i.handler_delay;
    let pool = group
        .workers(i.concurrency)
        .prefetch(i.prefetch)
        .drain_timeout(i.drain_timeout)
        .heartbeat(true)
        .spawn(move |_t: Task| async move { Err(HandlerError::retry_after("later", delay)) });
    let bad_pool = i.concurrency > rockq::Workers::MAX_POOL || i.prefetch > rockq::Workers::MAX_POOL;
    match tokio::time::timeout(HANG_GUARD, pool.shutdown()).await.unwrap() {
        Ok(_) => assert!(!bad_pool, "accepted {i:?}"),
        Err(e) => {
            assert!(bad_pool && matches!(e, Error::InvalidOption(_)), "{e:?}")
        }
    }

    // Redrive pacing with any rate: two dead letters, so the second batch is paced.
    let mut sub = q.work_group("x").unwrap().subscribe().await.unwrap();
    for _ in 0..2 {
        next_job(&mut sub).await.dead_letter_durable("two").await.unwrap();
    }
    drop(sub);
    let mut events = broker.events();
    let dlq = broker.dead_letters("q.dlq").await.unwrap();
    let opts = Redrive::new().to("back").batch(i.redrive_batch).rate(i.redrive_rate);
    let redrive = tokio::spawn(async move { dlq.redrive(opts).await });
    // After the first batch moved, the pace is at most 100 years: advancing past it lets the
    // redrive finish whatever the rate.
    wait_event(&mut events, |e| matches!(e, Event::Redriven { .. })).await;
    clock.advance(PAST_EVERY_CLAMP);
    let moved = tokio::time::timeout(HANG_GUARD, redrive).await.unwrap().unwrap().unwrap();
    assert!(moved >= 2, "{moved}");

    // The manual clock itself: advancing by `Duration::MAX` again and again saturates.
    for _ in 0..20 {
        clock.advance(Duration::MAX);
    }
    q.send("late").await.unwrap();
    let _ = broker.stats().await.unwrap();
    let _ = broker.pending("q", "w").await.unwrap();
    broker.shutdown().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn builders_never_panic_on_numeric_input(i in input()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(i));
    }
}

#[test]
fn most_cases_get_past_open() {
    builders_never_panic_on_numeric_input();
    assert!(FULL_RUNS.load(std::sync::atomic::Ordering::Relaxed) >= 5, "too few cases opened a broker");
}
