//! The `rockq` admin CLI, run as a separate process against databases these tests create with
//! the library. `--json` output is parsed back and checked field by field.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn rockq(db: &Path) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_rockq"));
    cmd.arg("--db").arg(db).env_remove("ROCKQ_DB").timeout(HANG_GUARD);
    cmd
}

fn json(db: &Path, args: &[&str]) -> Value {
    let out = rockq(db).arg("--json").args(args).assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&out)))
}

fn text(db: &Path, args: &[&str]) -> String {
    String::from_utf8(rockq(db).args(args).assert().success().get_output().stdout.clone()).unwrap()
}

/// Five orders (billing committed 2) and three jobs (one dead-lettered, one held by `cli-test`).
async fn populate(broker: &rockq::Broker) -> (rockq::WorkSubscription, rockq::Job) {
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch(["o1", "o2", "o3", "o4", "o5"]).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 2).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    let accounts = broker.kv("accounts").await.unwrap();
    accounts.put("alice", "1").await.unwrap();
    accounts.put("bob", "2").await.unwrap();
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2", "j3"]).await.unwrap();
    let mut js = jobs
        .work_group("workers")
        .unwrap()
        .consumer_name("cli-test")
        .lease(Duration::from_secs(3600))
        .keep_outcomes(Duration::from_secs(3600))
        .read_batch(2)
        .max_in_flight(2)
        .subscribe()
        .await
        .unwrap();
    next_job(&mut js).await.dead_letter_durable("malformed").await.unwrap();
    let held = next_job(&mut js).await;
    held.progress("row 40 of 90").unwrap();
    broker.flush().await.unwrap();
    (js, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_inspect_a_database_the_service_holds() {
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let broker = open(&db).await;
    let (_js, held) = populate(&broker).await;

    let stats = json(&db, &["stats"]);
    assert!(stats["bytes_on_disk"].as_u64().unwrap() > 0);
    let queues = stats["queues"].as_array().unwrap();
    let orders = queues.iter().find(|q| q["name"] == "orders").unwrap();
    assert_eq!(
        (orders["first_seq"].as_u64(), orders["last_seq"].as_u64(), orders["len"].as_u64()),
        (Some(1), Some(5), Some(5))
    );
    let groups = stats["groups"].as_array().unwrap();
    let billing = groups.iter().find(|g| g["group"] == "billing").unwrap();
    assert_eq!(billing["mode"], "ordered");
    assert_eq!((billing["committed"].as_u64(), billing["lag"].as_u64()), (Some(2), Some(3)));
    assert!(billing["oldest_unacked_age_secs"].as_f64().is_some());
    assert_eq!(billing["paused"], false);
    let workers = groups.iter().find(|g| g["group"] == "workers").unwrap();
    assert_eq!(workers["mode"], "work-queue");
    assert_eq!(
        (workers["committed"].as_u64(), workers["lag"].as_u64(), workers["in_flight"].as_u64()),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!(
        (workers["dead_letter_queue"].as_str(), workers["dlq_depth"].as_u64()),
        (Some("jobs.dlq"), Some(1))
    );
    // The settings stored with the work group: its lease and the default retry policy.
    assert_eq!(workers["lease_secs"].as_f64(), Some(3600.0));
    assert_eq!(
        (
            workers["retry_policy"]["max_attempts"].as_u64(),
            workers["retry_policy"]["initial_backoff_secs"].as_f64()
        ),
        (Some(5), Some(1.0))
    );
    assert_eq!(workers["ordered_by_key"], false);
    assert!(billing["lease_secs"].is_null() && billing["retry_policy"].is_null(), "ordered: none stored");

    // Keyspaces, with their key counts.
    assert_eq!(stats["keyspaces"], serde_json::json!([{ "name": "accounts", "keys": 2 }]));

    let table = text(&db, &["stats"]);
    assert!(
        table.contains("LEASE") && table.contains("1h00m") && table.contains("5 (1.0s..5m00s)"),
        "{table}"
    );
    assert!(table.contains("KEYSPACE") && table.contains("accounts"), "{table}");
    assert!(
        table.contains("QUEUE")
            && table.contains("LAG")
            && table.contains("billing")
            && table.contains("jobs.dlq (1)"),
        "{table}"
    );

    let only = json(&db, &["groups", "--queue", "jobs"]);
    assert_eq!(only["groups"].as_array().unwrap().len(), 1);
    assert!(only.get("queues").is_none());

    let page = json(&db, &["peek", "orders", "--from", "2", "--limit", "2"]);
    let seqs: Vec<u64> = page.as_array().unwrap().iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![2, 3]);
    assert_eq!(page[0]["payload"]["text"], "o2");
    assert!(text(&db, &["peek", "orders"]).contains("o5"));

    let pending = json(&db, &["pending", "jobs", "workers"]);
    let claims = pending.as_array().unwrap();
    assert_eq!(claims.len(), 1, "{pending}");
    assert_eq!(claims[0]["seq"].as_u64(), Some(held.seq()));
    assert_eq!(
        (claims[0]["state"].as_str(), claims[0]["holder"].as_str()),
        (Some("leased"), Some("cli-test"))
    );
    assert_eq!(claims[0]["attempt"].as_u64(), Some(1));
    assert!(claims[0]["lease_deadline_micros"].as_u64().unwrap() > 0);
    assert!(text(&db, &["pending", "jobs", "workers"]).contains("cli-test"));

    // One job: the held one, and the dead-lettered one (finished for its group).
    let seq = held.seq().to_string();
    let job = json(&db, &["job", "jobs", "workers", &seq]);
    assert_eq!(
        (job["seq"].as_u64(), job["state"].as_str(), job["attempt"].as_u64(), job["holder"].as_str()),
        (Some(held.seq()), Some("leased"), Some(1), Some("cli-test")),
        "{job}"
    );
    assert!(job["lease_remaining_secs"].as_f64().unwrap() > 0.0, "{job}");
    assert!(job["due_in_secs"].is_null(), "{job}");
    assert_eq!(job["progress"]["text"].as_str(), Some("row 40 of 90"), "{job}");
    assert!(job["outcome"].is_null(), "{job}");
    assert_eq!(job["priority"].as_u64(), Some(0), "{job}");
    let finished = json(&db, &["job", "jobs", "workers", "1"]);
    assert_eq!((finished["state"].as_str(), finished["attempt"].as_u64()), (Some("finished"), Some(0)));
    let outcome = &finished["outcome"];
    assert_eq!(
        (outcome["kind"].as_str(), outcome["attempt"].as_u64(), outcome["reason"].as_str()),
        (Some("dead-lettered"), Some(1), Some("malformed")),
        "{finished}"
    );
    assert_eq!(
        (outcome["dead_letter_queue"].as_str(), outcome["dead_letter_seq"].as_u64()),
        (Some("jobs.dlq"), Some(1))
    );
    assert!(outcome["finished_at_micros"].as_u64().unwrap() > 0 && outcome["result"].is_null(), "{finished}");
    let table = text(&db, &["job", "jobs", "workers", &seq]);
    assert!(table.contains("leased") && table.contains("cli-test") && table.contains("lease "), "{table}");
    assert!(table.contains("PRIORITY"), "{table}");
    assert!(table.contains("row 40 of 90"), "{table}");
    let table = text(&db, &["job", "jobs", "workers", "1"]);
    assert!(
        table.contains("dead-lettered (attempt 1)") && table.contains("jobs.dlq#1: malformed"),
        "{table}"
    );

    let letters = json(&db, &["dlq", "list", "jobs.dlq"]);
    assert_eq!(letters.as_array().unwrap().len(), 1);
    assert_eq!((letters[0]["queue"].as_str(), letters[0]["seq"].as_u64()), (Some("jobs"), Some(1)));
    assert_eq!(
        (letters[0]["reason"].as_str(), letters[0]["payload"]["text"].as_str()),
        (Some("malformed"), Some("j1"))
    );
    let peeked = text(&db, &["dlq", "peek", "jobs.dlq"]);
    assert!(peeked.contains("malformed") && peeked.contains("jobs#1"), "{peeked}");

    // Reading changed nothing the service sees.
    assert_eq!(broker.queue("orders").await.unwrap().group("billing").unwrap().committed(), Some(2));
    drop(held);
    broker.shutdown().await.unwrap();
}

fn micros(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

/// Delayed messages and recurring schedules of a running service (on a `ManualClock`, so every
/// time is known), as `scheduled`, `schedules` and `stats` show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_and_schedules_list_delayed_messages_and_recurring_schedules() {
    use rockq::{Message, Recurrence, Sent};
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let clock = rockq::ManualClock::new();
    let broker = open_clock(&db, &clock).await;
    let delayed = |s: Sent| match s {
        Sent::Scheduled(m) => m,
        other => panic!("expected a scheduled message, got {other:?}"),
    };
    let reminders = broker.queue("reminders").await.unwrap();
    let renew = Message::new("renew plan").key("cust-7").deliver_after(Duration::from_secs(3600));
    let renew = delayed(reminders.submit(renew).await.unwrap());
    let later = Message::new("later").deliver_after(Duration::from_secs(7200));
    let later = delayed(reminders.submit(later).await.unwrap());
    let other = broker.queue("other").await.unwrap();
    let soon = Message::new("x").deliver_after(Duration::from_secs(1800));
    let soon = delayed(other.submit(soon).await.unwrap());
    let sent_at = clock.wall_time();

    // An interval schedule that fired once, and a paused cron schedule.
    let mut events = broker.events();
    let first = broker.schedule("tick", Duration::from_secs(300), "ticks", "tick").await.unwrap().unwrap();
    broker.schedule("nightly", Recurrence::cron("0 0 2 * * *").unwrap(), "reports", "build").await.unwrap();
    broker.pause_schedule("nightly").await.unwrap();
    clock.advance(Duration::from_secs(300));
    wait_event(&mut events, |e| matches!(e, rockq::Event::ScheduleFired { seq: Some(1), .. })).await;
    assert_eq!(broker.schedules().await.unwrap().iter().map(|s| s.fired).sum::<u64>(), 1);

    // Every queue's delayed messages, in id order.
    let all = json(&db, &["scheduled"]);
    let all = all.as_array().unwrap();
    let ids: Vec<u64> = all.iter().map(|m| m["id"].as_u64().unwrap()).collect();
    let mut want = vec![renew.id, later.id, soon.id];
    want.sort_unstable();
    assert_eq!(ids, want, "{all:?}");
    let m = all.iter().find(|m| m["id"].as_u64() == Some(renew.id)).unwrap();
    assert_eq!((m["queue"].as_str(), m["key"].as_str()), (Some("reminders"), Some("cust-7")));
    assert_eq!(m["payload_bytes"].as_u64(), Some(10));
    assert_eq!(m["due_micros"].as_u64(), Some(micros(renew.due)));
    assert_eq!(m["sent_at_micros"].as_u64(), Some(micros(sent_at)));
    assert_eq!(micros(renew.due) - micros(sent_at), 3_600_000_000);
    let m = all.iter().find(|m| m["id"].as_u64() == Some(later.id)).unwrap();
    assert!(m["key"].is_null(), "{m}");

    // One queue, and --limit.
    let only = json(&db, &["scheduled", "reminders"]);
    let only: Vec<u64> = only.as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(only, vec![renew.id, later.id]);
    assert_eq!(json(&db, &["scheduled", "reminders", "--limit", "1"]).as_array().unwrap().len(), 1);
    let table = text(&db, &["scheduled", "reminders"]);
    assert!(table.starts_with("ID") && table.contains("DUE") && table.contains("KEY"), "{table}");
    let row =
        table.lines().find(|l| l.starts_with(&renew.id.to_string())).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("reminders") && row.contains("cust-7") && row.contains(" 10 "), "{row}");
    assert!(!table.contains("other"), "{table}");

    // Recurring schedules, by name.
    let list = json(&db, &["schedules"]);
    let list = list.as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["nightly", "tick"]);
    let (nightly, tick) = (&list[0], &list[1]);
    assert_eq!(
        (nightly["queue"].as_str(), nightly["recurrence"].as_str(), nightly["paused"].as_bool()),
        (Some("reports"), Some("cron 0 0 2 * * *"), Some(true))
    );
    assert!(nightly["next_micros"].is_null() && nightly["last_seq"].is_null(), "{nightly}");
    assert_eq!(nightly["fired"].as_u64(), Some(0));
    assert_eq!(
        (tick["queue"].as_str(), tick["recurrence"].as_str(), tick["paused"].as_bool()),
        (Some("ticks"), Some("every 300s"), Some(false))
    );
    assert_eq!((tick["fired"].as_u64(), tick["missed_firings"].as_u64()), (Some(1), Some(0)));
    assert_eq!((tick["last_micros"].as_u64(), tick["last_seq"].as_u64()), (Some(micros(first)), Some(1)));
    assert_eq!(tick["next_micros"].as_u64(), Some(micros(first + Duration::from_secs(300))));
    assert_eq!(tick["on_missed"], "catch-up-once");
    let table = text(&db, &["schedules"]);
    let row = table.lines().find(|l| l.starts_with("tick")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("ticks") && row.contains("every 300s") && row.contains("(#1)"), "{row}");
    let row = table.lines().find(|l| l.starts_with("nightly")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("paused") && row.contains("cron 0 0 2 * * *"), "{row}");

    // Stats count them per queue, with the next due time.
    let stats = json(&db, &["stats"]);
    let queue =
        |name: &str| stats["queues"].as_array().unwrap().iter().find(|q| q["name"] == name).unwrap().clone();
    let r = queue("reminders");
    assert_eq!((r["scheduled"].as_u64(), r["next_due_micros"].as_u64()), (Some(2), Some(micros(renew.due))));
    assert_eq!(queue("other")["scheduled"].as_u64(), Some(1));
    assert!(queue("ticks")["next_due_micros"].is_null());
    let table = text(&db, &["stats"]);
    assert!(table.contains("SCHEDULED") && table.contains("NEXT DUE"), "{table}");

    // An unknown queue is an error, not an empty list.
    let out = rockq(&db).args(["scheduled", "missing"]).assert().code(1).get_output().clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"queue "missing" does not exist"#), "{err}");
    assert!(out.stdout.is_empty());

    // Nothing changed: the service still holds all three.
    assert_eq!(broker.delayed(None, 10).await.unwrap().len(), 3);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_write_refuse_a_locked_database_and_change_nothing() {
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let broker = open(&db).await;
    let (_js, held) = populate(&broker).await;
    for args in [
        &["group", "pause", "orders", "billing"][..],
        &["group", "reset", "orders", "billing", "--earliest"],
        &["dlq", "redrive", "jobs.dlq"],
        &["trim"],
    ] {
        let out = rockq(&db).args(args).assert().code(3).get_output().clone();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("locked by another process") && err.contains("Read-only commands"),
            "{args:?}: {err}"
        );
    }
    let orders = broker.queue("orders").await.unwrap();
    assert!(!orders.group("billing").unwrap().is_paused());
    assert_eq!(orders.group("billing").unwrap().committed(), Some(2));
    assert_eq!(broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap(), 1);
    drop(held);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_reset_redrive_and_trim_when_the_database_is_free() {
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let broker = open(&db).await;
    let (js, held) = populate(&broker).await;
    drop(held);
    drop(js);
    broker.shutdown().await.unwrap();

    assert_eq!(json(&db, &["group", "pause", "orders", "billing"])["paused"], true);
    let stats = json(&db, &["stats"]);
    let billing =
        stats["groups"].as_array().unwrap().iter().find(|g| g["group"] == "billing").unwrap().clone();
    assert_eq!(billing["paused"], true);
    assert!(text(&db, &["groups"]).contains("paused"));
    assert_eq!(json(&db, &["group", "resume", "orders", "billing"])["paused"], false);

    assert_eq!(
        json(&db, &["group", "reset", "orders", "billing", "--to-seq", "4"])["next_seq"].as_u64(),
        Some(4)
    );
    assert_eq!(
        json(&db, &["group", "reset", "orders", "billing", "--earliest"])["next_seq"].as_u64(),
        Some(1)
    );
    assert_eq!(json(&db, &["dlq", "redrive", "jobs.dlq"])["moved"].as_u64(), Some(1));
    let trimmed = json(&db, &["trim"]);
    assert!(trimmed["bytes_after"].as_u64().is_some(), "{trimmed}");

    // The library sees what the CLI did.
    let broker = open(&db).await;
    let orders = broker.queue("orders").await.unwrap();
    assert!(!orders.group("billing").unwrap().is_paused());
    assert_eq!(orders.group("billing").unwrap().committed(), Some(0));
    let jobs = broker.queue("jobs").await.unwrap();
    assert_eq!(jobs.last_seq(), 4, "the dead letter came back as jobs#4");
    assert!(broker.dead_letters("jobs.dlq").await.unwrap().is_empty().await.unwrap());
    broker.shutdown().await.unwrap();
}

#[test]
fn bad_input_gets_a_clear_error_and_an_exit_code() {
    let dir = tempdir();
    let missing = dir.path().join("nope");
    let out = rockq(&missing).arg("stats").assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no database"), "{out:?}");
    // Writing commands never create a database either.
    rockq(&missing).args(["group", "pause", "q", "g"]).assert().code(1);
    assert!(!missing.exists());

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let broker = open(dir.path()).await;
        broker.queue("orders").await.unwrap();
        broker.shutdown().await.unwrap();
    });
    let err = |args: &[&str]| {
        let out = rockq(dir.path()).args(args).assert().code(1).get_output().clone();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["peek", "missing"]).contains("does not exist"));
    assert!(err(&["pending", "orders", "g"]).contains("does not exist"));
    assert!(err(&["job", "orders", "g", "1"]).contains("does not exist"));
    assert!(err(&["peek", "bad:name"]).contains("allowed are"));
    assert!(err(&["group", "pause", "orders", "g"]).contains("does not exist"));
    for args in [&["group", "reset", "other", "g", "--earliest"][..], &["dlq", "redrive", "other.dlq"]] {
        assert!(err(args).contains("does not exist"), "{args:?}");
    }
    let queues = json(dir.path(), &["stats"])["queues"].as_array().unwrap().len();
    assert_eq!(queues, 1, "a failed command created a queue");
    // Usage errors are clap's: exit code 2.
    rockq(dir.path()).args(["group", "reset", "orders", "g"]).assert().code(2);
    rockq(dir.path()).args(["frobnicate"]).assert().code(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_queue_purge_and_delete_group_need_yes_and_an_exclusive_open() {
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let broker = open(&db).await;
    let (_js, held) = populate(&broker).await;
    // Held by this process: refused with the lock's exit code, nothing changed.
    for args in [
        &["delete-queue", "orders", "--yes"][..],
        &["purge", "orders", "--yes"],
        &["delete-group", "orders", "billing", "--yes"],
    ] {
        rockq(&db).args(args).assert().code(3);
    }
    assert_eq!(broker.get_queue("orders").unwrap().len(), 5);
    drop(held);
    drop(_js);
    broker.shutdown().await.unwrap();

    // Without --yes and without a terminal: refused before anything is opened.
    for args in
        [&["delete-queue", "orders"][..], &["purge", "orders"], &["delete-group", "orders", "billing"]]
    {
        let out = rockq(&db).args(args).write_stdin("y\n").assert().code(2).get_output().clone();
        assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"), "{args:?}");
    }
    // Missing queue or group: an error, nothing created.
    rockq(&db).args(["purge", "missing", "--yes"]).assert().code(1);
    rockq(&db).args(["delete-queue", "missing", "--yes"]).assert().code(1);
    rockq(&db).args(["delete-group", "orders", "missing", "--yes"]).assert().code(1);
    rockq(&db).args(["delete-group", "bad name", "g", "--yes"]).assert().code(1);

    assert_eq!(json(&db, &["delete-group", "orders", "billing", "--yes"])["deleted"], true);
    assert_eq!(json(&db, &["purge", "orders", "--yes"])["purged"].as_u64(), Some(5));
    assert_eq!(json(&db, &["delete-queue", "jobs", "--yes"])["deleted"], true);

    let broker = open(&db).await;
    assert!(broker.get_queue("missing").is_none());
    assert!(broker.get_queue("jobs").is_none());
    let orders = broker.get_queue("orders").unwrap();
    assert_eq!((orders.len(), orders.first_seq()), (0, 6));
    let stats = broker.stats().await.unwrap();
    assert!(stats.groups.iter().all(|g| g.group != "billing" && g.queue != "jobs"), "{:?}", stats.groups);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_and_restore_copy_a_database_and_refuse_what_they_would_overwrite() {
    let (dir, out) = (tempdir(), tempdir());
    let db = dir.path().to_path_buf();
    let backup = out.path().join("backup");
    let broker = open(&db).await;
    let (js, held) = populate(&broker).await;
    // The service holds the database: it backs itself up with `Broker::backup`.
    let failed = rockq(&db).arg("backup").arg(&backup).assert().code(3).get_output().clone();
    assert!(String::from_utf8_lossy(&failed.stderr).contains("locked by another process"));
    assert!(!backup.exists());
    drop((js, held));
    broker.shutdown().await.unwrap();

    let written = json(&db, &["backup", backup.to_str().unwrap()]);
    assert_eq!(written["backup"], backup.display().to_string());
    assert!(written["files"].as_u64().unwrap() > 0);
    let orders = serde_json::json!({ "queue": "orders", "first_seq": 1, "last_seq": 5 });
    assert!(written["queues"].as_array().unwrap().contains(&orders), "{written}");
    // Again into the same directory: refused.
    let again = rockq(&db).arg("backup").arg(&backup).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    let restored = out.path().join("restored");
    let report = text(&restored, &["restore", backup.to_str().unwrap()]);
    assert!(report.contains("orders: 1..=5"), "{report}");
    let groups = |db: &Path| {
        let g = json(db, &["groups"]);
        g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["group"].clone(), g["committed"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(groups(&restored), groups(&db));
    assert_eq!(json(&restored, &["peek", "orders"]), json(&db, &["peek", "orders"]));
    let refused = rockq(&restored).arg("restore").arg(&backup).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already exists"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_move_a_database_through_a_file_or_a_pipe() {
    let (dir, out) = (tempdir(), tempdir());
    let db = dir.path().to_path_buf();
    let file = out.path().join("db.jsonl");
    let broker = open(&db).await;
    let (js, held) = populate(&broker).await;
    // The service holds the database: it exports itself with `Broker::export`.
    let failed = rockq(&db).arg("export").arg(&file).assert().code(3).get_output().clone();
    assert!(String::from_utf8_lossy(&failed.stderr).contains("locked by another process"));
    assert!(!file.exists());
    drop((js, held));
    broker.shutdown().await.unwrap();

    let written = json(&db, &["export", file.to_str().unwrap()]);
    assert_eq!(written["export"], file.display().to_string());
    assert_eq!((written["queues"].as_u64(), written["messages"].as_u64()), (Some(3), Some(9)), "{written}");
    assert_eq!(written["entries"].as_u64(), Some(2));
    assert_eq!(written["bytes"].as_u64(), Some(std::fs::metadata(&file).unwrap().len()));
    // An export never overwrites a file.
    let again = rockq(&db).arg("export").arg(&file).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"), "{again:?}");

    let imported = out.path().join("imported");
    let report = text(&imported, &["import", file.to_str().unwrap()]);
    assert!(report.contains("3 queues, 9 messages"), "{report}");
    let groups = |db: &Path| {
        let g = json(db, &["groups"]);
        g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["group"].clone(), g["committed"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(groups(&imported), groups(&db));
    assert_eq!(json(&imported, &["peek", "orders"]), json(&db, &["peek", "orders"]));
    assert_eq!(json(&imported, &["pending", "jobs", "workers"]), json(&db, &["pending", "jobs", "workers"]));
    let refused = rockq(&imported).arg("import").arg(&file).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already exists"));

    // `-`: standard output into standard input, as in `rockq export - | ssh host rockq import -`.
    let piped = rockq(&db).arg("export").arg("-").assert().success().get_output().stdout.clone();
    // The same lines as the file but the header (its time).
    let file_text = std::fs::read_to_string(&file).unwrap();
    let piped_text = String::from_utf8(piped.clone()).unwrap();
    assert_eq!(piped_text.lines().skip(1).collect::<Vec<_>>(), file_text.lines().skip(1).collect::<Vec<_>>());
    let from_pipe = out.path().join("from-pipe");
    rockq(&from_pipe).arg("import").arg("-").write_stdin(piped).assert().success();
    assert_eq!(json(&from_pipe, &["peek", "orders"]), json(&db, &["peek", "orders"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_lists_flows_and_shows_each_step() {
    let dir = tempdir();
    let db = dir.path().to_path_buf();
    let broker = open(&db).await;
    assert!(text(&db, &["flow"]).contains("no flows"));
    let id = flow_in_progress(&broker).await;
    let expected = broker.flow_status(id).await.unwrap();
    assert_eq!(expected.state, rockq::FlowState::Running, "the report is queued");

    // The list, read while the service holds the database.
    let list = json(&db, &["flow"]);
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0]["id"].as_u64(), rows[0]["state"].as_str()), (Some(id), Some("running")));
    let tally = &rows[0]["tally"];
    assert_eq!(
        [&tally["succeeded"], &tally["failed"], &tally["blocked"], &tally["queued"], &tally["total"]]
            .map(|v| v.as_u64().unwrap()),
        [2, 1, 1, 1, 5]
    );
    assert!(json(&db, &["flow", "--from", &(id + 1).to_string()]).as_array().unwrap().is_empty());
    let table = text(&db, &["flow"]);
    assert!(
        table.contains("running") && table.contains("blocked 1, queued 1, succeeded 2, failed 1"),
        "{table}"
    );

    // One flow: every step as Broker::flow_status has it.
    let one = json(&db, &["flow", &id.to_string()]);
    let steps = one["steps"].as_array().unwrap();
    assert_eq!(steps.len(), expected.steps.len());
    for (row, s) in steps.iter().zip(&expected.steps) {
        assert_eq!(row["step"].as_u64(), Some(u64::from(s.step)));
        assert_eq!((row["queue"].as_str(), row["group"].as_str()), (Some(&*s.queue), Some(&*s.group)));
        assert_eq!(row["state"].as_str(), Some(s.state.as_str()));
        let after: Vec<u32> =
            row["after"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(after, s.after);
    }
    assert_eq!(steps[0]["result"]["text"], "small-a.jpg");
    assert_eq!(steps[2]["failure"]["kind"], "dead-lettered");
    assert_eq!(steps[2]["failure"]["reason"], FLOW_FAILURE);
    assert_eq!(
        (steps[3]["when"].as_str(), steps[3]["state"].as_str()),
        (Some("all_succeeded"), Some("blocked"))
    );
    assert_eq!(steps[3]["dependencies"]["failed"], 1);
    assert_eq!(
        (steps[4]["when"].as_str(), steps[4]["state"].as_str()),
        (Some("all_finished"), Some("queued"))
    );
    assert!(steps[4]["seq"].as_u64().is_some());
    let shown = text(&db, &["flow", &id.to_string()]);
    assert!(shown.contains(&format!("flow {id} running")), "{shown}");
    assert!(shown.contains("all succeeded of 0-2") && shown.contains("result small-b.jpg"), "{shown}");
    assert!(shown.contains("dead-lettered to images.dlq"), "{shown}");
    let cut = text(&db, &["flow", &id.to_string(), "--limit", "2"]);
    assert!(cut.contains("3 more steps"), "{cut}");

    // An unknown flow is an error with exit code 1; --from with an id is a usage error.
    let out = rockq(&db).args(["flow", "99"]).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&out.stderr).contains("99"), "{out:?}");
    rockq(&db).args(["flow", "1", "--from", "3"]).assert().code(2);
    broker.shutdown().await.unwrap();
}
