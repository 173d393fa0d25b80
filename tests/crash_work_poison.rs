//! A message that crashes the whole process is counted, and after `max_attempts` crashes it is
//! dead-lettered instead of crash-looping (Pulsar's in-memory redelivery counter is the
//! anti-example). The child process aborts on the poison message; the parent restarts it.

mod common;

use std::io::BufRead;

use common::*;
use futures::StreamExt;
use rockq::{Durability, Event, Options, RetryPolicy};

const MAX_ATTEMPTS: u32 = 3;

async fn open_fsync(path: &str) -> rockq::Broker {
    Options::new().durability(Durability::Fsync).open(path).await.expect("open")
}

/// Child: consumes the work group one job at a time; aborts the process on "poison"; prints
/// `ACK <payload>` per ack and `DONE` once the group's offset reaches the end of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_consume_and_abort_on_poison() {
    let Ok(path) = std::env::var("ROCKQ_POISON_PATH") else { return };
    let broker = open_fsync(&path).await;
    let mut events = broker.events();
    let q = broker.queue("jobs").await.unwrap();
    let last = q.last_seq();
    let group = q
        .work_group("w")
        .unwrap()
        .max_in_flight(1)
        .read_batch(1)
        .retry_policy(RetryPolicy::default().max_attempts(MAX_ATTEMPTS));
    let mut sub = group.subscribe().await.unwrap();
    println!("ROCKQ-READY");
    while group.committed() != Some(last) {
        tokio::select! {
            job = sub.next() => {
                let job = job.unwrap().unwrap();
                if job.payload().as_ref() == b"poison" {
                    println!("POISON {}", job.attempt());
                    std::process::abort();
                }
                let payload = String::from_utf8(job.payload().to_vec()).unwrap();
                job.ack_durable().await.unwrap();
                println!("ACK {payload}");
            }
            // A dead-lettering (done by the subscription itself) also moves the offset.
            e = events.recv() => if let Ok(Event::DeadLettered { .. }) = e {},
        }
    }
    println!("DONE");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_crashes_the_process_is_dead_lettered_after_max_attempts() {
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    {
        let broker = open_fsync(&path).await;
        let q = broker.queue("jobs").await.unwrap();
        q.send_batch(["a", "b", "poison", "c", "d"]).await.unwrap();
        broker.shutdown().await.unwrap();
    }

    let mut poison_attempts = Vec::new();
    let mut acked = Vec::new();
    let mut finished = false;
    for _run in 0..MAX_ATTEMPTS + 2 {
        let mut child = spawn_helper("helper_consume_and_abort_on_poison", &[("ROCKQ_POISON_PATH", &path)]);
        let stdout = child.stdout.take().unwrap();
        let mut done = false;
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("POISON ") {
                poison_attempts.push(n.trim().parse::<u32>().unwrap());
            } else if let Some(p) = line.strip_prefix("ACK ") {
                acked.push(p.trim().to_owned());
            } else if line.trim_end().ends_with("DONE") {
                done = true;
            }
        }
        let status = child.wait().unwrap();
        if done {
            assert!(status.success(), "the clean run failed: {status:?}");
            finished = true;
            break;
        }
        assert!(!status.success(), "the child exited cleanly without finishing");
    }
    assert!(finished, "still crash-looping after {} runs", MAX_ATTEMPTS + 2);
    // One crash per attempt, counted across restarts, then no further delivery.
    assert_eq!(poison_attempts, (1..=MAX_ATTEMPTS).collect::<Vec<_>>());
    acked.sort();
    acked.dedup();
    assert_eq!(acked, ["a", "b", "c", "d"]);

    let broker = open_fsync(&path).await;
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let dead = dlq.list(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].payload.as_ref(), dead[0].attempts, dead[0].seq),
        (&b"poison"[..], MAX_ATTEMPTS, Some(3))
    );
    assert_eq!(broker.queue("jobs").await.unwrap().work_group("w").unwrap().committed(), Some(5));
    broker.shutdown().await.unwrap();
}
