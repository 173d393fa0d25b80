//! The web console over a broker with live traffic: producers on `orders` and `emails`, an
//! ordered group (`billing`) that keeps up most of the time, and a worker pool (`mailer`) whose
//! jobs sometimes fail, are retried, and end in `emails.dlq` — so every part of the console has
//! something to show: lag, in-flight leases, retries, dead letters to redrive.
//!
//! `cargo run --example console --features web` then open <http://127.0.0.1:8080/>. The
//! address comes from the first argument or `ROCKQ_CONSOLE_ADDR`; the token (to log in and use
//! the actions) from `ROCKQ_CONSOLE_TOKEN`, default `demo`. Stop with Ctrl-C.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, HandlerError, Message, RetryPolicy, Task};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("ROCKQ_CONSOLE_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".into())
        .parse()?;
    let token = std::env::var("ROCKQ_CONSOLE_TOKEN").unwrap_or_else(|_| "demo".into());
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let orders = broker.queue("orders").await?;
    let emails = broker.queue("emails").await?;

    // Producers: orders in bursts (so the chart has a shape), a steady trickle of emails.
    let producer = {
        let (orders, emails) = (orders.clone(), emails.clone());
        tokio::spawn(async move {
            for tick in 0u64.. {
                let burst = 1 + (tick % 20) / 4;
                let batch = (0..burst).map(|i| {
                    Message::new(format!(
                        r#"{{"order": {}, "total": {}.{:02}}}"#,
                        tick * 10 + i,
                        tick % 90,
                        i
                    ))
                    .header("customer", format!("c-{}", tick % 7))
                });
                let _ = orders.send_batch(batch).await;
                if tick.is_multiple_of(3) {
                    let _ = emails.send(format!("to:user{}@example.com", tick % 50)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // An ordered group that slows down now and then: lag rises and falls.
    let billing = {
        let group = orders.group("billing")?;
        tokio::spawn(async move {
            let Ok(mut sub) = group.subscribe().await else { return };
            let mut n = 0u64;
            while let Some(Ok(d)) = sub.next().await {
                n += 1;
                let slow = (n / 100).is_multiple_of(4);
                tokio::time::sleep(Duration::from_millis(if slow { 150 } else { 30 })).await;
                let _ = d.ack();
            }
        })
    };

    // A worker pool: one email in six fails twice, one in twenty-five never succeeds.
    let mailer = emails.work_group("mailer")?.lease(Duration::from_secs(30)).retry_policy(
        RetryPolicy::default().max_attempts(3).backoff(Duration::from_secs(1), Duration::from_secs(5)),
    );
    let pool = mailer.workers(4).spawn(|task: Task| async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        match task.seq() {
            s if s.is_multiple_of(25) => {
                Err(HandlerError::retry(format!("550 mailbox unavailable (attempt {})", task.attempt())))
            }
            s if s.is_multiple_of(6) && task.attempt() < 3 => Err(HandlerError::retry("smtp timeout")),
            _ => Ok(()),
        }
    });

    let mut console =
        rockq::web::Console::new(broker.clone()).token(token.clone()).sample_every(Duration::from_secs(2));
    let listener = console.bind(addr).await?;
    println!("rockq console on http://{}/ (token: {token}); Ctrl-C to stop", listener.local_addr()?);
    tokio::select! {
        r = console.serve_on(listener) => r?,
        r = tokio::signal::ctrl_c() => r?,
    }
    producer.abort();
    billing.abort();
    let report = pool.shutdown().await;
    println!("mailer: {report:?}");
    broker.shutdown().await?;
    Ok(())
}
