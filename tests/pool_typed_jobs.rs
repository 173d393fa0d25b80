//! Typed jobs and handlers (issue 17): codecs, `run_typed`, decode failures, handler state,
//! handler errors with their source chain, `tower` services as handlers.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{CancellationToken, Event, HandlerError, HandlerResultExt, RetryPolicy, Task};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

fn quick_retries(n: u32) -> RetryPolicy {
    RetryPolicy::default().max_attempts(n).backoff(Duration::ZERO, Duration::ZERO).jitter(0.0)
}

/// Waits until `n` events matched (acks and dead letters of the group), then cancels `stop`.
fn stop_after(
    broker: &rockq::Broker,
    group: &str,
    n: usize,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Event>> {
    let mut events = broker.event_stream().group(group);
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(e) = events.next().await {
            let done = matches!(e, Event::Acked { .. } | Event::DeadLettered { .. });
            seen.push(e);
            if done
                && seen
                    .iter()
                    .filter(|e| matches!(e, Event::Acked { .. } | Event::DeadLettered { .. }))
                    .count()
                    == n
            {
                stop.cancel();
                break;
            }
        }
        seen
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_sends_reach_a_typed_pool_with_its_state_and_undecodable_payloads_are_dead_lettered_at_once() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("orders").await.unwrap();
    let orders = q.typed::<Order>();
    let sent: Vec<Order> = (1..=20).map(|id| Order { id, cents: id * 100 }).collect();
    orders.send_batch(&sent).await.unwrap();
    orders.send(&Order { id: 21, cents: 2100 }).await.unwrap();
    // Not an Order: JSON of another shape, and bytes no codec wrote.
    q.send(rockq::Message::new(r#"{"id":"x"}"#).header(rockq::CODEC_HEADER, "json")).await.unwrap();
    q.send(rockq::Message::new("plain text")).await.unwrap();

    #[derive(Default)]
    struct Totals {
        cents: AtomicU64,
        calls: AtomicU64,
    }
    let totals = Arc::new(Totals::default());
    let group = q.work_group("billing").unwrap().retry_policy(quick_retries(5));
    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "billing", 23, stop.clone());
    let report = group
        .workers(4)
        .state(totals.clone())
        .shutdown_on(stop)
        .run_typed(|order: Order, task: Task, totals: Arc<Totals>| async move {
            assert_eq!(task.decode::<Order>().unwrap(), order, "the handler's value is the task's payload");
            totals.cents.fetch_add(order.cents, Ordering::SeqCst);
            totals.calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap();
    let events = watcher.await.unwrap();
    assert_eq!(report.acked, 21);
    assert_eq!(totals.calls.load(Ordering::SeqCst), 21);
    assert_eq!(totals.cents.load(Ordering::SeqCst), (1..=21).map(|i| i * 100).sum::<u64>());
    assert_eq!(report.failed, 2, "the two undecodable payloads");
    // No retries were spent on them: dead-lettered on their first attempt.
    assert!(!events.iter().any(|e| matches!(e, Event::Retried { .. })), "{events:?}");
    let dead = broker.dead_letters("orders.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.len(), 2);
    for d in &dead {
        assert_eq!(d.attempts, 1);
        assert!(d.reason.contains("does not decode as") && d.reason.contains("Order"), "{}", d.reason);
    }
    let reason = |p: &str| dead.iter().find(|d| d.payload.as_ref() == p.as_bytes()).unwrap().reason.clone();
    assert!(reason(r#"{"id":"x"}"#).contains("invalid type"), "serde's own message is kept");
    assert!(reason("plain text").contains("expected value"), "{}", reason("plain text"));
    broker.shutdown().await.unwrap();
}

#[cfg(feature = "postcard")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postcard_queue_is_decoded_by_its_header_not_by_guessing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("bin").await.unwrap();
    let bin = q.typed_with::<Order, _>(rockq::Postcard);
    bin.send(&Order { id: 1, cents: 5 }).await.unwrap();
    q.typed::<Order>().send(&Order { id: 2, cents: 6 }).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap().decoded::<Order>();
    let (a, da) = sub.next().await.unwrap().unwrap();
    let (b, db) = sub.next().await.unwrap().unwrap();
    assert_eq!((a.id, b.id), (1, 2));
    assert_eq!(da.header(rockq::CODEC_HEADER).unwrap().as_ref(), b"postcard");
    assert_eq!(db.header(rockq::CODEC_HEADER).unwrap().as_ref(), b"json");
    assert!(da.payload().len() < db.payload().len());
    da.ack().unwrap();
    db.ack().unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_typed_stream_yields_a_decode_error_dead_letters_the_message_and_goes_on() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("orders").await.unwrap();
    let orders = q.typed::<Order>();
    orders.send(&Order { id: 1, cents: 1 }).await.unwrap();
    let bad = q.send("not json").await.unwrap();
    orders.send(&Order { id: 3, cents: 3 }).await.unwrap();

    let mut sub = q.group("audit").unwrap().subscribe().await.unwrap().decoded::<Order>();
    let (first, d1) = sub.next().await.unwrap().unwrap();
    assert_eq!(first.id, 1);
    d1.ack().unwrap();
    match sub.next().await.unwrap() {
        Err(rockq::Error::Decode(e)) => {
            assert_eq!((e.queue(), e.seq(), e.codec()), ("orders", bad, "json"));
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    let (third, d3) = sub.next().await.unwrap().unwrap();
    assert_eq!(third.id, 3);
    d3.ack_durable().await.unwrap();
    // The offset passed the bad message: it is in the dead-letter queue, not lost.
    assert_eq!(sub.subscription().committed(), 3);
    let dead = broker.dead_letters("orders.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].seq, dead[0].payload.as_ref()), (Some(bad), &b"not json"[..]));
    assert!(dead[0].reason.contains("does not decode"), "{}", dead[0].reason);
    broker.shutdown().await.unwrap();
}

#[derive(Debug, thiserror::Error)]
#[error("charging order {0}")]
struct ChargeFailed(u64, #[source] std::io::Error);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_keep_their_source_chain_in_the_retry_error_and_the_dead_letter_reason() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["anyhow", "boxed", "typed"]).await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(quick_retries(2));
    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "w", 3, stop.clone());
    let report = group
        .workers(1)
        .shutdown_on(stop)
        .run(|task: Task| async move {
            match task.payload().as_ref() {
                b"anyhow" => {
                    let root = std::io::Error::other("connection reset");
                    let e = anyhow::Error::new(root).context("calling the bank");
                    // `?` on an anyhow::Error: retried, then dead-lettered after 2 attempts.
                    Err(e)?;
                }
                b"boxed" => {
                    let e: Box<dyn std::error::Error + Send + Sync> = "quota exceeded".into();
                    Err(e).dead_letter()?;
                }
                _ => Err(ChargeFailed(7, std::io::Error::other("card declined")))?,
            }
            Ok(())
        })
        .await
        .unwrap();
    let events = watcher.await.unwrap();
    assert_eq!(report.failed, 5, "anyhow twice, boxed once, typed twice");
    let retried: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Retried { error, .. } => Some(error.to_string()),
            _ => None,
        })
        .collect();
    assert!(retried.contains(&"calling the bank: connection reset".to_string()), "{retried:?}");
    assert!(retried.contains(&"charging order 7: card declined".to_string()), "{retried:?}");
    let dead = broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    let reasons: Vec<_> = dead.iter().map(|d| (d.payload.clone(), d.reason.clone())).collect();
    assert_eq!(dead.len(), 3, "{reasons:?}");
    let reason = |p: &str| reasons.iter().find(|(b, _)| b.as_ref() == p.as_bytes()).unwrap().1.clone();
    assert!(
        reason("anyhow").ends_with("last error: calling the bank: connection reset"),
        "{}",
        reason("anyhow")
    );
    assert_eq!(reason("boxed"), "quota exceeded");
    assert!(reason("typed").ends_with("charging order 7: card declined"), "{}", reason("typed"));
    broker.shutdown().await.unwrap();
}

/// A `Handler` type with state, through the trait.
struct Count;

#[async_trait::async_trait]
impl rockq::Handler<Arc<AtomicU64>> for Count {
    async fn handle(&self, _task: Task, seen: &Arc<AtomicU64>) -> Result<(), HandlerError> {
        seen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_trait_gets_the_pool_state() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((0..10).map(|i| i.to_string())).await.unwrap();
    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "w", 10, stop.clone());
    let seen = Arc::new(AtomicU64::new(0));
    let pool = q.work_group("w").unwrap().workers(3).state(seen.clone()).shutdown_on(stop);
    let report = pool.run(Count).await.unwrap();
    watcher.await.unwrap();
    assert_eq!(report.acked, 10);
    assert_eq!(seen.load(Ordering::SeqCst), 10, "every call saw the one shared state");
    broker.shutdown().await.unwrap();
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_tower_timeout_layer_turns_a_stuck_attempt_into_a_retry() {
    use tower::ServiceBuilder;

    // Leases and backoff run on a manual clock; tokio's paused clock only drives the tower
    // timeout, and auto-advances to it once the stuck attempt is the only thing left.
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("slow once").await.unwrap();
    let svc = ServiceBuilder::new().timeout(Duration::from_secs(5)).service_fn(|task: Task| async move {
        if task.attempt() == 1 {
            futures::future::pending::<()>().await;
        }
        Ok::<(), rockq::BoxError>(())
    });
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(60)).retry_policy(quick_retries(3));
    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "w", 1, stop.clone());
    let report = group.workers(1).shutdown_on(stop).run(svc).await.unwrap();
    let events = watcher.await.unwrap();
    assert_eq!((report.failed, report.acked), (1, 1), "{report:?}");
    let retried = events.iter().find_map(|e| match e {
        Event::Retried { error, attempt, .. } => Some((error.to_string(), *attempt)),
        _ => None,
    });
    assert_eq!(retried, Some(("request timed out".to_string(), 1)));
    broker.shutdown().await.unwrap();
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_service_can_dead_letter_through_its_layers() {
    use tower::ServiceBuilder;

    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("poison").await.unwrap();
    let svc = ServiceBuilder::new().concurrency_limit(2).timeout(Duration::from_secs(60)).service_fn(
        |_task: Task| async move { Err::<(), _>(HandlerError::dead_letter("malformed invoice").into_boxed()) },
    );
    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "w", 1, stop.clone());
    q.work_group("w")
        .unwrap()
        .retry_policy(quick_retries(5))
        .workers(2)
        .shutdown_on(stop)
        .run(svc)
        .await
        .unwrap();
    watcher.await.unwrap();
    let dead = broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!((dead.len(), dead[0].attempts, dead[0].reason.as_str()), (1, 1, "malformed invoice"));
    broker.shutdown().await.unwrap();
}

/// Regression (review of issue 17): a message naming a codec this build lacks was
/// dead-lettered at once, so one misbuilt consumer emptied the queue into the DLQ. It is a
/// deployment problem, not the message's: pools retry it, typed streams stop at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_this_build_lacks_is_retried_or_stops_the_stream_instead_of_dead_lettering() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send(rockq::Message::new("<order/>").header(rockq::CODEC_HEADER, "xml")).await.unwrap();

    let mut ordered = q.group("g").unwrap().subscribe().await.unwrap().decoded::<Order>();
    match ordered.next().await.unwrap() {
        Err(rockq::Error::Decode(e)) => assert!(e.is_unknown_codec() && e.codec() == "xml", "{e}"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert!(ordered.next().await.is_none(), "the stream stops at it");
    drop(ordered);

    let stop = CancellationToken::new();
    let watcher = stop_after(&broker, "w", 1, stop.clone());
    let group = q.work_group("w").unwrap().retry_policy(quick_retries(2));
    group.workers(1).shutdown_on(stop).run_typed(|_o: Order, _t: Task| async { Ok(()) }).await.unwrap();
    let events = watcher.await.unwrap();
    assert!(
        matches!(
            events.iter().find(|e| !matches!(e, Event::Delivered { .. })),
            Some(Event::Retried { attempt: 1, .. })
        ),
        "retried first, not dead-lettered at once: {events:?}"
    );
    // The ordered group never dead-lettered it: the only dead letter is the pool's, after its
    // attempts were used up.
    let dead = broker.dead_letters("q.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].group.as_deref(), dead[0].attempts), (Some("w"), 2));
    broker.shutdown().await.unwrap();
}
