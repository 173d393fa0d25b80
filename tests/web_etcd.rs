//! The console over the etcd engine (features `web` and `etcd`), against a real single-member
//! etcd started on loopback ports chosen at run time: every page a several-instance deployment
//! opens answers with the figures of `Broker::stats`, flows included — never a 500 or a broken
//! page; per-job and per-letter actions work as embedded.

mod common;
#[path = "common/etcd.rs"]
mod etcd;
#[path = "common/web_client.rs"]
mod web_client;

use std::time::Duration;

use axum::http::StatusCode;
use rockq::web::Console;
use rockq::{Broker, EtcdOptions};
use web_client::{TOKEN, get, post, table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_works_on_etcd() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = Broker::connect_etcd(
        cluster.endpoints(),
        "console",
        EtcdOptions::new().owner_ttl(Duration::from_secs(2)),
    )
    .await
    .expect("connect to etcd");
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=4).map(|i| format!("job {i}"))).await.unwrap();
    let mut sub =
        jobs.work_group("workers").unwrap().read_batch(2).max_in_flight(2).subscribe().await.unwrap();
    common::next_job(&mut sub).await.dead_letter_durable("poison").await.unwrap();
    let held = common::next_job(&mut sub).await;
    let app = Console::new(broker.clone()).token(TOKEN).public_reads(true).manual_sampling().router();

    let stats = broker.stats().await.unwrap();
    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let queues = table(&page.body, "queues");
    assert_eq!(queues.len(), stats.queues.len());
    for (row, q) in queues.iter().zip(&stats.queues) {
        assert_eq!(row["len"], q.len.to_string());
    }
    for path in [
        "/queues/jobs",
        "/queues/jobs?order=oldest&field=key&q=none",
        "/groups/jobs/workers",
        "/dlq/jobs.dlq",
        "/metrics",
        "/api/stats",
    ] {
        let a = get(&app, path).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.body);
    }
    let page = get(&app, "/queues/jobs?order=oldest").await.body;
    let states: Vec<_> = table(&page, "messages")
        .iter()
        .map(|r| r["state-in-workers"].split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(states, ["dead", "leased", "open", "open"]);
    let claims = table(&get(&app, "/groups/jobs/workers").await.body, "claims");
    assert_eq!(claims.len(), broker.pending("jobs", "workers").await.unwrap().len());

    // Delayed messages and recurring schedules are listed as embedded.
    let hour = std::time::Duration::from_secs(3600);
    broker.schedule("nightly-report", hour, "jobs", "tick").await.unwrap();
    let later = rockq::Message::new("later").deliver_after(hour);
    let jobs = broker.queue("jobs").await.unwrap();
    let rockq::Sent::Scheduled(s) = jobs.submit(later).await.unwrap() else { panic!("not delayed") };
    let a = get(&app, "/delayed").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(table(&a.body, "schedules").len(), 1, "{}", a.body);
    assert!(a.body.contains("nightly-report"), "{}", a.body);
    assert_eq!(table(&a.body, "delayed").len(), 1, "{}", a.body);
    assert!(jobs.cancel(s.id).await.unwrap());
    // Flows are listed and shown as embedded.
    let steps = broker.queue("steps").await.unwrap().work_group("s").unwrap();
    let mut flow = broker.flow();
    let first = flow.job(&steps, "first").unwrap();
    flow.then(&steps, "second", &[first]).unwrap();
    let id = flow.submit().await.unwrap().id;
    let rows = table(&get(&app, "/flows").await.body, "flows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["flow"], id.to_string());
    let page = get(&app, &format!("/flows/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let states: Vec<_> = table(&page.body, "steps").iter().map(|r| r["state"].clone()).collect();
    assert!(states[0].contains("queued") && states[1].contains("waiting"), "{states:?}");
    let a = get(&app, "/api/flows").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains(&id.to_string()), "{}", a.body);
    let bearer = format!("Bearer {TOKEN}");
    let h = [("authorization", bearer.as_str())];
    assert_eq!(broker.stats().await.unwrap().groups[0].committed, 1);
    // Per-letter actions work on etcd: letter 1 deleted, then gone (404), the page lists none.
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 1);
    let a = post(&app, "/api/dlq/jobs.dlq/letters/1/delete", "", &h).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(dlq.len().await.unwrap(), 0);
    let a = post(&app, "/api/dlq/jobs.dlq/letters/1/delete", "", &h).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    assert_eq!(broker.stats().await.unwrap().groups[0].dlq_depth, 0);

    // Per-job actions work on etcd: the held job is refused (409, untouched), job 3 is deleted.
    let a = post(&app, "/api/groups/jobs/workers/jobs/2/delete", "", &h).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    let a = post(&app, "/api/groups/jobs/workers/jobs/3/delete", "", &h).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    held.ack_durable().await.unwrap();
    assert_eq!(broker.stats().await.unwrap().groups[0].committed, 3, "1 dead, 2 acked, 3 deleted");
    drop(sub);
    broker.shutdown().await.unwrap();
}
