//! Idempotent producers: a message sent twice with the same idempotency key is written once;
//! the second send is reported as a duplicate of the first.
//!
//! `cargo run --example dedup`

use std::time::Duration;

use rockq::{Broker, Message, Original, Sent};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let payments = broker.queue("payments").await?;
    println!("dedup window: {:?}", payments.dedup_window());

    // A retried request: the same key twice. `submit` says what happened to each.
    let charge = || Message::new("charge 10 EUR").idempotency_key("order-42/charge");
    let first = payments.submit(charge()).await?;
    let retry = payments.submit(charge()).await?;
    println!("first:  {first:?}"); // Appended(1)
    println!("retry:  {retry:?} (duplicate: {})", retry.is_duplicate()); // Duplicate(Appended(1))
    assert_eq!(retry, Sent::Duplicate(Original::Appended(1)));

    // `send` works too: a duplicate answers with the original's sequence.
    println!("send:   seq {}", payments.send(charge()).await?);

    // Within one atomic batch, the second copy of a key is the duplicate.
    let batch = payments
        .submit_batch([
            Message::new("refund 5 EUR").idempotency_key("order-43/refund"),
            Message::new("refund 5 EUR").idempotency_key("order-43/refund"),
            Message::new("charge 7 EUR").idempotency_key("order-44/charge"),
        ])
        .await?;
    println!("batch:  {batch:?}");

    // A delayed message's duplicate points at its schedule id.
    let later =
        || Message::new("capture").idempotency_key("order-42/capture").deliver_after(Duration::from_secs(60));
    println!("later:  {:?}", payments.submit(later()).await?);
    println!("again:  {:?}", payments.submit(later()).await?);

    // Keys are remembered for the dedup window (5 minutes unless set); after it, the same key
    // is a new message.
    payments.set_dedup_window(Duration::from_millis(500)).await?;
    println!("dedup window now: {:?}", payments.dedup_window());
    let ping = || Message::new("ping").idempotency_key("ping-1");
    println!("ping:   {:?}", payments.submit(ping()).await?);
    println!("ping:   {:?} (within the window)", payments.submit(ping()).await?);
    tokio::time::sleep(Duration::from_millis(600)).await;
    println!("ping:   {:?} (after the window)", payments.submit(ping()).await?);

    println!("queue holds {} messages", payments.len());
    broker.shutdown().await?;
    Ok(())
}
