//! Bad input gets a typed error and changes nothing.

mod common;

use common::*;
use rockq::{Broker, Error, NameError, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_are_rejected_and_nothing_is_created() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let long = "x".repeat(rockq::MAX_NAME_LEN + 1);
    for bad in ["", "a:b", "has space", "ünï", long.as_str(), "a/b", ".", "..", "..."] {
        let err = broker.queue(bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
    }
    let q = broker.queue("ok").await.unwrap();
    for bad in ["", "g:x", "tab\t", long.as_str()] {
        assert!(q.group(bad).is_err(), "{bad:?}");
    }
    assert!(matches!(q.group(""), Err(NameError::Empty { .. })));
    // Dots only: path segments a URL cannot carry (the console could never reach them).
    assert!(matches!(q.group(".."), Err(NameError::OnlyDots { .. })));
    assert!(matches!(broker.kv(".").await, Err(Error::InvalidName(NameError::OnlyDots { .. }))));
    assert!(
        broker.queue(".v2").await.is_ok() && broker.queue("a..b").await.is_ok(),
        "dots among others are fine"
    );
    let names = || vec![".v2".to_string(), "a..b".to_string(), "ok".to_string()];
    assert_eq!(broker.queue_names(), names());
    broker.shutdown().await.unwrap();
    let broker = open(dir.path()).await;
    assert_eq!(broker.queue_names(), names(), "nothing else was persisted");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_and_bad_batches_write_nothing() {
    let dir = tempdir();
    let broker = Options::new().max_message_bytes(100).max_batch_messages(10).open(dir.path()).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    q.send(vec![0u8; 100]).await.unwrap();
    let err = q.send(vec![0u8; 101]).await.unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { index: 0, size: 101, max: 100 }), "{err:?}");
    // `enqueue` validates before queueing, like `send`.
    let err = q.enqueue(vec![0u8; 101]).await.unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { index: 0, size: 101, max: 100 }), "{err:?}");
    // Headers count toward the limit.
    let err = q.send(rockq::Message::new(vec![0u8; 90]).header("k", vec![0u8; 20])).await.unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { .. }), "{err:?}");
    // One bad message rejects the whole batch.
    let err = q.send_batch([vec![1u8], vec![0u8; 500], vec![2u8]]).await.unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { index: 1, .. }), "{err:?}");
    let err = q.send_batch((0..11).map(|i| vec![i as u8])).await.unwrap_err();
    assert!(matches!(err, Error::BatchTooLarge { max: 10, .. }), "{err:?}");
    let err = q.send_batch(Vec::<Vec<u8>>::new()).await.unwrap_err();
    assert!(matches!(err, Error::EmptyBatch), "{err:?}");
    assert_eq!(q.last_seq(), 1);
    assert_eq!(q.send("after").await.unwrap(), 2, "no sequence was consumed by the rejects");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unencodable_headers_are_rejected() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let err = q.send(rockq::Message::new("x").header("k".repeat(70_000), "v")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidHeader { index: 0, .. }), "{err:?}");
    let many = (0..70_000).fold(rockq::Message::new("x"), |m, _| m.header("", ""));
    let err = q.send_batch([rockq::Message::new("ok"), many]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidHeader { index: 1, .. }), "{err:?}");
    assert_eq!(q.last_seq(), 0);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_after_shutdown_is_a_typed_error() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2"]).await.unwrap();
    let group = q.group("g").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let d = next(&mut sub).await;
    broker.shutdown().await.unwrap();
    broker.shutdown().await.unwrap(); // idempotent

    assert!(broker.is_shut_down());
    assert!(matches!(q.send("x").await, Err(Error::Shutdown)));
    assert!(matches!(q.send_batch(["x"]).await, Err(Error::Shutdown)));
    assert!(matches!(q.enqueue("x").await, Err(Error::Shutdown)));
    assert!(matches!(broker.queue("q").await, Err(Error::Shutdown)));
    assert!(matches!(broker.queue("new").await, Err(Error::Shutdown)));
    assert!(matches!(group.subscribe().await, Err(Error::Shutdown)));
    assert!(matches!(d.ack(), Err(rockq::Error::Shutdown)));
    assert!(matches!(sub.commit().await, Err(rockq::Error::Shutdown)));
    assert!(futures::StreamExt::next(&mut sub).await.is_none(), "the stream ends at shutdown");

    // The database is closed: it can be opened again at once, and holds nothing new.
    let broker = open(dir.path()).await;
    assert_eq!(broker.queue("q").await.unwrap().last_seq(), 2);
    assert_eq!(broker.queue_names(), vec!["q".to_string()]);
    broker.shutdown().await.unwrap();
}

/// Regression: a process killed while RocksDB was creating the database (after `LOCK`,
/// `IDENTITY` and the first manifest, before `CURRENT`) left a directory every later open
/// refused as "not a RocksDB database" — found by the kill -9 pipeline test
/// (`tests/crash_exactly_once.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_killed_before_current_was_written_is_created_again() {
    let dir = tempdir();
    for f in ["LOCK", "LOG", "IDENTITY", "MANIFEST-000001", "OPTIONS-000006.dbtmp"] {
        std::fs::write(dir.path().join(f), b"").unwrap();
    }
    // Read-only, it is not there yet; writable, it is created.
    assert!(matches!(rockq::Inspector::open(dir.path()).await, Err(Error::NoDatabase { .. })));
    let broker = Broker::open(dir.path()).await.unwrap();
    broker.queue("q").await.unwrap().send("x").await.unwrap();
    broker.shutdown().await.unwrap();
    let broker = Broker::open(dir.path()).await.unwrap();
    assert_eq!(broker.get_queue("q").unwrap().len(), 1);
    broker.shutdown().await.unwrap();

    // One file of anyone else's and it is not ours.
    let mixed = tempdir();
    std::fs::write(mixed.path().join("LOCK"), b"").unwrap();
    std::fs::write(mixed.path().join("notes.txt"), b"mine").unwrap();
    let err = Broker::open(mixed.path()).await.unwrap_err();
    assert!(matches!(err, Error::NotRockq { .. }), "{err:?}");
    assert_eq!(std::fs::read_dir(mixed.path()).unwrap().count(), 2, "nothing was created");
}

/// Regression: a process killed after RocksDB wrote `CURRENT` but before it created rockq's
/// column families (it creates them one manifest write at a time, after the database) left a
/// RocksDB database with only `default`, which every later open refused as a foreign one —
/// found by the kill -9 pipeline test. rockq marks a creation in progress first, and completes
/// a marked one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_killed_before_its_column_families_existed_is_completed() {
    let dir = tempdir();
    // What such a kill leaves: the marker, then a database with the default column family only.
    std::fs::write(dir.path().join("ROCKQ-CREATING"), b"").unwrap();
    {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        drop(rocksdb::DB::open(&o, dir.path()).unwrap());
    }
    let broker = Broker::open(dir.path()).await.unwrap();
    broker.queue("q").await.unwrap().send("x").await.unwrap();
    broker.shutdown().await.unwrap();
    assert!(!dir.path().join("ROCKQ-CREATING").exists(), "the marker goes once the database is whole");
    let broker = Broker::open(dir.path()).await.unwrap();
    assert_eq!(broker.get_queue("q").unwrap().len(), 1);
    broker.shutdown().await.unwrap();
    // A creation that was not interrupted leaves no marker.
    let fresh = tempdir();
    Broker::open(fresh.path()).await.unwrap().shutdown().await.unwrap();
    assert!(!fresh.path().join("ROCKQ-CREATING").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_are_not_rockq_databases_are_refused_untouched() {
    let dir = tempdir();

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"hello").unwrap();
    let err = Broker::open(&file).await.unwrap_err();
    assert!(matches!(err, Error::NotRockq { .. }), "{err:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");

    let foreign = dir.path().join("photos");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("cat.jpg"), b"meow").unwrap();
    let err = Broker::open(&foreign).await.unwrap_err();
    assert!(matches!(err, Error::NotRockq { .. }), "{err:?}");
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 1, "nothing was created");

    // A RocksDB database that rockq did not create.
    let raw = dir.path().join("raw");
    {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        let db = rocksdb::DB::open(&o, &raw).unwrap();
        db.put(b"k", b"v").unwrap();
    }
    let err = Broker::open(&raw).await.unwrap_err();
    assert!(matches!(err, Error::NotRockq { .. }), "{err:?}");
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), &raw).unwrap();
    assert_eq!(cfs, vec!["default".to_string()], "no column family was added");

    let missing = dir.path().join("missing");
    let err = Options::new().create_if_missing(false).open(&missing).await.unwrap_err();
    assert!(matches!(err, Error::NoDatabase { .. }), "{err:?}");
    assert!(!missing.exists());

    let err = Options::new().max_message_bytes(0).open(dir.path().join("x")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_registry_record_fails_open_with_a_clear_error() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    broker.queue("q").await.unwrap();
    broker.shutdown().await.unwrap();
    {
        let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), &cfs).unwrap();
        let meta = db.cf_handle("rockq.meta").unwrap();
        db.put_cf(meta, b"queue:q", b"garbage").unwrap();
    }
    let err = Broker::open(dir.path()).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt(ref c) if c.record_kind() == "queue"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_message_ends_the_stream_with_an_error_instead_of_skipping_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    broker.queue("q").await.unwrap().send_batch(["1", "2", "3"]).await.unwrap();
    broker.shutdown().await.unwrap();
    corrupt_message(dir.path(), 1, 2, &[42, 0]);
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().read_batch(1).subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    let item = futures::StreamExt::next(&mut sub).await.expect("an error item");
    let err = item.unwrap_err();
    assert!(matches!(err, rockq::Error::Corrupt(_)), "{err:?}");
    assert!(futures::StreamExt::next(&mut sub).await.is_none());
    assert_eq!(sub.commit().await.unwrap(), 1, "the offset stops before the bad record");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_open_in_this_process_is_locked() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let err = Broker::open(dir.path()).await.unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    broker.shutdown().await.unwrap();
    Broker::open(dir.path()).await.unwrap().shutdown().await.unwrap();
}

/// Child side of `a_database_held_by_another_process_is_locked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_hold_database_open() {
    let Ok(path) = std::env::var("ROCKQ_HOLD_PATH") else { return };
    let broker = open(std::path::Path::new(&path)).await;
    // libtest prints "test <name> ... " without a newline first: use a marker.
    println!("ROCKQ-READY");
    // Hold the lock until the parent closes our stdin.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_held_by_another_process_is_locked() {
    use std::io::BufRead;
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    let mut child = spawn_helper("helper_hold_database_open", &[("ROCKQ_HOLD_PATH", &path)]);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ROCKQ-READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "helper exited before opening");
    }
    let err = Broker::open(dir.path()).await.unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    Broker::open(dir.path()).await.unwrap().shutdown().await.unwrap();
}

// A group whose dead-letter queue was its own queue appended every dead letter where the group
// reads, so a poison message came back, failed and was appended again, for ever. Refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_cannot_dead_letter_into_its_own_queue() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let err = q.work_group("w").unwrap().dead_letter_queue("jobs").subscribe().await.unwrap_err();
    assert!(matches!(&err, Error::InvalidOption(m) if m.contains("own queue")), "{err:?}");
    let err =
        q.group("o").unwrap().max_deliveries(2).dead_letter_queue("jobs").subscribe().await.unwrap_err();
    assert!(matches!(&err, Error::InvalidOption(m) if m.contains("own queue")), "{err:?}");
    // Nothing was created.
    assert!(broker.stats().await.unwrap().groups.is_empty());
    // Another queue is fine.
    q.work_group("w").unwrap().dead_letter_queue("jobs.graveyard").subscribe().await.unwrap();
    broker.shutdown().await.unwrap();
}
