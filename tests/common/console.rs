//! The database both console test files look at: queues with messages (one of them a
//! `<script>` payload), an ordered group with a committed offset, a work group with a held
//! lease, a claim waiting for its retry and two dead letters. Time is a `ManualClock`.
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Job, ManualClock, Message, RetryPolicy, WorkSubscription};

use super::common::{next_job, open_clock};

pub const SCRIPT: &str = "<script>alert('pwned')</script>";

/// What must stay alive for the figures to hold: the work subscription and its leased job.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub broker: Broker,
    pub clock: ManualClock,
    pub work: WorkSubscription,
    pub held: Job,
}

pub async fn fixture() -> Fixture {
    let dir = super::common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;

    let orders = broker.queue("orders").await.unwrap();
    orders.send(Message::new(SCRIPT).header("x-note", "<b>bold</b>")).await.unwrap();
    orders.send(r#"{"order": 2, "total": 9.5}"#).await.unwrap();
    orders.send_batch((3..=10).map(|i| format!("order #{i}"))).await.unwrap();
    let mut billing = orders.group("billing").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        let d =
            tokio::time::timeout(super::common::HANG_GUARD, billing.next()).await.unwrap().unwrap().unwrap();
        d.ack_durable().await.unwrap();
    }
    drop(billing);

    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=6).map(|i| format!("job {i}"))).await.unwrap();
    let wg = jobs
        .work_group("workers")
        .unwrap()
        .consumer_name("host-a/1")
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(60), Duration::from_secs(60))
                .jitter(0.0),
        )
        .read_batch(4)
        .max_in_flight(4);
    let mut work = wg.subscribe().await.unwrap();
    let j1 = next_job(&mut work).await;
    let j2 = next_job(&mut work).await;
    let j3 = next_job(&mut work).await;
    let held = next_job(&mut work).await;
    j1.dead_letter_durable("bad input: <missing field>").await.unwrap();
    j2.dead_letter_durable("poison").await.unwrap();
    j3.fail_durable("downstream 503").await.unwrap();
    clock.advance(Duration::from_secs(5));
    Fixture { dir, broker, clock, work, held }
}

pub fn group<'a>(stats: &'a rockq::Stats, queue: &str, group: &str) -> &'a rockq::GroupStats {
    stats.groups.iter().find(|g| g.queue == queue && g.group == group).expect("group in stats")
}
