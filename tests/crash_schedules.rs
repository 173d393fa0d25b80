//! Delayed messages, idempotency keys and a recurring schedule under SIGKILL, in Fsync mode: a
//! child process submits delayed messages (each with an idempotency key, some sent twice) while
//! an interval schedule fires every 20 ms; the parent kills it at arbitrary points for 20
//! cycles. Afterwards every delayed message whose submit resolved is delivered exactly once (no
//! loss, no duplicate firing, no duplicate from a resend), and the schedule's record counts
//! exactly the messages it appended (each firing and its next are one batch).

mod common;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::Duration;

use common::*;
use rockq::{Durability, Message, Options};

const CYCLES: u64 = 20;

async fn open_fsync(path: &str, clock: Option<&rockq::ManualClock>) -> rockq::Broker {
    let mut o = Options::new().durability(Durability::Fsync).retention_interval(Duration::ZERO);
    if let Some(c) = clock {
        o = o.clock(c.clone());
    }
    o.open(path).await.expect("open")
}

/// Child: submits delayed messages `c<cycle>-<i>` (delays of 0–150 ms, each with its payload as
/// idempotency key, every third one sent again), printing `SENT <payload>` once a submit
/// resolved. Runs until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_submit_until_killed() {
    let Ok(path) = std::env::var("ROCKQ_SCHED_PATH") else { return };
    let cycle: u64 = std::env::var("ROCKQ_SCHED_CYCLE").unwrap().parse().unwrap();
    let broker = open_fsync(&path, None).await;
    let q = broker.queue("later").await.unwrap();
    println!("READY");
    for i in 0u64.. {
        let payload = format!("c{cycle}-{i}");
        let delay = Duration::from_millis((i * 37 + cycle * 11) % 150);
        let m = Message::new(payload.clone()).idempotency_key(payload.clone()).deliver_after(delay);
        q.submit(m.clone()).await.unwrap();
        println!("SENT {payload}");
        if i % 3 == 0 {
            // A resend (as after a timeout): a duplicate, never a second message.
            assert!(q.submit(m).await.unwrap().is_duplicate());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_keys_and_a_schedule_survive_sigkill_exactly_once() {
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    {
        let broker = open_fsync(&path, None).await;
        broker.schedule("tick", Duration::from_millis(20), "ticks", "tick").await.unwrap();
        broker.queue("later").await.unwrap().set_dedup_window(Duration::from_secs(3600)).await.unwrap();
        broker.shutdown().await.unwrap();
    }
    let mut sent = Vec::new();
    for cycle in 0..CYCLES {
        let mut child = spawn_helper(
            "helper_submit_until_killed",
            &[("ROCKQ_SCHED_PATH", &path), ("ROCKQ_SCHED_CYCLE", &cycle.to_string())],
        );
        let stdout = child.stdout.take().unwrap();
        // Killed after a varying number of resolved submits: mid-round, mid-firing, anywhere.
        let kill_after = 5 + (cycle * 7919) % 60;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut n = 0;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(p) = line.strip_prefix("SENT ") {
                sent.push(p.to_owned());
                n += 1;
                if n >= kill_after {
                    break;
                }
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Lines already printed before the kill landed count too.
        for line in lines.map_while(Result::ok) {
            if let Some(p) = line.strip_prefix("SENT ") {
                sent.push(p.to_owned());
            }
        }
    }

    // Everything scheduled falls due at once on a clock an hour ahead.
    let clock = rockq::ManualClock::new();
    clock.advance(Duration::from_secs(3600));
    let broker = open_fsync(&path, Some(&clock)).await;
    broker.pause_schedule("tick").await.unwrap();
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        let stats = broker.stats().await.unwrap();
        let later = stats.queues.iter().find(|q| q.name == "later").unwrap();
        if later.scheduled == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{} still scheduled", later.scheduled);
        tokio::task::yield_now().await;
    }
    // Read from the store, which already holds the last firing round (the queue's in-memory
    // last sequence is published only once that round is synced).
    let stored = broker.peek("later", None, 1 << 20).await.unwrap();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for m in &stored {
        *count.entry(String::from_utf8(m.payload.to_vec()).unwrap()).or_default() += 1;
    }
    let dup: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "delivered more than once: {dup:?}");
    let lost: Vec<_> = sent.iter().filter(|p| !count.contains_key(*p)).collect();
    assert!(lost.is_empty(), "{} resolved submits never delivered, e.g. {:?}", lost.len(), lost.first());
    // Paused above, so nothing fires any more; both read from the store (the queue's
    // in-memory last sequence lags a firing still syncing).
    let info = broker.schedules().await.unwrap().remove(0);
    let stats = broker.stats().await.unwrap();
    let ticks = stats.queues.iter().find(|q| q.name == "ticks").unwrap();
    assert_eq!(info.fired, ticks.last_seq, "the schedule counts exactly the messages it appended");
    assert!(info.fired > 0, "it fired during the run");
    eprintln!(
        "{CYCLES} cycles: {} submits resolved, {} delivered, {} schedule firings, 0 duplicates, 0 lost",
        sent.len(),
        stored.len(),
        info.fired
    );
    broker.shutdown().await.unwrap();
}
