//! Exposing rockq's metrics in Prometheus format: install a recorder, run some traffic, and
//! render `/metrics`. With `-- --serve 127.0.0.1:9898` it keeps serving them over HTTP.
//!
//! `cargo run --example prometheus`

use std::time::Duration;

use futures::StreamExt;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the recorder before traffic: rockq records through the `metrics` facade.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let dir = tempfile::tempdir()?;
    let broker = rockq::Broker::options().metrics_interval(Duration::from_secs(5)).open(dir.path()).await?;
    let orders = broker.queue("orders").await?;
    orders.send_batch((0..1000).map(|i| format!("order {i}"))).await?;
    let mut billing = orders.group("billing")?.subscribe().await?;
    for _ in 0..600 {
        if let Some(d) = billing.next().await {
            d?.ack()?;
        }
    }
    billing.commit().await?;
    // Refresh the gauges now rather than waiting for the interval.
    broker.stats().await?;

    let rendered = prometheus.render();
    for line in rendered.lines().filter(|l| l.starts_with("rockq_") && !l.contains("_bucket")) {
        println!("{line}");
    }

    let mut args = std::env::args().skip(1);
    if let (Some(flag), Some(addr)) = (args.next(), args.next())
        && flag == "--serve"
    {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("serving http://{addr}/metrics (Ctrl-C to stop)");
        loop {
            let (mut conn, _) = listener.accept().await?;
            broker.stats().await?;
            let body = prometheus.render();
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await?;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await?;
            conn.write_all(body.as_bytes()).await?;
        }
    }
    drop(billing);
    broker.shutdown().await?;
    Ok(())
}
