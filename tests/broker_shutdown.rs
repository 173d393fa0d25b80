//! Shutdown: stops intake, flushes pending writes and commits, ends streams, closes RocksDB.

mod common;

use common::*;
use futures::StreamExt;
use rockq::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_send_that_resolved_before_shutdown_is_durable_and_the_rest_were_refused() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..4 {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = Vec::new();
            for i in 0..200 {
                match q.send(format!("{t}-{i}")).await {
                    Ok(seq) => ok.push(seq),
                    Err(rockq::Error::Shutdown) => break,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            ok
        }));
    }
    tokio::task::yield_now().await;
    broker.shutdown().await.unwrap();
    let mut ok: Vec<u64> = Vec::new();
    for t in tasks {
        ok.extend(t.await.unwrap());
    }
    ok.sort_unstable();

    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    // Exactly the resolved sends are stored: dense from 1, nothing refused slipped in.
    assert_eq!(ok, (1..=q.last_seq()).collect::<Vec<_>>());
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_commits_pending_acks_and_ends_waiting_streams() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    take(&mut sub, 3).await.into_iter().for_each(|d| d.ack().unwrap());
    // A consumer parked waiting for new messages must be released by shutdown.
    let waiter = tokio::spawn(async move { sub.next().await.is_none() });
    tokio::task::yield_now().await;
    broker.shutdown().await.unwrap();
    assert!(waiter.await.unwrap(), "stream ended with None");

    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.group("g").unwrap().committed(), Some(3));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_without_shutdown_still_commits_and_closes() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch(["1", "2"]).await.unwrap();
        let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
        next(&mut sub).await.ack().unwrap();
    }
    // The writer finishes on its own thread; wait until RocksDB's lock is released.
    let broker = {
        let mut tries = 0;
        loop {
            match rockq::Broker::open(dir.path()).await {
                Ok(b) => break b,
                Err(rockq::Error::Locked { .. }) if tries < 1000 => {
                    tries += 1;
                    tokio::task::yield_now().await;
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.group("g").unwrap().committed(), Some(1));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_stream_stopped_on_a_full_window() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let mut sub = q.group("g").unwrap().max_in_flight(1).subscribe().await.unwrap();
    let held = next(&mut sub).await;
    let waiter = tokio::spawn(async move { sub.next().await.is_none() });
    tokio::task::yield_now().await;
    broker.shutdown().await.unwrap();
    assert!(waiter.await.unwrap(), "stream ended with None");
    assert!(matches!(held.ack(), Err(rockq::Error::Shutdown)));
}

// Issue 13 (one shutdown for every caller): a second concurrent `shutdown()` returned `Ok` before the database was closed.
/// `shutdown` is cancel safe: dropped after its first poll, the shutdown it began runs on; a
/// second call waits for that same shutdown, and every send that resolved is there after a
/// reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_shutdown_still_finishes_and_a_second_call_waits_for_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let sent: Vec<u64> = q.send_batch(["a", "b", "c"]).await.unwrap().collect();
    let mut first = Box::pin(broker.shutdown());
    let _ = futures::poll!(&mut first);
    drop(first);
    broker.shutdown().await.expect("the second call waits for the first's shutdown");
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, sent.len()).await;
    assert_eq!(ds.iter().map(|d| d.seq()).collect::<Vec<_>>(), sent);
    assert_eq!(payloads(&ds), ["a", "b", "c"]);
    drop(ds);
    broker.shutdown().await.unwrap();
}

/// `open` is cancel safe: dropped while RocksDB opens on its blocking thread, that open
/// finishes and closes the database again, so a retry gets in (after at most a brief
/// `Locked`), and the database it created is a rockq database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_open_closes_the_database_again_and_a_retry_gets_in() {
    let dir = tempdir();
    let path = dir.path().join("db");
    let mut opening = Box::pin(Options::new().open(path.clone()));
    let _ = futures::poll!(&mut opening);
    drop(opening);
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let broker = loop {
        match Options::new().open(&path).await {
            Ok(b) => break b,
            Err(rockq::Error::Locked { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the dropped open left the database unusable: {e:?}"),
        }
    };
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.send("x").await.unwrap(), 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_concurrent_shutdown_returns_only_once_the_database_is_closed() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    broker.queue("q").await.unwrap().send("a").await.unwrap();
    let mut first = Box::pin(broker.shutdown());
    // Start the first shutdown: it gets as far as waiting for the writer.
    let _ = futures::poll!(&mut first);
    broker.shutdown().await.unwrap();
    // Returned: the database must be closed, so it can be opened again at once.
    let reopened = Options::new().open(dir.path()).await;
    assert!(reopened.is_ok(), "the database was still open: {:?}", reopened.err());
    first.await.unwrap();
    reopened.unwrap().shutdown().await.unwrap();
}
