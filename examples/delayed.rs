//! Delayed messages and a recurring schedule: deliver later, cancel, reschedule, and an
//! interval schedule that sends on its own.
//!
//! `cargo run --example delayed`

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use rockq::{Broker, Message, Recurrence, Sent};

/// The schedule entry of a delayed message (`submit` answers `Scheduled` for one).
fn scheduled(sent: Sent) -> rockq::ScheduledMessage {
    match sent {
        Sent::Scheduled(s) => s,
        other => panic!("expected a delayed message, got {other:?}"),
    }
}

/// `in 1.0s` (or `-` for no time).
fn from_now(t: Option<SystemTime>) -> String {
    t.map_or_else(
        || "-".into(),
        |t| format!("in {:.1}s", t.duration_since(SystemTime::now()).unwrap_or_default().as_secs_f64()),
    )
}

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let reminders = broker.queue("reminders").await?;
    let start = Instant::now();

    // A plain send is visible at once; a delayed one waits in the schedule and gets its
    // sequence only when it falls due.
    reminders.send("now").await?;
    let in_1s = Message::new("after 1s").deliver_after(Duration::from_secs(1));
    let in_1s = scheduled(reminders.submit(in_1s).await?);
    println!("scheduled #{} due {}", in_1s.id, from_now(Some(in_1s.due)));

    // Cancel one before it is due: it is never delivered.
    let cancelled =
        scheduled(reminders.submit(Message::new("cancelled").deliver_after(Duration::from_secs(1))).await?);
    println!("cancelled #{}: {}", cancelled.id, reminders.cancel(cancelled.id).await?);

    // Move one from an hour away to two seconds from now.
    let moved = Message::new("moved to 2s").key("customer-7").deliver_after(Duration::from_secs(3600));
    let moved = scheduled(reminders.submit(moved).await?);
    let moved = reminders.reschedule(moved.id, SystemTime::now() + Duration::from_secs(2)).await?;
    println!("rescheduled #{}: due {}", moved.map_or(0, |m| m.id), from_now(moved.map(|m| m.due)));

    // A recurring schedule: every second (a cron expression works too, e.g.
    // `Recurrence::cron("0 */5 * * * *")?`). Its first firing is one interval from now.
    let next = broker
        .schedule("heartbeat", Recurrence::every(Duration::from_secs(1)), "reminders", "heartbeat")
        .await?;
    println!("schedule heartbeat fires first {}", from_now(next));

    for s in reminders.delayed(10).await? {
        println!(
            "waiting: #{} due {}, {} bytes, key {:?}",
            s.id,
            from_now(Some(s.due)),
            s.payload_len,
            s.key
        );
    }

    // Receive until the moved message and two heartbeats have arrived.
    let mut sub = reminders.group("mailer")?.subscribe().await?;
    let (mut got_moved, mut heartbeats) = (false, 0);
    while !got_moved || heartbeats < 2 {
        let Some(delivery) = sub.next().await else { break };
        let delivery = delivery?;
        let text = String::from_utf8_lossy(delivery.payload()).into_owned();
        println!("{:>5} ms: seq {} {text:?}", start.elapsed().as_millis(), delivery.seq());
        got_moved |= text == "moved to 2s";
        heartbeats += usize::from(text == "heartbeat");
        delivery.ack()?;
    }
    sub.commit().await?;

    for s in broker.schedules().await? {
        let last_seq = s.last.map(|(_, seq)| seq);
        println!(
            "schedule {} ({}): fired {} times, last as seq {last_seq:?}, next {}",
            s.name,
            s.recurrence,
            s.fired,
            from_now(s.next)
        );
    }
    broker.delete_schedule("heartbeat").await?;
    broker.shutdown().await?;
    Ok(())
}
