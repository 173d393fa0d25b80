//! Typed jobs: a queue of `Order`s, a pool whose handler takes an `Order` and the
//! application's state, and an anyhow error whose cause chain ends up in the dead letter.
//!
//! `cargo run --example typed_jobs`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use futures::StreamExt;
use rockq::{Broker, Event, HandlerResultExt, Task};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

#[derive(Default)]
struct Ledger {
    cents: AtomicU64,
}

fn charge(order: &Order) -> anyhow::Result<()> {
    anyhow::ensure!(order.cents > 0, "amount must be positive, got {}", order.cents);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let orders = broker.queue("orders").await?;
    let new_orders = [Order { id: 1, cents: 250 }, Order { id: 2, cents: 0 }, Order { id: 3, cents: 990 }];
    orders.typed::<Order>().send_batch(&new_orders).await?;

    let mut done = broker.event_stream().group("billing");
    let ledger = Arc::new(Ledger::default());
    let pool = orders.work_group("billing")?.workers(4).state(ledger.clone()).spawn_typed(
        |order: Order, _task: Task, ledger: Arc<Ledger>| async move {
            // A bad amount never gets better: dead-letter it, with the whole cause chain.
            charge(&order).with_context(|| format!("charging order {}", order.id)).dead_letter()?;
            ledger.cents.fetch_add(order.cents, Ordering::Relaxed);
            Ok(())
        },
    );
    let mut finished = 0;
    while finished < new_orders.len() {
        if let Some(Event::Acked { .. } | Event::DeadLettered { .. }) = done.next().await {
            finished += 1;
        }
    }
    let report = pool.shutdown().await?;
    println!("charged {} cents; {report:?}", ledger.cents.load(Ordering::Relaxed));
    for d in broker.dead_letters("orders.dlq").await?.list(10).await? {
        println!("dead letter (order seq {:?}): {}", d.seq, d.reason);
    }
    broker.shutdown().await?;
    Ok(())
}
