//! Export and import (`Broker::export`, `Broker::import`) against real databases: an import
//! holds every kind of record the export held, as it was; an export taken under load is a
//! consistent prefix; a bad, foreign or cut-short file is refused by line and leaves nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Broker, Error, ManualClock, Message, Original, Sent, Task, TransferProgress, TransferReport};

/// What a database holds, as its admin API shows it, without what a reopen changes by nature
/// (ages, byte estimates, in-flight counts).
async fn contents(broker: &Broker) -> String {
    let stats = lasting_stats(broker).await;
    let pending: Vec<_> = broker
        .pending("jobs", "workers")
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.seq, p.attempt, p.last_error))
        .collect();
    let schedules: Vec<_> = broker.schedules().await.unwrap().into_iter().map(|s| format!("{s:?}")).collect();
    let delayed: Vec<_> =
        broker.delayed(None, 100).await.unwrap().into_iter().map(|d| format!("{d:?}")).collect();
    let mut messages = Vec::new();
    for q in &stats.queues {
        for m in broker.peek(&q.name, None, 100).await.unwrap() {
            messages.push(format!("{}#{} {:?} {:?} {:?}", q.name, m.seq, m.payload, m.headers, m.key));
        }
    }
    let accounts = broker.kv("accounts").await.unwrap();
    let entries: Vec<_> = accounts
        .scan::<&[u8], _>(..)
        .map(|e| {
            let e = e.unwrap();
            format!("{:?}={:?}@{}", e.key, e.value, e.revision)
        })
        .collect()
        .await;
    format!("{stats:?}\n{pending:?}\n{schedules:?}\n{delayed:?}\n{messages:?}\n{entries:?}")
}

/// The lines of an export with the header's time taken out (the one thing two exports of one
/// state differ in).
fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["t"] == "header" {
                v["exported_at_micros"] = 0.into();
            }
            v
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_holds_every_record_the_export_held_as_it_was() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(&dir.path().join("db"), &clock).await;

    // Queues with headers, ordering keys and a trimmed head; an ordered group two messages in,
    // paused, with a delivery that came back.
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((1..=6).map(|i| format!("o{i}"))).await.unwrap();
    orders.submit(Message::new("keyed").key("customer-7").header("h", &b"\x00\xff"[..])).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 2).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    broker.pause_group("orders", "billing").await.unwrap();
    let mut audit = orders.group("audit").unwrap().subscribe().await.unwrap();
    next(&mut audit).await.nack_after(Duration::from_secs(60));
    audit.commit().await.unwrap();
    drop(audit);
    let trimmed = broker.queue("trimmed").await.unwrap();
    trimmed.send_batch(["t1", "t2", "t3"]).await.unwrap();
    broker.purge_queue("trimmed").await.unwrap();
    trimmed.send("t4").await.unwrap();

    // A work group with a dead letter, a failed job waiting for its retry and a leased one.
    let (js, held) = common::jobs_mid_work(&broker).await;
    // A dead-letter queue redriven in part: a cursor and a letter settled on its own.
    let mail = broker.queue("mail").await.unwrap();
    mail.send_batch(["m1", "m2", "m3"]).await.unwrap();
    let mut senders = mail.work_group("senders").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        next_job(&mut senders).await.dead_letter_durable("bounced").await.unwrap();
    }
    drop(senders);
    let dlq = broker.dead_letters("mail.dlq").await.unwrap();
    dlq.redrive_one(1, None).await.unwrap();
    dlq.delete(3).await.unwrap();
    // Keyspace entries, a delayed message, a recurring schedule, an idempotency key.
    let accounts = broker.kv("accounts").await.unwrap();
    accounts.put("alice", "10").await.unwrap();
    accounts.put(&b"\x00bin"[..], &b"\xff"[..]).await.unwrap();
    accounts.put("alice", "11").await.unwrap();
    let later = broker.queue("later").await.unwrap();
    later.submit(Message::new("in a minute").deliver_after(Duration::from_secs(60))).await.unwrap();
    broker.schedule("tick", Duration::from_secs(300), "ticks", "tick").await.unwrap();
    let charged = orders.submit(Message::new("charge").idempotency_key("order-9")).await.unwrap();
    assert_eq!(charged, Sent::Appended(8));

    let before = contents(&broker).await;
    let first = dir.path().join("first.jsonl");
    let seen = Arc::new(Mutex::new(Vec::<TransferProgress>::new()));
    let s = seen.clone();
    let report = broker
        .export_with_progress(std::fs::File::create(&first).unwrap(), move |p| s.lock().unwrap().push(*p))
        .await
        .unwrap();
    assert_eq!(report.path, None);
    assert_eq!(report.bytes, std::fs::metadata(&first).unwrap().len());
    let stats = broker.stats().await.unwrap();
    assert_eq!(report.queues, stats.queues.len() as u64, "{report:?}");
    assert_eq!(report.messages, stats.queues.iter().map(|q| q.len).sum::<u64>(), "{report:?}");
    assert_eq!(report.groups, stats.groups.len() as u64, "{report:?}");
    assert_eq!(
        (report.delayed, report.schedules, report.idempotency_keys, report.keyspaces, report.entries),
        (1, 1, 1, 1, 2),
        "{report:?}"
    );
    let last = *seen.lock().unwrap().last().unwrap();
    let messages = report.messages + report.delayed;
    assert_eq!((last.records, last.bytes, last.messages), (report.records, report.bytes, messages));
    assert_eq!(last.total_messages, messages, "the header counts the messages ahead");
    // Every kind of line is in it.
    let kinds: BTreeSet<String> =
        lines_of(&first).iter().map(|l| l["t"].as_str().unwrap().to_owned()).collect();
    let all = [
        "header",
        "queue",
        "message",
        "delayed",
        "group",
        "offset",
        "claim",
        "delivery",
        "redrive",
        "letter",
        "schedule",
        "schedule_due",
        "dedup",
        "keyspace",
        "entry",
        "counter",
        "end",
    ];
    assert_eq!(kinds, all.iter().map(|s| s.to_string()).collect(), "kinds of lines in the export");

    // After the export the live database goes on; the file does not.
    orders.send("after").await.unwrap();
    held.ack_durable().await.unwrap();
    drop(js);
    accounts.put("alice", "12").await.unwrap();
    broker.shutdown().await.unwrap();

    let imported = dir.path().join("imported");
    let read = Broker::import(std::fs::File::open(&first).unwrap(), &imported).await.unwrap();
    assert_eq!(read.path.as_deref(), Some(imported.as_path()));
    let mut without_path = read.clone();
    without_path.path = None;
    assert_eq!(without_path, report, "the import read what the export wrote");
    let broker = open_clock(&imported, &clock).await;
    assert_eq!(contents(&broker).await, before, "the imported database is the database at the export");
    // Exported again, it is the same file: nothing was lost or changed on the way.
    let second = dir.path().join("second.jsonl");
    broker.export(std::fs::File::create(&second).unwrap()).await.unwrap();
    assert_eq!(lines_of(&second), lines_of(&first));

    // It behaves as the original would have: the idempotency key is remembered, sequences go
    // on after the export's, keyspace revisions too.
    let orders = broker.queue("orders").await.unwrap();
    assert_eq!(
        orders.submit(Message::new("charge again").idempotency_key("order-9")).await.unwrap(),
        Sent::Duplicate(Original::Appended(8))
    );
    assert_eq!(orders.send("o9").await.unwrap(), 9);
    let accounts = broker.kv("accounts").await.unwrap();
    let alice = accounts.get("alice").await.unwrap().unwrap();
    accounts.put("alice", "12").await.unwrap();
    assert!(accounts.get("alice").await.unwrap().unwrap().revision > alice.revision);
    // Attempts survive: once the old lease and the backoff run out, jobs 2 and 3 come back as
    // their second attempts, then job 4 as its first.
    clock.advance(Duration::from_secs(31));
    let mut js =
        broker.queue("jobs").await.unwrap().work_group("workers").unwrap().subscribe().await.unwrap();
    let mut got = BTreeMap::new();
    for _ in 0..3 {
        let j = next_job(&mut js).await;
        got.insert(j.seq(), j.attempt());
        j.ack_durable().await.unwrap();
    }
    assert_eq!(got, BTreeMap::from([(2, 2), (3, 2), (4, 1)]));
    drop(js);
    // The ordered group resumes at its committed offset once resumed.
    broker.resume_group("orders", "billing").await.unwrap();
    let mut sub = broker.queue("orders").await.unwrap().group("billing").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 3);
    drop(sub);
    // The delayed message comes due in its queue.
    clock.advance(Duration::from_secs(60));
    let mut later = broker.queue("later").await.unwrap().group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut later).await.payload().as_ref(), b"in a minute");
    drop(later);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_taken_under_load_is_a_consistent_prefix_of_the_database() {
    let dir = tempdir();
    let broker = open(&dir.path().join("db")).await;
    let q = broker.queue("q").await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let resolved = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let highest = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::new();
    for p in 0..4 {
        let (q, stop, resolved, highest) = (q.clone(), stop.clone(), resolved.clone(), highest.clone());
        producers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let payload = format!("p{p}-{n}");
                let seq = q.send(payload.clone()).await.unwrap();
                resolved.lock().unwrap().push((seq, payload));
                highest.fetch_max(seq, Ordering::SeqCst);
                n += 1;
            }
        }));
    }
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let consumer = tokio::spawn(async move {
        while let Some(Ok(d)) = sub.next().await {
            d.ack().unwrap();
        }
    });
    let pool = tokio::spawn(
        q.work_group("w").unwrap().workers(4).run(|_t: Task| async { Ok::<(), rockq::HandlerError>(()) }),
    );
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while highest.load(Ordering::SeqCst) < 3_000 {
        assert!(tokio::time::Instant::now() < deadline, "the load never reached 3,000 messages");
        tokio::task::yield_now().await;
    }
    let before: Vec<(u64, String)> = resolved.lock().unwrap().clone();
    let file = dir.path().join("under-load.jsonl");
    broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    let after = highest.load(Ordering::SeqCst);
    while highest.load(Ordering::SeqCst) < after + 1_000 {
        assert!(tokio::time::Instant::now() < deadline, "the load stopped after the export");
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    for p in producers {
        p.abort();
    }
    consumer.abort();
    pool.abort();
    drop(broker);

    let imported = dir.path().join("imported");
    Broker::import(std::fs::File::open(&file).unwrap(), &imported).await.unwrap();
    let broker = open(&imported).await;
    let stats = broker.stats().await.unwrap();
    let last = stats.queues.iter().find(|s| s.name == "q").unwrap().last_seq;
    assert!(
        last >= before.iter().map(|(s, _)| *s).max().unwrap(),
        "a send resolved before the export is missing"
    );
    let mut stored = BTreeMap::new();
    let mut from = 1;
    while from <= last {
        let page = broker.peek("q", Some(from), 1_000).await.unwrap();
        assert!(!page.is_empty(), "nothing stored from {from} up to {last}");
        for m in page {
            assert_eq!(m.seq, from, "a hole in the export's sequences");
            stored.insert(m.seq, String::from_utf8(m.payload.to_vec()).unwrap());
            from += 1;
        }
    }
    for (seq, payload) in &before {
        assert_eq!(stored.get(seq), Some(payload), "message {seq} differs in the export");
    }
    for g in stats.groups.iter().filter(|g| g.queue == "q") {
        assert!(
            g.committed <= last,
            "{}: offset {} past the export's last message {last}",
            g.group,
            g.committed
        );
    }
    for p in broker.pending("q", "w").await.unwrap() {
        assert!(p.seq <= last, "a claim of {} past the export's last message {last}", p.seq);
    }
    broker.shutdown().await.unwrap();
}

/// A small export to spoil: two queues, a group, a keyspace.
async fn small_export(dir: &Path) -> Vec<String> {
    let broker = open(&dir.join("source")).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    sub.commit().await.unwrap();
    drop(sub);
    broker.queue("r").await.unwrap().send("x").await.unwrap();
    broker.kv("ks").await.unwrap().put("k", "v").await.unwrap();
    let file = dir.join("small.jsonl");
    broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    broker.shutdown().await.unwrap();
    std::fs::read_to_string(&file).unwrap().lines().map(str::to_owned).collect()
}

async fn import_lines(lines: &[String], into: &Path) -> Result<TransferReport, Error> {
    let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    Broker::import(std::io::Cursor::new(text.into_bytes()), into).await
}

/// `f` applied to the first line of kind `t`.
fn edit(lines: &[String], t: &str, f: impl Fn(&mut serde_json::Value)) -> Vec<String> {
    let mut done = false;
    lines
        .iter()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if !done && v["t"] == t {
                f(&mut v);
                done = true;
                return v.to_string();
            }
            l.clone()
        })
        .collect()
}

#[tokio::test]
async fn a_bad_foreign_or_cut_short_file_is_refused_by_line_and_leaves_nothing() {
    let dir = tempdir();
    let lines = small_export(dir.path()).await;
    let into = dir.path().join("into");
    let n = lines.len();
    let reason = |r: Result<TransferReport, Error>| match r {
        Err(Error::Invalid { reason }) => reason,
        other => panic!("expected Invalid, got {other:?}"),
    };
    let cases: Vec<(&str, Vec<String>, String)> = vec![
        ("cut short", lines[..n - 1].to_vec(), format!("line {}", n - 1)),
        ("cut after a message", lines[..3].to_vec(), "cut short".into()),
        ("not an export", vec!["{\"hello\":1}".into()], "line 1".into()),
        ("no header first", lines[1..].to_vec(), "line 1: the first line is not a header".into()),
        ("a foreign format", edit(&lines, "header", |v| v["format"] = "other".into()), "line 1".into()),
        ("a newer line format", edit(&lines, "header", |v| v["version"] = 2.into()), "version 2".into()),
        (
            "a bad base64 payload",
            edit(&lines, "message", |v| v["body"]["payload"] = "***".into()),
            "line 3".into(),
        ),
        ("an unknown field", edit(&lines, "message", |v| v["x"] = 1.into()), "line 3".into()),
        ("out of order", edit(&lines, "message", |v| v["seq"] = 2.into()), "out of order".into()),
        ("past the queue's end", edit(&lines, "message", |v| v["seq"] = 9.into()), "outside".into()),
        (
            "a message of no queue",
            edit(&lines, "message", |v| v["queue"] = "zz".into()),
            "no queue line".into(),
        ),
        ("a bad queue name", edit(&lines, "queue", |v| v["name"] = "a:b".into()), "line 2".into()),
        (
            "an offset that does not decode",
            edit(&lines, "offset", |v| v["record"] = "AAE=".into()),
            "offset".into(),
        ),
        ("a wrong count", edit(&lines, "end", |v| v["records"] = 1.into()), format!("line {n}")),
        ("a line after the end", [lines.clone(), vec![lines[1].clone()]].concat(), "after the end".into()),
        (
            "an entry twice",
            [lines[..n - 1].to_vec(), vec![lines[n - 2].clone(), lines[n - 1].clone()]].concat(),
            "out of key order".into(),
        ),
    ];
    for (what, bad, expected) in cases {
        let r = reason(import_lines(&bad, &into).await);
        assert!(r.contains(&expected), "{what}: {r}");
        assert!(!into.exists(), "{what}: a refused import left {into:?}");
        assert!(!dir.path().join(".into.rockq-import").exists(), "{what}: a staging directory was left");
    }
    // Another database format's records: refused as such.
    let newer = edit(&lines, "header", |v| v["records_format"] = 99.into());
    assert!(matches!(import_lines(&newer, &into).await, Err(Error::IncompatibleVersion { found: 99, .. })));
    assert!(!into.exists());
    // A target that holds something is left alone; an empty directory is taken.
    std::fs::create_dir(&into).unwrap();
    std::fs::write(into.join("keep"), b"keep").unwrap();
    assert!(matches!(import_lines(&lines, &into).await, Err(Error::Invalid { .. })));
    assert_eq!(std::fs::read(into.join("keep")).unwrap(), b"keep");
    std::fs::remove_file(into.join("keep")).unwrap();
    let report = import_lines(&lines, &into).await.unwrap();
    assert_eq!((report.queues, report.messages, report.groups, report.entries), (2, 4, 1, 1));
    let broker = open(&into).await;
    assert_eq!(broker.peek("q", None, 10).await.unwrap().len(), 3);
    broker.shutdown().await.unwrap();
}

/// A writer that fails after `left` bytes.
struct FailingWriter {
    left: usize,
    written: Arc<Mutex<Vec<u8>>>,
}

impl Write for FailingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.left {
            return Err(std::io::Error::other("disk full"));
        }
        self.left -= buf.len();
        self.written.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_export_whose_output_fails_reports_it_and_its_part_is_refused_by_import() {
    let dir = tempdir();
    let broker = open(&dir.path().join("db")).await;
    // Two MiB of messages: more than the export's buffer, so the failure comes mid-way.
    let q = broker.queue("q").await.unwrap();
    q.send_batch((0..2048).map(|i| vec![i as u8; 1024])).await.unwrap();
    let written = Arc::new(Mutex::new(Vec::new()));
    let out = FailingWriter { left: 1 << 20, written: written.clone() };
    assert!(matches!(broker.export(out).await, Err(Error::Io { .. })));
    // The broker goes on.
    assert_eq!(q.send("after").await.unwrap(), 2049);
    broker.shutdown().await.unwrap();
    assert!(matches!(broker.export(Vec::new()).await, Err(Error::Shutdown)));

    let part = written.lock().unwrap().clone();
    assert!(!part.is_empty());
    let into = dir.path().join("into");
    let e = Broker::import(std::io::Cursor::new(part), &into).await.unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
    assert!(!into.exists());
}
