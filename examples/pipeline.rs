//! A `StreamExt` pipeline: concurrent async handlers with out-of-order acks.
//!
//! `cargo run --example pipeline`

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use rockq::{Broker, Durability, Options};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = std::env::temp_dir().join(format!("rockq-pipeline-{}", std::process::id()));
    let broker: Broker = Options::new().durability(Durability::Buffered).open(&dir).await?;
    let jobs = broker.queue("thumbnails").await?;
    jobs.send_batch((0..1000).map(|i| format!("image-{i}.png"))).await?;

    let sub = jobs.group("resizer")?.max_in_flight(256).subscribe().await?;
    let started = std::time::Instant::now();
    let done: usize = sub
        .take(1000)
        // Handle up to 32 deliveries at once; they finish (and ack) in any order.
        .map_ok(|delivery| async move {
            let work = Duration::from_micros(100 + delivery.seq() % 5 * 50);
            tokio::time::sleep(work).await; // stands in for real async work
            delivery.ack()?;
            Ok::<_, rockq::Error>(1usize)
        })
        .try_buffer_unordered(32)
        .try_fold(0, |n, one| async move { Ok(n + one) })
        .await?;

    let mut check = jobs.group("resizer")?.subscribe().await?;
    let committed = check.commit().await?;
    println!("handled {done} jobs in {:?}; committed offset {committed}", started.elapsed());
    assert!(futures::poll!(check.next()).is_pending(), "everything was consumed");
    drop(check);

    broker.shutdown().await?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
