//! Deleting and purging queues and groups, and `Broker::get_queue`: every change is atomic,
//! nothing of a deleted queue or group is left on disk, live consumers end with a typed error,
//! and a purge under a running producer loses nothing sent after it and delivers nothing sent
//! before it.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Durability, Error, Message, StartFrom, Task};

/// Every key of every column family, by column family name (the broker must be shut down).
fn raw_keys(path: &Path) -> Vec<(String, Vec<u8>)> {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), path, &cfs, false).unwrap();
    let mut out = Vec::new();
    for name in cfs {
        let cf = db.cf_handle(&name).unwrap();
        for item in db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
            let (k, _) = item.unwrap();
            out.push((name.clone(), k.to_vec()));
        }
    }
    out
}

/// The id of queue `name` as its record stores it (after the version byte).
fn queue_id(path: &Path, name: &str) -> Option<u32> {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), path, &cfs, false).unwrap();
    let meta = db.cf_handle("rockq.meta").unwrap();
    let v = db.get_cf(meta, format!("queue:{name}")).unwrap()?;
    Some(u32::from_be_bytes(v[1..5].try_into().unwrap()))
}

/// The keys that belong to queue `name` with id `id`, whatever their column family.
fn keys_of(path: &Path, name: &str, id: u32) -> Vec<(String, Vec<u8>)> {
    let id_be = id.to_be_bytes();
    let suffix = format!(":{name}");
    let mid = format!(":{name}:");
    raw_keys(path)
        .into_iter()
        .filter(|(cf, k)| {
            let text = String::from_utf8_lossy(k);
            match cf.as_str() {
                "rockq.messages" => k.starts_with(&id_be),
                "rockq.meta" => {
                    text == format!("queue:{name}")
                        || text == format!("redrive:{name}")
                        || (text.starts_with("group:") && text.ends_with(&suffix))
                }
                "rockq.offsets" => text.ends_with(&suffix),
                "rockq.claims" => text.contains(&mid),
                "rockq.scheduled" => match k.first() {
                    Some(b't') => k.get(9..13) == Some(&id_be[..]),
                    Some(b'i') => k.get(1..5) == Some(&id_be[..]),
                    _ => false,
                },
                "rockq.dedup" => match k.first() {
                    Some(b'k') => k.get(1..5) == Some(&id_be[..]),
                    Some(b'x') => k.get(9..13) == Some(&id_be[..]),
                    _ => false,
                },
                _ => false,
            }
        })
        .collect()
}

/// Waits (bounded by `HANG_GUARD`) until `done` holds, yielding to the runtime in between.
async fn until(mut done: impl FnMut() -> bool) {
    tokio::time::timeout(HANG_GUARD, async {
        while !done() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("hung waiting for a condition");
}

fn is_deleted_receive(e: &Error, queue: &str, group: &str) -> bool {
    matches!(e, Error::GroupDeleted { queue: q, group: g } if q == queue && g == group)
}

/// Fills queue `name` with every kind of record: messages, an ordered group with an offset and
/// a delivery record, a work group with a claim, a paused group's settings, a delayed message
/// and idempotency keys.
async fn populate(broker: &rockq::Broker, name: &str) {
    let q = broker.queue(name).await.unwrap();
    q.send_batch((0..10).map(|i| format!("m{i}"))).await.unwrap();
    q.submit(Message::new("later").deliver_after(Duration::from_secs(3600))).await.unwrap();
    q.submit(Message::new("once").idempotency_key("k-1")).await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    next(&mut sub).await.nack();
    sub.commit().await.unwrap();
    drop(sub);
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    job.ack_durable().await.unwrap();
    let held = next_job(&mut jobs).await;
    std::mem::forget(held); // its claim record stays
    drop(jobs);
    broker.pause_group(name, "w").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_queue_under_a_concurrent_producer_leaves_nothing_of_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    populate(&broker, "doomed").await;
    populate(&broker, "kept").await;
    broker.shutdown().await.unwrap();
    let id = queue_id(dir.path(), "doomed").unwrap();
    let kept_id = queue_id(dir.path(), "kept").unwrap();
    assert!(!keys_of(dir.path(), "doomed", id).is_empty(), "the check must see the records first");
    let kept_before = keys_of(dir.path(), "kept", kept_id);

    let broker = open(dir.path()).await;
    let q = broker.queue("doomed").await.unwrap();
    let before = q.last_seq();
    // Eight producers, half sending batches of four, so that many sends share the writer's
    // rounds with the deletion.
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut sent = Vec::new();
                loop {
                    let res = match p % 2 {
                        0 => q.send("x").await.map(|s| vec![s]),
                        _ => q.send_batch(["b"; 4]).await.map(|r| r.collect()),
                    };
                    match res {
                        Ok(seqs) => sent.extend(seqs),
                        Err(e) => return (sent, e),
                    }
                }
            })
        })
        .collect();
    // Let some sends land first. A sequence is published only once its round is durable and
    // just before its producer is answered, so at least these 40 resolve `Ok` whatever the
    // deletion does.
    until(|| broker.get_queue("doomed").is_some_and(|q| q.last_seq() >= before + 40)).await;
    assert!(broker.delete_queue("doomed").await.unwrap());
    let mut all = Vec::new();
    for producer in producers {
        let (sent, err) = tokio::time::timeout(HANG_GUARD, producer).await.unwrap().unwrap();
        assert!(matches!(&err, Error::QueueDeleted { queue } if queue == "doomed"), "{err:?}");
        assert!(sent.windows(2).all(|w| w[0] < w[1]), "each producer's sends resolved in order");
        all.extend(sent);
    }
    all.sort_unstable();
    assert!(all.len() >= 40, "the sends published before the deletion resolved: {}", all.len());
    assert!(all.windows(2).all(|w| w[0] < w[1]), "no sequence given twice");

    assert!(broker.get_queue("doomed").is_none());
    assert!(!broker.queue_names().contains(&"doomed".to_owned()));
    let stats = broker.stats().await.unwrap();
    assert!(stats.queues.iter().all(|s| s.name != "doomed"));
    assert!(stats.groups.iter().all(|g| g.queue != "doomed"));
    assert!(!broker.delete_queue("doomed").await.unwrap(), "a second delete finds nothing");
    broker.shutdown().await.unwrap();

    assert_eq!(keys_of(dir.path(), "doomed", id), vec![], "nothing of the deleted queue is left");
    assert_eq!(keys_of(dir.path(), "kept", kept_id), kept_before, "the other queue is untouched");

    // Reopened, it is still gone, and the other queue still works.
    let broker = open(dir.path()).await;
    assert!(broker.get_queue("doomed").is_none());
    let kept = broker.get_queue("kept").unwrap();
    assert_eq!(kept.len(), 11);
    assert_eq!(broker.stats().await.unwrap().groups.iter().filter(|g| g.queue == "kept").count(), 2);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_under_a_concurrent_producer_delivers_only_what_came_after_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let ordered_seen = Arc::new(Mutex::new(Vec::new()));
    let work_seen = Arc::new(Mutex::new(Vec::new()));
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let seen = ordered_seen.clone();
    let ordered = tokio::spawn(async move {
        while let Some(d) = sub.next().await {
            let d = d.unwrap();
            seen.lock().unwrap().push(d.seq());
            d.ack().unwrap();
        }
    });
    let seen = work_seen.clone();
    let work = tokio::spawn(async move {
        while let Some(j) = jobs.next().await {
            let j = j.unwrap();
            seen.lock().unwrap().push(j.seq());
            // A job of a purged message loses its lease: there is nothing left to settle.
            match j.ack_durable().await {
                Ok(()) | Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("ack: {e}"),
            }
        }
    });

    let resolved = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (r, s, pq) = (resolved.clone(), stop.clone(), q.clone());
    let producer = tokio::spawn(async move {
        while !s.load(std::sync::atomic::Ordering::Acquire) {
            let seq = pq.send("x").await.unwrap();
            r.lock().unwrap().push(seq);
        }
    });
    until(|| resolved.lock().unwrap().len() > 50).await;
    // Resolved before the purge was asked for: purged for sure. (Sends resolving while it is
    // under way may fall either side; the sequence cut says which.)
    let before: Vec<u64> = resolved.lock().unwrap().clone();
    let purged = broker.purge_queue("q").await.unwrap();
    let cut = q.first_seq() - 1;
    // The cut covers at least the 50 sends resolved before it (retention may have deleted
    // consumed ones first, so `purged` counts only what was still stored).
    assert!(cut >= 50 && purged <= cut, "cut {cut}, purged {purged}");
    assert!(before.iter().all(|&s| s <= cut), "every send resolved before the purge was purged");
    let target = before.len() + 200;
    until(|| resolved.lock().unwrap().len() > target).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    producer.await.unwrap();
    let all: Vec<u64> = resolved.lock().unwrap().clone();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "sequences keep increasing");
    let after: Vec<u64> = all.iter().copied().filter(|&s| s > cut).collect();
    assert!(!after.is_empty());
    assert_eq!(q.first_seq(), cut + 1, "nothing sent after the purge was purged");

    // Each group gets every message sent after the purge, exactly once.
    let last = *all.last().unwrap();
    until(|| ordered_seen.lock().unwrap().contains(&last) && work_seen.lock().unwrap().contains(&last)).await;
    until(|| after.iter().all(|s| work_seen.lock().unwrap().contains(s))).await;
    for (name, seen) in [("ordered", &ordered_seen), ("work", &work_seen)] {
        let seen = seen.lock().unwrap().clone();
        let unique: HashSet<u64> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "{name}: a message was delivered twice");
        for s in &after {
            assert!(unique.contains(s), "{name}: {s} sent after the purge was not delivered");
        }
    }
    // Nothing of the purged range is stored any more.
    let peek = broker.peek("q", None, 10).await.unwrap();
    assert!(peek.iter().all(|m| m.seq > cut));
    ordered.abort();
    work.abort();
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn purge_moves_idle_groups_and_outstanding_acks_are_no_ops() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((0..10).map(|i| format!("m{i}"))).await.unwrap();
    let delayed = q.submit(Message::new("later").deliver_after(Duration::from_secs(3600))).await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let out = next(&mut sub).await;
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let retried = next_job(&mut jobs).await;
    // An idle ordered group behind everything.
    q.group("idle").unwrap().subscribe().await.map(drop).unwrap();

    assert_eq!(broker.purge_queue("q").await.unwrap(), 10);
    assert_eq!((q.first_seq(), q.last_seq(), q.len()), (11, 10, 0));
    // Outstanding deliveries of purged messages: an ordered ack is a no-op, a job's lease is
    // gone (nothing is written either way).
    out.ack().unwrap();
    assert!(matches!(job.ack_durable().await, Err(Error::LeaseLost { .. })));
    assert!(matches!(retried.fail_durable("boom").await, Err(Error::LeaseLost { .. })));
    // Sequences continue; every group gets only the new message.
    let seq = q.send("new").await.unwrap();
    assert_eq!(seq, 11);
    assert_eq!(next(&mut sub).await.seq(), 11);
    assert_eq!(next_job(&mut jobs).await.seq(), 11);
    drop((sub, jobs));
    let mut idle = q.group("idle").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut idle).await.seq(), 11);
    // Nothing purged was counted as skipped, and the delayed message is still scheduled.
    assert_eq!(q.group("o").unwrap().skipped(), 0);
    assert_eq!(q.delayed(10).await.unwrap().len(), 1, "{delayed:?} is not purged");
    let stats = broker.stats().await.unwrap();
    for g in stats.groups.iter().filter(|g| g.group != "idle") {
        assert_eq!(g.committed, 10, "{} moved past the purge", g.group);
    }
    let pending = broker.pending("q", "w").await.unwrap();
    assert!(pending.iter().all(|p| p.seq > 10), "no claim is left in the purged range: {pending:?}");
    assert_eq!(broker.purge_queue("missing").await.unwrap(), 0);
    drop(idle);
    broker.shutdown().await.unwrap();

    // Restart keeps the purge and the groups' offsets.
    let broker = open(dir.path()).await;
    let q = broker.get_queue("q").unwrap();
    assert_eq!((q.first_seq(), q.last_seq()), (11, 11));
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 11);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn live_consumers_end_with_a_typed_error_when_their_queue_is_deleted() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((0..10).map(|i| format!("m{i}"))).await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let delivery = next(&mut sub).await;
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let pool = tokio::spawn(q.work_group("p").unwrap().workers(2).run(move |_t: Task| {
        let tx = started_tx.clone();
        async move {
            let _ = tx.send(());
            futures::future::pending::<()>().await;
            Ok(())
        }
    }));
    started.recv().await.unwrap();

    assert!(broker.delete_queue("q").await.unwrap());

    let e = tokio::time::timeout(HANG_GUARD, sub.next()).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "o"), "{e:?}");
    assert!(sub.next().await.is_none(), "the stream ends after the error");
    let e = tokio::time::timeout(HANG_GUARD, jobs.next()).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "w"), "{e:?}");
    assert!(jobs.next().await.is_none());
    let e = tokio::time::timeout(HANG_GUARD, pool).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "p"), "{e:?}");

    assert!(matches!(delivery.ack(), Err(Error::GroupDeleted { .. })));
    assert!(matches!(job.ack_durable().await, Err(Error::GroupDeleted { .. })));
    assert!(matches!(q.send("x").await, Err(Error::QueueDeleted { .. })));
    assert!(matches!(q.submit(Message::new("x")).await, Err(Error::QueueDeleted { .. })));
    assert!(matches!(q.group("o").unwrap().subscribe().await, Err(Error::QueueDeleted { .. })));
    assert!(matches!(q.set_dedup_window(Duration::from_secs(1)).await, Err(Error::QueueDeleted { .. })));
    assert!(!q.group("o").unwrap().delete().await.unwrap());
    // Nothing of it came back through the refused calls.
    assert!(broker.get_queue("q").is_none());
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_group_ends_only_that_group_and_a_new_subscribe_starts_fresh() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((0..5).map(|i| format!("m{i}"))).await.unwrap();
    let mut gone = q.group("gone").unwrap().subscribe().await.unwrap();
    let mut stays = q.group("stays").unwrap().subscribe().await.unwrap();
    let mut gone_jobs = q.work_group("gone-w").unwrap().subscribe().await.unwrap();
    let mut stay_jobs = q.work_group("stays-w").unwrap().subscribe().await.unwrap();
    for d in take(&mut gone, 3).await {
        d.ack().unwrap();
    }
    gone.commit().await.unwrap();
    next(&mut stays).await.ack().unwrap();
    let out = next_job(&mut gone_jobs).await;
    next_job(&mut stay_jobs).await.ack_durable().await.unwrap();
    broker.pause_group("q", "gone-w").await.unwrap();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let pool = tokio::spawn(q.work_group("gone-p").unwrap().workers(1).run(move |_t: Task| {
        let tx = started_tx.clone();
        async move {
            let _ = tx.send(());
            futures::future::pending::<()>().await;
            Ok(())
        }
    }));
    started.recv().await.unwrap();

    assert!(broker.delete_group("q", "gone").await.unwrap());
    assert!(broker.delete_group("q", "gone-p").await.unwrap());
    let e = tokio::time::timeout(HANG_GUARD, pool).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "gone-p"), "{e:?}");
    assert!(q.work_group("gone-w").unwrap().delete().await.unwrap());

    let e = tokio::time::timeout(HANG_GUARD, gone.next()).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "gone"), "{e:?}");
    let e = tokio::time::timeout(HANG_GUARD, gone_jobs.next()).await.unwrap().unwrap().unwrap_err();
    assert!(is_deleted_receive(&e, "q", "gone-w"), "{e:?}");
    assert!(matches!(out.ack_durable().await, Err(Error::GroupDeleted { .. })));
    // The rest goes on.
    assert_eq!(next(&mut stays).await.seq(), 2);
    assert_eq!(q.len(), 5);
    let groups: Vec<String> = broker
        .stats()
        .await
        .unwrap()
        .groups
        .into_iter()
        .filter(|g| g.queue == "q")
        .map(|g| g.group)
        .collect();
    assert_eq!(groups, vec!["stays".to_owned(), "stays-w".to_owned()]);
    assert!(!broker.delete_group("q", "gone").await.unwrap());
    drop((gone, gone_jobs));

    // A new subscribe creates the groups anew, from their `start_from`.
    let mut again = q.group("gone").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut again).await.seq(), 1, "its old offset is gone");
    let mut again_w =
        q.work_group("gone-w").unwrap().start_from(StartFrom::Latest).subscribe().await.unwrap();
    assert!(!q.work_group("gone-w").unwrap().is_paused(), "its settings are gone");
    let seq = q.send("new").await.unwrap();
    assert_eq!(next_job(&mut again_w).await.seq(), seq);
    drop((again, again_w, stays, stay_jobs));
    broker.shutdown().await.unwrap();
}

async fn delete_and_recreate_survives_restart(mode: Durability) {
    let dir = tempdir();
    let broker = open_with(dir.path(), mode).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    sub.commit().await.unwrap();
    drop(sub);
    broker.queue("later").await.unwrap();
    broker.shutdown().await.unwrap();
    let old_id = queue_id(dir.path(), "q").unwrap();
    let later_id = queue_id(dir.path(), "later").unwrap();

    let broker = open_with(dir.path(), mode).await;
    // The highest id goes: a restart must not hand it out again.
    assert!(broker.delete_queue("later").await.unwrap());
    assert!(broker.delete_queue("q").await.unwrap());
    let q = broker.queue("q").await.unwrap();
    assert_eq!((q.len(), q.first_seq()), (0, 1), "a recreated queue is empty");
    q.send("fresh").await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"fresh");
    d.ack().unwrap();
    drop(sub);
    broker.shutdown().await.unwrap();
    let new_id = queue_id(dir.path(), "q").unwrap();
    assert!(new_id != old_id && new_id != later_id, "ids are never reused");
    assert_eq!(keys_of(dir.path(), "later", later_id), vec![]);

    let broker = open_with(dir.path(), mode).await;
    assert!(broker.get_queue("later").is_none());
    let q = broker.get_queue("q").unwrap();
    assert_eq!(q.len(), 1);
    let other = broker.queue("after-restart").await.unwrap();
    broker.shutdown().await.unwrap();
    let after_id = queue_id(dir.path(), "after-restart").unwrap();
    assert!(after_id > later_id && after_id > new_id, "ids are never reused across a restart");
    drop(other);
}

#[tokio::test]
async fn delete_and_recreate_survives_restart_buffered() {
    delete_and_recreate_survives_restart(Durability::Buffered).await;
}

#[tokio::test]
async fn delete_and_recreate_survives_restart_fsync() {
    delete_and_recreate_survives_restart(Durability::Fsync).await;
}

#[tokio::test]
async fn bad_input_and_missing_names_change_nothing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send("a").await.unwrap();
    q.group("g").unwrap().subscribe().await.map(drop).unwrap();

    for bad in ["", "has space", "a:b", &"x".repeat(200)] {
        assert!(broker.get_queue(bad).is_none());
        assert!(matches!(broker.delete_queue(bad).await, Err(Error::InvalidName(_))), "{bad:?}");
        assert!(matches!(broker.purge_queue(bad).await, Err(Error::InvalidName(_))), "{bad:?}");
        assert!(matches!(broker.delete_group(bad, "g").await, Err(Error::InvalidName(_))), "{bad:?}");
        assert!(matches!(broker.delete_group("q", bad).await, Err(Error::InvalidName(_))), "{bad:?}");
    }
    assert!(broker.get_queue("missing").is_none());
    assert!(broker.queue_names().iter().all(|n| n != "missing"), "get_queue writes nothing");
    assert!(!broker.delete_queue("missing").await.unwrap());
    assert!(!broker.delete_group("missing", "g").await.unwrap());
    assert!(!broker.delete_group("q", "missing").await.unwrap());
    assert_eq!(broker.purge_queue("missing").await.unwrap(), 0);
    assert_eq!(q.len(), 1);
    assert_eq!(broker.stats().await.unwrap().groups.len(), 1);

    broker.shutdown().await.unwrap();
    assert!(broker.get_queue("q").is_none());
    assert!(matches!(broker.delete_queue("q").await, Err(Error::Shutdown)));
    assert!(matches!(broker.purge_queue("q").await, Err(Error::Shutdown)));
    assert!(matches!(broker.delete_group("q", "g").await, Err(Error::Shutdown)));

    let broker = open(dir.path()).await;
    assert_eq!(broker.get_queue("q").unwrap().len(), 1);
    broker.shutdown().await.unwrap();
}

/// Regression (review of issue 17): a handle made before a queue was deleted reached the group
/// of the same name on the queue created again under that name, and a reset through it moved
/// the new group's offset past messages it never received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_handle_cannot_reset_or_reconfigure_a_recreated_queues_group() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let old = broker.queue("q").await.unwrap();
    old.send_batch((0..50).map(|i| i.to_string())).await.unwrap();
    let (old_work, old_ordered) = (old.work_group("w").unwrap(), old.group("o").unwrap());
    drop(old_work.subscribe().await.unwrap());
    drop(old_ordered.subscribe().await.unwrap());
    assert!(broker.delete_queue("q").await.unwrap());

    let new = broker.queue("q").await.unwrap();
    new.send_batch(["a", "b", "c"]).await.unwrap();
    drop(new.work_group("w").unwrap().subscribe().await.unwrap());
    drop(new.group("o").unwrap().subscribe().await.unwrap());
    let to = rockq::ResetTo::Sequence(4);
    assert!(old_work.reset_to(to).await.is_err(), "a stale work-group handle must not reset the new group");
    assert!(old_ordered.reset_to(to).await.is_err(), "nor a stale ordered handle");
    assert!(old_work.committed().is_none() && old_ordered.committed().is_none());
    assert!(old_work.clone().lease(Duration::from_secs(1)).update().await.is_err());
    // The new groups still deliver all three.
    let mut jobs = new.work_group("w").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        next_job(&mut jobs).await.ack_durable().await.unwrap();
    }
    let mut sub = new.group("o").unwrap().subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut sub, 3).await), ["a", "b", "c"]);
    broker.shutdown().await.unwrap();
}

/// Regression (review of issue 17): a delivery handed back (nacked) before a purge was
/// delivered again after it, though the purge deleted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_also_drops_deliveries_waiting_to_be_redelivered() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["old-1", "old-2"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let (a, b) = (next(&mut sub).await, next(&mut sub).await);
    a.nack();
    b.nack_after(Duration::from_secs(3600));
    assert_eq!(broker.purge_queue("q").await.unwrap(), 2);
    q.send("new").await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"new", "nothing purged comes back");
    d.ack_durable().await.unwrap();
    assert_eq!(sub.committed(), 3);
    broker.shutdown().await.unwrap();
}
