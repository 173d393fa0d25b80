//! A worker pool on a work-queue group: retries with backoff, a poison message that ends in
//! the dead-letter queue, and lifecycle events.
//!
//! `cargo run --example work_queue`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rockq::{Broker, CancellationToken, Event, HandlerError, HandlerResultExt, RetryPolicy, Task};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let emails = broker.queue("emails").await?;
    emails.send_batch(["to:ada", "to:grace", "flaky:linus", "poison", "to:barbara"]).await?;

    let group = emails.work_group("mailer")?.lease(Duration::from_secs(30)).retry_policy(
        RetryPolicy::default().max_attempts(3).backoff(Duration::from_millis(20), Duration::from_secs(1)),
    );

    // Print what happens; stop the pool once every message is acked or dead-lettered.
    let stop = CancellationToken::new();
    let mut events = broker.events();
    let watcher = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut finished = 0;
            while let Ok(e) = events.recv().await {
                match &e {
                    Event::Acked { .. } | Event::DeadLettered { .. } => finished += 1,
                    Event::Retried { .. } => {}
                    _ => continue,
                }
                println!("event: {e:?}");
                if finished == 5 {
                    stop.cancel();
                    return;
                }
            }
        })
    };

    // The handler: `Ok` acks; an error retries with backoff; `dead_letter` gives up at once.
    let flaky_calls = Arc::new(AtomicU32::new(0));
    let handler = move |task: Task| {
        let flaky_calls = flaky_calls.clone();
        async move {
            let text = std::str::from_utf8(task.payload()).dead_letter()?;
            match text {
                "poison" => Err(HandlerError::retry(format!("cannot render attempt {}", task.attempt()))),
                t if t.starts_with("flaky:") && flaky_calls.fetch_add(1, Ordering::SeqCst) < 1 => {
                    Err(HandlerError::retry("smtp timeout"))
                }
                t => {
                    println!("sent mail {t} (seq {}, attempt {})", task.seq(), task.attempt());
                    Ok(())
                }
            }
        }
    };
    let report = group.workers(4).shutdown_on(stop).run(handler).await?;
    watcher.await.ok();
    println!("pool report: {report:?}");

    let dlq = broker.dead_letters("emails.dlq").await?;
    for d in dlq.list(10).await? {
        println!(
            "dead letter: {:?} from {:?}#{:?} after {} attempts: {}",
            String::from_utf8_lossy(&d.payload),
            d.queue,
            d.seq,
            d.attempts,
            d.reason
        );
    }
    broker.shutdown().await?;
    Ok(())
}
