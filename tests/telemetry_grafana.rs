//! `docs/grafana/rockq.json`, the dashboard shipped for rockq's Prometheus metrics: every
//! metric it queries is one rockq records, under the name and shape the Prometheus exporter
//! renders it in after real traffic against a real database, and it shows what an operator
//! needs (throughput, lag and lag age, in flight, retries, dead letters, writer rounds).
//! One test: the recorder is process-global.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use metrics_exporter_prometheus::PrometheusBuilder;
use rockq::telemetry as m;
use rockq::{ManualClock, RetryPolicy};

/// Every `rockq_…` name in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("rockq_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The PromQL of every panel target and template variable of the dashboard.
fn queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    for var in dashboard["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = var["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// The family a rendered or queried series belongs to (a summary's `_sum` and `_count`).
fn family(name: &str) -> &str {
    for h in m::HISTOGRAMS {
        if let Some(suffix) = name.strip_prefix(h)
            && (suffix == "_sum" || suffix == "_count")
        {
            return h;
        }
    }
    name
}

#[tokio::test]
async fn the_grafana_dashboard_queries_only_metrics_rockq_exports_and_covers_what_operators_watch() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // `telemetry::ALL` is every metric constant the module declares.
    let source = std::fs::read_to_string(root.join("src/telemetry.rs")).unwrap();
    let declared: BTreeSet<String> = source
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \"rockq_"))
        .flat_map(metric_names)
        .collect();
    let all: BTreeSet<String> = m::ALL.iter().map(|s| s.to_string()).collect();
    assert_eq!(all, declared, "telemetry::ALL and the constants of src/telemetry.rs differ");

    let text = std::fs::read_to_string(root.join("docs/grafana/rockq.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let queried: BTreeSet<String> = queries(&dashboard).iter().flat_map(|q| metric_names(q)).collect();
    assert_eq!(
        metric_names(&text).into_iter().collect::<BTreeSet<_>>(),
        queried,
        "a metric named outside the queries"
    );
    for name in &queried {
        assert!(all.contains(family(name)), "the dashboard queries {name}, which rockq does not record");
    }
    for needed in [
        m::PRODUCED,
        m::ACKED,
        m::LAG,
        m::OLDEST_UNACKED,
        m::IN_FLIGHT,
        m::RETRIED,
        m::DEAD_LETTERED,
        m::DLQ_DEPTH,
        m::COMMIT_LATENCY,
        m::BATCH_SIZE,
    ] {
        assert!(queried.iter().any(|q| family(q) == needed), "the dashboard does not show {needed}");
    }

    // Real traffic through the Prometheus exporter: every queried series is rendered.
    let prometheus = PrometheusBuilder::new().install_recorder().expect("install the recorder");
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((0..10).map(|i| format!("o{i}"))).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 10).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    broker.pause_group("orders", "billing").await.unwrap();
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["a", "b", "c"]).await.unwrap();
    let mut js = jobs
        .work_group("workers")
        .unwrap()
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(0.0),
        )
        .read_batch(3)
        .max_in_flight(3)
        .subscribe()
        .await
        .unwrap();
    let (a, b, c) = (next_job(&mut js).await, next_job(&mut js).await, next_job(&mut js).await);
    a.ack_durable().await.unwrap();
    b.fail_durable("boom").await.unwrap();
    // c's lease runs out: the next claim takes it over (a lease expiry).
    clock.advance(Duration::from_secs(31));
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(next_job(&mut js).await);
    }
    drop(c);
    for j in seen {
        if j.seq() == 2 {
            j.dead_letter_durable("giving up").await.unwrap();
        } else {
            j.ack_durable().await.unwrap();
        }
    }
    drop(js);
    broker.stats().await.unwrap(); // the gauges
    let rendered = prometheus.render();
    let families: BTreeSet<String> = rendered
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for name in &queried {
        assert!(
            families.contains(family(name)),
            "{name} is not in the exporter's output after the traffic:\n{rendered}"
        );
    }
    for h in m::HISTOGRAMS {
        assert!(rendered.contains(&format!("{h}{{quantile=\"0.99\"}}")), "{h} is not a summary:\n{rendered}");
        assert!(rendered.contains(&format!("{h}_count")), "{h} has no _count:\n{rendered}");
    }
    broker.shutdown().await.unwrap();
}
