//! Dead letters: inspect them, fix the cause, and redrive them back to their queue.
//!
//! `cargo run --example redrive`

use futures::StreamExt;
use rockq::{Broker, Redrive, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let payments = broker.queue("payments").await?;
    payments.send_batch(["pay 10", "pay 20", "pay 30"]).await?;

    // A consumer with a bug: everything fails, and with one attempt goes straight to the DLQ.
    let group = payments.work_group("processor")?.retry_policy(RetryPolicy::default().max_attempts(1));
    let mut jobs = group.subscribe().await?;
    for _ in 0..3 {
        let job = jobs.next().await.expect("stream ended")?;
        job.fail("currency service unavailable").await?;
    }
    drop(jobs);

    let dlq = broker.dead_letters("payments.dlq").await?;
    println!("{} dead letters:", dlq.len().await?);
    for d in dlq.list(10).await? {
        println!("  {:?} (from seq {:?}): {}", String::from_utf8_lossy(&d.payload), d.seq, d.reason);
    }

    // The bug is fixed: move them back (new sequences, atomically per batch, 100 msg/s).
    let moved = dlq.redrive(Redrive::new().rate(100.0)).await?;
    println!("redrove {moved}; {} left in the DLQ", dlq.len().await?);

    let mut jobs = group.subscribe().await?;
    for _ in 0..moved {
        let job = jobs.next().await.expect("stream ended")?;
        println!(
            "processed {:?} as seq {} (attempt {})",
            String::from_utf8_lossy(job.payload()),
            job.seq(),
            job.attempt()
        );
        job.ack()?;
    }
    broker.shutdown().await?;
    Ok(())
}
