//! The database both console test files look at: queues with messages (one of them a
//! `<script>` payload), an ordered group with a committed offset, a work group with a held
//! lease, a claim waiting for its retry and two dead letters. Time is a `ManualClock`.
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Job, ManualClock, Message, RetryPolicy, WorkSubscription};

use super::common::{next_job, open_clock};

pub const SCRIPT: &str = "<script>alert('pwned')</script>";

/// What must stay alive for the figures to hold: the work subscription and its leased job.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub broker: Broker,
    pub clock: ManualClock,
    pub work: WorkSubscription,
    pub held: Job,
}

pub async fn fixture() -> Fixture {
    let dir = super::common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;

    let orders = broker.queue("orders").await.unwrap();
    orders.send(Message::new(SCRIPT).header("x-note", "<b>bold</b>")).await.unwrap();
    orders.send(r#"{"order": 2, "total": 9.5}"#).await.unwrap();
    orders.send_batch((3..=10).map(|i| format!("order #{i}"))).await.unwrap();
    let mut billing = orders.group("billing").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        let d =
            tokio::time::timeout(super::common::HANG_GUARD, billing.next()).await.unwrap().unwrap().unwrap();
        d.ack_durable().await.unwrap();
    }
    drop(billing);

    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=6).map(|i| format!("job {i}"))).await.unwrap();
    let wg = jobs
        .work_group("workers")
        .unwrap()
        .consumer_name("host-a/1")
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(60), Duration::from_secs(60))
                .jitter(0.0),
        )
        .read_batch(4)
        .max_in_flight(4)
        .keep_outcomes(Duration::from_secs(24 * 3600));
    let mut work = wg.subscribe().await.unwrap();
    let j1 = next_job(&mut work).await;
    let j2 = next_job(&mut work).await;
    let j3 = next_job(&mut work).await;
    let held = next_job(&mut work).await;
    j1.dead_letter_durable("bad input: <missing field>").await.unwrap();
    j2.dead_letter_durable("poison").await.unwrap();
    j3.fail_durable("downstream 503").await.unwrap();
    held.progress("<i>75%</i>").unwrap();
    let accounts = broker.kv("accounts").await.unwrap();
    for name in ["ada", "grace", "linus"] {
        accounts.put(name, "1").await.unwrap();
    }
    clock.advance(Duration::from_secs(5));
    Fixture { dir, broker, clock, work, held }
}

pub fn group<'a>(stats: &'a rockq::Stats, queue: &str, group: &str) -> &'a rockq::GroupStats {
    stats.groups.iter().find(|g| g.queue == queue && g.group == group).expect("group in stats")
}

/// A minimal HTTP/1.1 client over a TCP stream (content-length or chunked answers, read to
/// their end rather than to the connection's close, which chromedriver does not do): enough
/// for the console's pages and for chromedriver's WebDriver API, without an HTTP client crate
/// in the dev-dependencies.
pub async fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_with(addr, method, path, body, &[]).await
}

/// [`http`] with extra header lines (`"Authorization: Bearer …"`).
pub async fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[&str],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let body = body.unwrap_or("");
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024]; // on the heap: a 64 KiB array would sit in every future awaiting this one
    let complete = |raw: &[u8]| -> Option<(u16, String)> {
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let rest = &raw[end + 4..];
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_owned()))
        };
        if let Some(n) = header("content-length").and_then(|n| n.parse::<usize>().ok()) {
            return (rest.len() >= n).then(|| (status, String::from_utf8_lossy(&rest[..n]).into_owned()));
        }
        if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            let mut out = Vec::new();
            let mut at = 0;
            loop {
                let line_end = rest[at..].windows(2).position(|w| w == b"\r\n")? + at;
                let n =
                    usize::from_str_radix(String::from_utf8_lossy(&rest[at..line_end]).trim(), 16).ok()?;
                if n == 0 {
                    return Some((status, String::from_utf8_lossy(&out).into_owned()));
                }
                let data = line_end + 2;
                if rest.len() < data + n + 2 {
                    return None;
                }
                out.extend_from_slice(&rest[data..data + n]);
                at = data + n + 2;
            }
        }
        None
    };
    loop {
        if let Some(done) = complete(&raw) {
            return done;
        }
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            // Closed: whatever came is the body.
            let text = String::from_utf8_lossy(&raw).into_owned();
            let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            return (status, rest.to_owned());
        }
        raw.extend_from_slice(&buf[..n]);
    }
}
