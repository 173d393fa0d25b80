//! The lifecycle event stream (`Broker::events`): filtered by queue and group, ending at
//! shutdown. (Moved here from the former `api_contract.rs`, issue 17.)

mod common;

use common::*;
use futures::StreamExt;
use rockq::Event;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_filters_by_queue_and_group() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let (a, b) = (broker.queue("a").await.unwrap(), broker.queue("b").await.unwrap());
    let mut only_a_x = broker.event_stream().queue("a").group("x");
    let mut all = broker.event_stream();
    for q in [&a, &b] {
        q.send("m").await.unwrap();
        for g in ["x", "y"] {
            let mut sub = q.work_group(g).unwrap().subscribe().await.unwrap();
            next_job(&mut sub).await.ack_durable().await.unwrap();
        }
    }
    // Every queue and group got a Delivered and an Acked: 8 events, of which 2 are a/x.
    let mut seen = Vec::new();
    while seen.len() < 8 {
        seen.push(all.next().await.unwrap());
    }
    let filtered = [only_a_x.next().await.unwrap(), only_a_x.next().await.unwrap()];
    assert!(filtered.iter().all(|e| e.queue() == "a" && e.group() == Some("x")), "{filtered:?}");
    assert!(matches!(filtered[1], Event::Acked { .. }));
    assert_eq!(seen.iter().filter(|e| e.queue() == "a" && e.group() == Some("x")).count(), 2);
    assert_eq!(only_a_x.missed(), 0);
    broker.shutdown().await.unwrap();
    assert!(only_a_x.next().await.is_none(), "the stream ends at shutdown");
}
