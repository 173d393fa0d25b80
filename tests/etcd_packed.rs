//! Packed messages on etcd (namespace format 3, `store/etcd/segment.rs`): an append stores its
//! messages as one key, under the run's last sequence. Against a real single-member etcd, what
//! every reader sees is what one key per message gave: subscriptions whose reads start and
//! stop inside a run, a work group's retry read back by its sequence alone (retries scattered
//! through a run read with it once), a trim whose cut goes through a run, an export; and a
//! namespace of format 2 (rockq before packing) is read and written as it was.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::time::Duration;

use rockq::{Broker, EtcdOptions, ManualClock, Message, Retention};

use common::HANG_GUARD;

async fn connect(cluster: &etcd::Cluster, ns: &str, clock: &ManualClock) -> Broker {
    let opts = EtcdOptions::new()
        .options(rockq::Options::new().clock(clock.clone()).retention_interval(Duration::ZERO));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

/// The message entries of namespace `ns` as etcd holds them: the sequence each key names
/// (its last 8 bytes) and the value.
async fn entries(etcd: &mut etcd_client::Client, ns: &str) -> Vec<(u64, Vec<u8>)> {
    let got = etcd
        .get(format!("{ns}/m/"), Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read etcd");
    got.kvs()
        .iter()
        .map(|kv| {
            let k = kv.key();
            let seq = u64::from_be_bytes(k[k.len() - 8..].try_into().expect("8 bytes"));
            (seq, kv.value().to_vec())
        })
        .collect()
}

/// How many messages a stored value holds: a packed run's count, or 1 for an envelope.
fn held(value: &[u8]) -> u16 {
    match value {
        [0xE5, hi, lo, ..] => u16::from_be_bytes([*hi, *lo]),
        _ => 1,
    }
}

async fn next(sub: &mut rockq::Subscription) -> rockq::Delivery {
    tokio::time::timeout(HANG_GUARD, futures::StreamExt::next(sub))
        .await
        .expect("a delivery in time")
        .expect("open")
        .expect("ok")
}

async fn next_job(jobs: &mut rockq::WorkSubscription) -> rockq::Job {
    tokio::time::timeout(HANG_GUARD, futures::StreamExt::next(jobs))
        .await
        .expect("a job in time")
        .expect("open")
        .expect("ok")
}

/// One `send_batch` is one key; subscriptions reading 7 at a time (each read after the first
/// starts inside the run, most end inside it) deliver all 100 in order, once, on two brokers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_is_one_key_and_reads_starting_and_stopping_inside_it_deliver_every_message() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "packed", &clock).await, connect(&cluster, "packed", &clock).await);
    let qa = a.queue("q").await.unwrap();
    let seqs = qa.send_batch((1..=100).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    assert_eq!(seqs, 1..=100);
    let stored = entries(&mut etcd, "packed").await;
    assert_eq!(stored.len(), 1, "one key for the append");
    assert_eq!((stored[0].0, held(&stored[0].1)), (100, 100), "keyed by its last sequence");

    for (broker, group) in [(&a, "ga"), (&b, "gb")] {
        let q = broker.queue("q").await.unwrap();
        let mut sub = q.group(group).unwrap().read_batch(7).subscribe().await.unwrap();
        for i in 1..=100u64 {
            let d = next(&mut sub).await;
            assert_eq!((d.seq(), d.payload().as_ref()), (i, format!("m{i}").as_bytes()));
            d.ack().unwrap();
        }
    }
    // A later append of one message is its envelope, under its own sequence.
    assert_eq!(qa.send("one").await.unwrap(), 101);
    let stored = entries(&mut etcd, "packed").await;
    assert_eq!(stored.iter().map(|(s, v)| (*s, held(v))).collect::<Vec<_>>(), [(100, 100), (101, 1)]);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A job failed inside a run comes back after its backoff with its own payload: its retry is
/// read by sequence alone (the key holding it is the run's, further on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_inside_a_run_is_read_back_by_its_sequence() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "retry", &clock).await;
    let q = a.queue("q").await.unwrap();
    q.send_batch((1..=30).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    let backoff = Duration::from_secs(60);
    let policy = rockq::RetryPolicy::default().max_attempts(5).backoff(backoff, backoff).jitter(0.0);
    let mut jobs = q.work_group("w").unwrap().retry_policy(policy).subscribe().await.unwrap();
    for i in 1..=30u64 {
        let job = next_job(&mut jobs).await;
        assert_eq!(job.seq(), i);
        if i == 15 {
            job.fail_durable("503").await.unwrap();
        } else {
            job.ack_durable().await.unwrap();
        }
    }
    clock.advance(backoff + Duration::from_secs(1));
    let again = next_job(&mut jobs).await;
    assert_eq!((again.seq(), again.attempt(), again.payload().as_ref()), (15, 2, b"m15".as_slice()));
    again.ack_durable().await.unwrap();
    drop(jobs);
    a.shutdown().await.unwrap();
}

/// A trim whose cut goes through a run leaves the run only what follows the cut: a group
/// started after it, an export and etcd itself hold 16..=20 and nothing before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_through_a_run_keeps_only_what_follows_the_cut() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "cut", &clock).await;
    let q = a.queue("q").await.unwrap();
    q.send_batch((1..=20).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    q.set_retention(Retention::MaxLen(5)).await.unwrap();
    let report = a.trim().await.unwrap();
    assert_eq!(report.trimmed, [("q".to_owned(), 15, 16)]);
    let stored = entries(&mut etcd, "cut").await;
    assert_eq!(stored.iter().map(|(s, v)| (*s, held(v))).collect::<Vec<_>>(), [(20, 5)]);

    let mut sub = q.group("late").unwrap().read_batch(2).subscribe().await.unwrap();
    for i in 16..=20u64 {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().as_ref()), (i, format!("m{i}").as_bytes()));
        d.ack().unwrap();
    }
    drop(sub);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cut.jsonl");
    a.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let exported: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("\"t\":\"message\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["seq"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(exported, (16..=20).collect::<Vec<u64>>(), "{text}");
    a.shutdown().await.unwrap();
}

/// A namespace of format 2 (written by rockq before packing) stays one key per message: this
/// build reads it and writes it as it was, and leaves its format record alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_format_2_is_written_one_key_per_message_as_before() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    etcd.put("old/meta/format", b"rockq\x02".to_vec(), None).await.unwrap();
    let clock = ManualClock::new();
    let a = connect(&cluster, "old", &clock).await;
    let q = a.queue("q").await.unwrap();
    q.send_batch((1..=50).map(|i| Message::new(format!("m{i}")))).await.unwrap();
    let stored = entries(&mut etcd, "old").await;
    assert_eq!(
        stored.iter().map(|(s, v)| (*s, held(v))).collect::<Vec<_>>(),
        (1..=50).map(|s| (s, 1)).collect::<Vec<_>>()
    );
    let mut sub = q.group("g").unwrap().read_batch(7).subscribe().await.unwrap();
    for i in 1..=50u64 {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().as_ref()), (i, format!("m{i}").as_bytes()));
        d.ack().unwrap();
    }
    drop(sub);
    let format = etcd.get("old/meta/format", None).await.unwrap();
    assert_eq!(format.kvs()[0].value(), b"rockq\x02");
    a.shutdown().await.unwrap();

    // A new namespace is created at format 3.
    let b = connect(&cluster, "new", &clock).await;
    let format = etcd.get("new/meta/format", None).await.unwrap();
    assert_eq!(format.kvs()[0].value(), b"rockq\x03");
    b.shutdown().await.unwrap();
}

/// A send call larger than 127 messages whose runs fit one transaction is one append: 4,096
/// messages of 100 bytes are 32 runs of 128 (two operations each), stored without a
/// reservation (a reserved call puts a key per message). One that does not fit (4,096 of
/// 300 bytes: 1.2 MiB) is still reserved and written in parts. Both read back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_whose_runs_fit_one_transaction_is_one_append_of_runs() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "large", &clock).await;
    let q = a.queue("q").await.unwrap();
    let payload = |i: u64, size: usize| format!("{i:0size$}");
    let before = etcd.get("large/", None).await.unwrap().header().unwrap().revision();
    let seqs = q.send_batch((1..=4096).map(|i| payload(i, 100))).await.unwrap();
    assert_eq!(seqs, 1..=4096);
    let after = etcd.get("large/", None).await.unwrap().header().unwrap().revision();
    let stored = entries(&mut etcd, "large").await;
    assert_eq!(
        stored.iter().map(|(s, v)| (*s, held(v))).collect::<Vec<_>>(),
        (1..=32).map(|r| (r * 128, 128)).collect::<Vec<_>>(),
        "32 runs of 128 under their last sequences"
    );
    assert_eq!(after - before, 1, "one transaction");

    let seqs = q.send_batch((4097..=8192).map(|i| payload(i, 300))).await.unwrap();
    assert_eq!(seqs, 4097..=8192);
    let stored = entries(&mut etcd, "large").await;
    let reserved: Vec<(u64, u16)> =
        stored.iter().filter(|(s, _)| *s > 4096).map(|(s, v)| (*s, held(v))).collect();
    assert_eq!(reserved, (4097..=8192).map(|s| (s, 1)).collect::<Vec<_>>(), "reserved: a key per message");

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for i in 1..=8192u64 {
        let d = next(&mut sub).await;
        let size = if i <= 4096 { 100 } else { 300 };
        assert_eq!((d.seq(), d.payload().as_ref()), (i, payload(i, size).as_bytes()));
        d.ack().unwrap();
    }
    drop(sub);
    a.shutdown().await.unwrap();
}

/// Sends staged together are cut into transactions by what they put (runs, index entries,
/// idempotency records), not one operation per message: 1,500 calls in flight at once, some
/// prioritised, some with idempotency keys (a few repeated), are stored once each, in runs of
/// at most 128 that cover the queue exactly, and read back in order with their priorities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_staged_together_are_cut_by_what_their_runs_put() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "round", &clock).await;
    let q = a.queue("q").await.unwrap();
    let message = |i: u64| {
        let mut m = Message::new(format!("m{i}"));
        if i.is_multiple_of(10) {
            m = m.priority(5);
        }
        if i.is_multiple_of(7) {
            // Every 49th repeats the key of the message seven before it: a duplicate.
            let k = if i.is_multiple_of(49) { i - 7 } else { i };
            m = m.idempotency_key(format!("k{k}"));
        }
        m
    };
    let mut receipts = Vec::new();
    for i in 1..=1500u64 {
        receipts.push(q.enqueue(message(i)).await.unwrap());
    }
    let mut seqs = Vec::new();
    for r in receipts {
        seqs.push(tokio::time::timeout(HANG_GUARD, r).await.expect("resolved").unwrap());
    }
    // Each send resolves to its own new sequence, a duplicate to its original's.
    let mut sent = Vec::new();
    for (i, &seq) in (1..=1500u64).zip(&seqs) {
        if i.is_multiple_of(49) {
            assert_eq!(seq, seqs[(i - 7 - 1) as usize], "message {i} duplicates {}", i - 7);
        } else {
            sent.push((i, seq));
        }
    }
    let last = q.last_seq();
    assert_eq!(last, sent.len() as u64);
    assert!(sent.windows(2).all(|w| w[1].1 == w[0].1 + 1), "sequences in send order, no gap");
    let stored = entries(&mut etcd, "round").await;
    assert!(stored.iter().all(|(_, v)| held(v) <= 128));
    assert_eq!(
        stored.iter().map(|(_, v)| u64::from(held(v))).sum::<u64>(),
        last,
        "runs cover the queue once"
    );

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    for &(i, seq) in &sent {
        let d = next(&mut sub).await;
        assert_eq!((d.seq(), d.payload().as_ref()), (seq, format!("m{i}").as_bytes()));
        assert_eq!(d.priority(), if i.is_multiple_of(10) { 5 } else { 0 }, "message {i}");
        d.ack().unwrap();
    }
    drop(sub);
    a.shutdown().await.unwrap();
}

/// Bytes etcd has sent its gRPC clients so far: its `etcd_network_client_grpc_sent_bytes_total`,
/// read from `/metrics` on its client URL.
async fn etcd_sent_bytes(endpoint: &str) -> f64 {
    let addr = endpoint.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).expect("connect to etcd's metrics");
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("ask for metrics");
        let mut page = String::new();
        s.read_to_string(&mut page).expect("read metrics");
        page.lines()
            .find_map(|l| l.strip_prefix("etcd_network_client_grpc_sent_bytes_total "))
            .expect("etcd reports the bytes it sent")
            .trim()
            .parse()
            .expect("a number")
    })
    .await
    .expect("metrics read")
}

/// Runs `n` jobs of `q` once, failing the odd ones, then lets their backoff pass and checks
/// each comes back once with `payload`; returns what etcd sent its clients meanwhile.
async fn fail_the_odd_ones_and_retry(
    q: &rockq::Queue,
    clock: &ManualClock,
    endpoint: &str,
    n: u64,
    payload: impl Fn(u64) -> Vec<u8>,
) -> f64 {
    let backoff = Duration::from_secs(60);
    let policy = rockq::RetryPolicy::default().max_attempts(5).backoff(backoff, backoff).jitter(0.0);
    let mut jobs = q.work_group("w").unwrap().retry_policy(policy).subscribe().await.unwrap();
    for i in 1..=n {
        let job = next_job(&mut jobs).await;
        assert_eq!(job.seq(), i);
        if i % 2 == 1 {
            job.fail_durable("503").await.unwrap();
        } else {
            job.ack_durable().await.unwrap();
        }
    }
    let before = etcd_sent_bytes(endpoint).await;
    clock.advance(backoff + Duration::from_secs(1));
    for i in (1..=n).step_by(2) {
        let again = next_job(&mut jobs).await;
        assert_eq!((again.seq(), again.attempt()), (i, 2));
        assert_eq!(again.payload().as_ref(), payload(i).as_slice());
        again.ack_durable().await.unwrap();
    }
    etcd_sent_bytes(endpoint).await - before
}

/// A work group's retries scattered through one run (every other job of a 128-message append
/// failed) come back with their own payloads, and reading them fetches the run about once:
/// etcd sends less than a quarter of what a get per retry brought (the whole run, 64 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_scattered_through_a_run_are_read_with_the_run_not_a_run_each() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "scattered", &clock).await;
    let q = a.queue("q").await.unwrap();
    let payload = |i: u64| format!("{i:0>400}").into_bytes();
    q.send_batch((1..=128).map(|i| Message::new(payload(i)))).await.unwrap();
    let stored = entries(&mut etcd, "scattered").await;
    assert_eq!(stored.iter().map(|(s, v)| (*s, held(v))).collect::<Vec<_>>(), [(128, 128)], "one run");
    let run = stored[0].1.len() as f64;

    let sent = fail_the_odd_ones_and_retry(&q, &clock, &cluster.endpoints()[0], 128, payload).await;
    eprintln!("64 retries in one run of {run} bytes: etcd sent {sent} bytes");
    assert!(
        sent < 64.0 * run / 4.0,
        "etcd sent {sent} bytes for 64 retries in one run of {run} bytes (a run each: {})",
        64.0 * run
    );
    a.shutdown().await.unwrap();
}

/// Retries scattered through large messages of a key each (a call reserved past one
/// transaction) whose window outgrows the client's 4 MiB answer: read again one sequence at a
/// time, each with its own payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_among_large_messages_too_many_for_one_answer_are_read_one_by_one() {
    let cluster = etcd::Cluster::start(1).await;
    let mut etcd = cluster.client().await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "large", &clock).await;
    let q = a.queue("q").await.unwrap();
    let payload = |i: u64| vec![b'a' + i as u8; 700 << 10];
    q.send_batch((1..=10).map(|i| Message::new(payload(i)))).await.unwrap();
    assert_eq!(etcd::keys_under(&mut etcd, "large/m/").await, 10, "reserved: a key each");

    let sent = fail_the_odd_ones_and_retry(&q, &clock, &cluster.endpoints()[0], 10, payload).await;
    // More than the five messages: the window of all five was asked first, and refused.
    eprintln!("5 retries of 700 KiB: etcd sent {sent} bytes");
    a.shutdown().await.unwrap();
}
