//! Tracing: structured fields on the lifecycle events, and no per-message noise at INFO.
//! One test: the subscriber is process-global (the writer runs on its own thread).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rockq::{ManualClock, RetryPolicy};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

#[derive(Debug, Clone)]
struct Seen {
    level: Level,
    message: String,
    fields: Vec<(String, String)>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

struct Collect(Arc<Mutex<Vec<Seen>>>);

struct Fields(Vec<(String, String)>, String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.1 = v;
        } else {
            self.0.push((field.name().to_owned(), v.trim_matches('"').to_owned()));
        }
    }
}

impl<S: Subscriber> Layer<S> for Collect {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if !event.metadata().target().starts_with("rockq") {
            return;
        }
        let mut f = Fields(Vec::new(), String::new());
        event.record(&mut f);
        self.0.lock().unwrap().push(Seen { level: *event.metadata().level(), message: f.1, fields: f.0 });
    }
}

#[tokio::test]
async fn lifecycle_events_carry_fields_and_info_has_no_per_message_noise() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Collect(seen.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("global subscriber");

    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("orders").await.unwrap();
    q.send_batch((0..50).map(|i| format!("m{i}"))).await.unwrap();
    let mut sub = q.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 50).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);

    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["a", "b"]).await.unwrap();
    let wg = jobs.work_group("workers").unwrap().retry_policy(
        RetryPolicy::default()
            .max_attempts(5)
            .backoff(Duration::from_secs(1), Duration::from_secs(1))
            .jitter(0.0),
    );
    let mut js = wg.subscribe().await.unwrap();
    let (a, b) = (next_job(&mut js).await, next_job(&mut js).await);
    a.fail_durable("flaky").await.unwrap();
    b.dead_letter_durable("poison").await.unwrap();
    drop(js);
    broker.trim().await.unwrap();
    broker.shutdown().await.unwrap();

    let events = seen.lock().unwrap().clone();
    let find = |msg: &str| events.iter().filter(|e| e.message == msg).cloned().collect::<Vec<_>>();

    // Per-message events exist, with their coordinates, at TRACE only.
    let delivered = find("rockq: delivered");
    assert!(delivered.len() >= 52, "{} delivered events", delivered.len());
    for e in &delivered {
        assert_eq!(e.level, Level::TRACE);
        assert!(
            e.field("queue").is_some() && e.field("group").is_some() && e.field("seq").is_some(),
            "{e:?}"
        );
    }
    let acked = find("rockq: acked");
    assert!(acked.iter().any(|e| e.field("seq") == Some("50") && e.field("group") == Some("billing")));
    assert!(find("rockq: sent").iter().all(|e| e.level == Level::TRACE && e.field("queue").is_some()));

    // Lifecycle events: retry (DEBUG), dead letter (WARN), trim (INFO), with their fields.
    let retry = &find("rockq: retry scheduled")[0];
    assert_eq!(
        (retry.level, retry.field("seq"), retry.field("attempt")),
        (Level::DEBUG, Some("1"), Some("1"))
    );
    assert_eq!(retry.field("error"), Some("flaky"));
    let dead = &find("rockq: dead-lettered")[0];
    assert_eq!(dead.level, Level::WARN);
    assert_eq!(
        (dead.field("queue"), dead.field("group"), dead.field("seq")),
        (Some("jobs"), Some("workers"), Some("2"))
    );
    assert_eq!((dead.field("attempt"), dead.field("dlq")), (Some("1"), Some("jobs.dlq")));
    let trimmed = find("rockq: trimmed");
    assert!(trimmed.iter().any(|e| e.level == Level::INFO && e.field("queue") == Some("orders")));

    // INFO and above: nothing per message in a clean run (dead letters and lease expiries are
    // the exceptions, and they are rare by nature).
    let noisy: Vec<_> = events
        .iter()
        .filter(|e| e.level <= Level::INFO && e.field("seq").is_some())
        .filter(|e| e.message != "rockq: dead-lettered")
        .collect();
    assert!(noisy.is_empty(), "per-message events at INFO or above: {noisy:?}");
    let info = events.iter().filter(|e| e.level <= Level::INFO).count();
    assert!(info < 20, "{info} events at INFO or above for 52 messages");
}
