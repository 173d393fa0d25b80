//! Per-key ordering in a work-queue group: messages with the same key run one at a time, in
//! order, while different keys run in parallel on a worker pool.
//!
//! `cargo run --example per_key`

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rockq::{Broker, CancellationToken, HandlerError, Message, Task};

const KEYS: [&str; 4] = ["account-1", "account-2", "account-3", "account-4"];
const PER_KEY: u32 = 5;

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let ledger = broker.queue("ledger").await?;

    // Interleaved: account-1 op 1, account-2 op 1, …, account-1 op 2, …
    let messages = (1..=PER_KEY).flat_map(|n| KEYS.map(|key| Message::new(format!("{key} op {n}")).key(key)));
    ledger.send_batch(messages).await?;

    // What each key has run, in the order it ran.
    let runs: Arc<Mutex<BTreeMap<String, Vec<u32>>>> = Arc::default();
    let stop = CancellationToken::new();
    let total = KEYS.len() * PER_KEY as usize;

    let handler = {
        let (runs, stop) = (runs.clone(), stop.clone());
        move |task: Task| {
            let (runs, stop) = (runs.clone(), stop.clone());
            async move {
                let key = task.key().unwrap_or("-").to_owned();
                let text = String::from_utf8_lossy(task.payload()).into_owned();
                let n: u32 = text
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| HandlerError::dead_letter("no op number"))?;
                // Uneven work, so that without per-key ordering later ops would often overtake
                // earlier ones.
                tokio::time::sleep(Duration::from_millis(u64::from(50 - 9 * n))).await;
                println!("  {text} (seq {})", task.seq());
                let mut runs = runs.lock().unwrap_or_else(|e| e.into_inner());
                runs.entry(key).or_default().push(n);
                if runs.values().map(Vec::len).sum::<usize>() == total {
                    stop.cancel(); // all done: the pool drains and `run` returns
                }
                Ok(())
            }
        }
    };

    // Eight workers, but at most one message per key at a time.
    let group = ledger.work_group("bookkeeper")?.ordered_by_key(true);
    let report = group.workers(8).shutdown_on(stop).run(handler).await?;
    println!("pool report: {report:?}");

    let runs = std::mem::take(&mut *runs.lock().unwrap_or_else(|e| e.into_inner()));
    for (key, ops) in &runs {
        let in_order = ops.windows(2).all(|w| w[0] < w[1]);
        println!("{key}: ran ops {ops:?} — {}", if in_order { "in order" } else { "OUT OF ORDER" });
        assert!(in_order);
    }
    broker.shutdown().await?;
    Ok(())
}
