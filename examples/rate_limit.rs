//! Rate and concurrency limits: a payment provider takes at most 5 calls a second and 2 at
//! once. A pool of 8 workers drains 20 charges under both limits, stored with the group; the
//! broker is closed halfway and opened again, and the limit goes on where it was — a restart
//! does not refill the bucket into a burst. Each line shows when a call started and how many
//! ran at that moment.
//!
//! `cargo run --example rate_limit`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rockq::{Broker, RateLimit, Task};

const CHARGES: u64 = 20;

async fn run_until(broker: &Broker, started: Instant, last: u64) -> Result<(), rockq::Error> {
    let running = Arc::new(AtomicUsize::new(0));
    let charges = broker.queue("charges").await?;
    // Set on the first run, stored with the group; the second run adopts them (setting other
    // values would be refused until `WorkGroup::update`).
    let group = charges.work_group("provider")?.rate_limit(RateLimit::per_second(5)).concurrency_limit(2);
    // Stores them (and creates the group) before anything asks about its jobs.
    group.update().await?;
    let pool = group.workers(8).spawn(move |task: Task| {
        let running = running.clone();
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            println!("  {:>5} ms  charge {:>2}  ({now} running)", started.elapsed().as_millis(), task.seq());
            tokio::time::sleep(Duration::from_millis(300)).await; // the provider's call
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    });
    broker.wait_job("charges", "provider", last).await?;
    let stats = broker.stats().await?;
    if let Some(g) = stats.groups.iter().find(|g| g.group == "provider") {
        println!("  held back by a limit now: {}", g.limited);
    }
    pool.shutdown().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    {
        let broker = Broker::open(dir.path()).await?;
        let charges = broker.queue("charges").await?;
        charges.send_batch((1..=CHARGES).map(|i| format!("charge #{i}"))).await?;
        println!("{CHARGES} charges queued; at most 5 a second, 2 at once, 8 workers");
        run_until(&broker, started, CHARGES / 2).await?;
        broker.shutdown().await?;
    }
    println!("restarted: the bucket is where the last claims left it");
    let broker = Broker::open(dir.path()).await?;
    run_until(&broker, started, CHARGES).await?;
    let secs = started.elapsed().as_secs_f64();
    println!("{CHARGES} charges in {secs:.1} s (the limit: at least {:.1} s)", (CHARGES - 1) as f64 / 5.0);
    broker.shutdown().await?;
    Ok(())
}
