//! The transactional outbox, and consume-transform-produce, with rockq transactions.
//!
//! An account service changes its state and must announce every change: the state write and the
//! announcement are one transaction, so no crash can leave a change unannounced or an
//! announcement without its change. A notifier consumes the announcements and records each one
//! it handled in the same transaction as its ack, so each is handled exactly once.
//!
//! `cargo run --example outbox`

use futures::StreamExt;
use rockq::{Broker, Expect};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile_dir()?;
    let broker = Broker::open(&dir).await?;
    let accounts = broker.kv("accounts").await?;
    let events = broker.queue("account-events").await?;

    // The outbox: open three accounts, each write with its event.
    for (name, balance) in [("ada", 100), ("grace", 250), ("linus", 0)] {
        let mut tx = broker.transaction();
        // Create only: a second "open" of the same account conflicts and writes nothing.
        tx.put_if(&accounts, name, balance.to_string(), Expect::Absent)?;
        tx.send(&events, format!("opened {name} with {balance}"))?;
        tx.commit().await?;
    }
    let mut again = broker.transaction();
    again.put_if(&accounts, "ada", "0", Expect::Absent)?;
    again.send(&events, "opened ada with 0")?;
    match again.commit().await {
        Err(e) if e.is_conflict() => println!("ada exists already: nothing written, nothing announced"),
        other => println!("unexpected: {other:?}"),
    }

    // A transfer: read both balances for update, write both, announce it — or nothing.
    let mut tx = broker.transaction();
    let from = tx.get_for_update(&accounts, "grace").await?.expect("grace exists");
    let to = tx.get_for_update(&accounts, "linus").await?.expect("linus exists");
    let (f, t): (i64, i64) = (parse(&from.value), parse(&to.value));
    tx.put(&accounts, "grace", (f - 50).to_string())?;
    tx.put(&accounts, "linus", (t + 50).to_string())?;
    tx.send(&events, "moved 50 from grace to linus")?;
    let done = tx.commit().await?;
    println!("transfer committed at revision {:?}", done.revision());

    // Consume-transform-produce: the notifier handles each event once, recording it with its ack.
    let handled = broker.kv("notifier-handled").await?;
    let mut sub = events.group("notifier")?.subscribe().await?;
    for _ in 0..4 {
        let Some(d) = sub.next().await else { break };
        let d = d?;
        println!("notify: {}", String::from_utf8_lossy(d.payload()));
        let mut tx = broker.transaction();
        tx.put(&handled, d.seq().to_be_bytes(), d.payload().clone())?;
        tx.ack(d);
        tx.commit().await?;
    }
    println!("events handled: {}", handled.len());

    let mut all = accounts.scan::<&[u8], _>(..);
    while let Some(e) = all.next().await {
        let e = e?;
        println!(
            "{} = {} (revision {})",
            String::from_utf8_lossy(&e.key),
            String::from_utf8_lossy(&e.value),
            e.revision
        );
    }
    drop(sub);
    broker.shutdown().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn parse(v: &[u8]) -> i64 {
    String::from_utf8_lossy(v).parse().unwrap_or(0)
}

/// A fresh directory for this run.
fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("rockq-outbox-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(dir)
}
