//! Priorities: a password-reset mail must not wait behind a newsletter. 20,000 newsletter
//! mails are queued; then a few urgent mails arrive while a pool works through the backlog.
//! Each urgent one is claimed next, ahead of whatever is left; the newsletter still drains in
//! order. A second group shows the share: one claim in four goes to the oldest mail whatever
//! its priority, so a steady stream of urgent mail cannot starve the rest.
//!
//! `cargo run --example priorities`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rockq::{Broker, Message, Task};

const NEWSLETTER: u64 = 20_000;

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let mail = broker.queue("mail").await?;
    for chunk in 0..NEWSLETTER / 1000 {
        mail.send_batch((0..1000).map(|i| format!("newsletter #{}", chunk * 1000 + i))).await?;
    }
    println!("{NEWSLETTER} newsletter mails queued");

    // The pool: counts what it sends, and says when an urgent one went out.
    let sent = Arc::new(AtomicU64::new(0));
    let count = sent.clone();
    let pool = mail.work_group("senders")?.workers(4).spawn(move |task: Task| {
        let count = count.clone();
        async move {
            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
            if task.priority() > 0 {
                println!(
                    "  sent {:?} (priority {}) as mail number {n}",
                    String::from_utf8_lossy(task.payload()),
                    task.priority()
                );
            }
            Ok(())
        }
    });

    // Urgent mail arrives while the backlog drains: each is claimed next.
    for user in ["ana", "bo", "chen"] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let started = Instant::now();
        let seq = mail.send(Message::new(format!("reset password for {user}")).priority(9)).await?;
        let status = broker.wait_job("mail", "senders", seq).await?;
        println!(
            "reset for {user}: sequence {seq}, done {:?} after it was sent ({} mails still waiting)",
            started.elapsed(),
            NEWSLETTER + 3 - sent.load(Ordering::Relaxed).min(NEWSLETTER + 3),
        );
        assert_eq!(status.priority, 9);
    }
    let group = mail.work_group("senders")?;
    while group.committed() < Some(NEWSLETTER + 3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.shutdown().await?;
    println!("all {} mails sent", sent.load(Ordering::Relaxed));

    // Fairness: a group that gives every fourth claim to the oldest mail.
    let digest = broker.queue("digest").await?;
    for i in 1..=4 {
        digest.send(format!("weekly digest {i}")).await?;
    }
    for i in 1..=6 {
        digest.send(Message::new(format!("alert {i}")).priority(5)).await?;
    }
    let mut order = Vec::new();
    let mut jobs =
        digest.work_group("readers")?.priority_share(4).read_batch(1).max_in_flight(1).subscribe().await?;
    use futures::StreamExt;
    while order.len() < 10 {
        let job = jobs.next().await.expect("a job")?;
        order.push(String::from_utf8_lossy(job.payload()).into_owned());
        job.ack()?;
    }
    println!("with priority_share(4): {}", order.join(", "));
    broker.shutdown().await
}
