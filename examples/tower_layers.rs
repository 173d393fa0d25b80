//! A `tower::Service` as a worker-pool handler: a rate limit and a timeout from tower's own
//! layers, as in axum or tonic. A timed-out attempt is retried with the group's backoff.
//!
//! `cargo run --example tower_layers --features tower`

use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Event, RetryPolicy, Task};
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let calls = broker.queue("api-calls").await?;
    calls.send_batch((1..=10).map(|i| if i == 4 { "slow".to_string() } else { format!("call {i}") })).await?;

    // At most 5 calls a second across the pool's workers, each given 200 ms.
    let service = ServiceBuilder::new()
        .rate_limit(5, Duration::from_secs(1))
        .timeout(Duration::from_millis(200))
        .service_fn(|task: Task| async move {
            if task.payload().as_ref() == b"slow" && task.attempt() == 1 {
                tokio::time::sleep(Duration::from_secs(5)).await; // the upstream hangs once
            }
            println!("{:?} (attempt {})", String::from_utf8_lossy(task.payload()), task.attempt());
            Ok::<(), rockq::BoxError>(())
        });

    let mut events = broker.event_stream().group("upstream");
    let policy = RetryPolicy::default().backoff(Duration::from_millis(50), Duration::from_secs(1));
    let pool = calls.work_group("upstream")?.retry_policy(policy).workers(4).spawn(service);
    let mut acked = 0;
    while acked < 10 {
        match events.next().await {
            Some(Event::Acked { .. }) => acked += 1,
            Some(Event::Retried { seq, error, .. }) => println!("#{seq} retried: {error}"),
            _ => {}
        }
    }
    println!("{:?}", pool.shutdown().await?);
    broker.shutdown().await?;
    Ok(())
}
