//! Produce to a queue and consume it with a consumer group.
//!
//! Run twice to see the group resume after its committed offset:
//! `cargo run --example quickstart`

use futures::StreamExt;
use rockq::{Broker, Message};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let path = std::env::temp_dir().join("rockq-quickstart");
    let broker = Broker::open(&path).await?;
    let orders = broker.queue("orders").await?;

    // Producers: single sends and an atomic batch, group-committed by the writer.
    let first = orders.send(Message::new("order #1").header("customer", "ada")).await?;
    let batch = orders.send_batch(["order #2", "order #3"]).await?;
    println!("sent seq {first} and {batch:?} to {:?} at {}", orders.name(), path.display());

    // A consumer group: resumes after its committed offset, acks commit in order.
    let mut billing = orders.group("billing")?.subscribe().await?;
    let mut handled = 0;
    while handled < 3 {
        let Some(delivery) = billing.next().await else { break };
        let delivery = delivery?;
        println!(
            "billing got seq {} {:?} (customer: {:?})",
            delivery.seq(),
            String::from_utf8_lossy(delivery.payload()),
            delivery.header("customer").map(|v| String::from_utf8_lossy(v).into_owned()),
        );
        delivery.ack()?;
        handled += 1;
    }
    let committed = billing.commit().await?;
    println!("billing committed offset: {committed} (queue holds {} messages)", orders.len());

    broker.shutdown().await?;
    Ok(())
}
