//! Keyspaces and transactions: application state in the broker's database, and acks, sends and
//! writes applied as one atomic write (all or nothing), against real RocksDB databases.
//! `scripts/etcd-semantics.sh` runs them against etcd as well (not those that ack ordered
//! deliveries, send with an idempotency key or a delay, or hold more operations than one etcd
//! transaction: not on etcd).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::TryStreamExt;
use rockq::{Durability, Error, Expect, Message, Sent};

fn text(e: &rockq::Entry) -> String {
    String::from_utf8(e.value.to_vec()).unwrap()
}

#[tokio::test]
async fn keyspace_reads_and_writes_survive_a_restart() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let kv = broker.kv("accounts").await.unwrap();
    assert!(kv.is_empty());
    let r1 = kv.put("alice", "10").await.unwrap();
    let r2 = kv.put("bob", "20").await.unwrap();
    let r3 = kv.put("alice", "11").await.unwrap();
    assert!(r1 < r2 && r2 < r3, "revisions grow: {r1} {r2} {r3}");
    let alice = kv.get("alice").await.unwrap().unwrap();
    assert_eq!((text(&alice), alice.revision), ("11".to_owned(), r3));
    assert_eq!(kv.get("carol").await.unwrap(), None);
    assert_eq!(kv.len(), 2);
    kv.delete("bob").await.unwrap();
    kv.delete("nobody").await.unwrap();
    assert_eq!(kv.len(), 1);
    assert_eq!(broker.kv_names(), vec!["accounts".to_owned()]);
    let stats = broker.stats().await.unwrap();
    assert_eq!(stats.keyspaces.len(), 1);
    assert_eq!((stats.keyspaces[0].name.as_str(), stats.keyspaces[0].keys), ("accounts", 1));
    broker.shutdown().await.unwrap();

    let broker = open(dir.path()).await;
    let kv = broker.get_kv("accounts").expect("the keyspace survives");
    assert_eq!(kv.len(), 1);
    assert_eq!(text(&kv.get("alice").await.unwrap().unwrap()), "11");
    assert_eq!(kv.get("bob").await.unwrap(), None);
    // Revisions go on from where they were, also for a key deleted and written again: a
    // compare-and-set on a revision read before the delete cannot succeed (no ABA).
    let again = kv.put("bob", "5").await.unwrap();
    assert!(again > r3, "{again} > {r3}");
    let stale = kv.compare_and_set("bob", Expect::Revision(r2), Some("6")).await.unwrap_err();
    assert!(matches!(&stale, Error::Conflict { found: Some(f), .. } if *f == again), "{stale:?}");
    broker.shutdown().await.unwrap();

    // A read-only inspector sees the keyspace too.
    let inspector = inspector(dir.path()).await;
    let stats = inspector.stats().await.unwrap();
    assert_eq!(
        stats.keyspaces.iter().map(|k| (k.name.as_str(), k.keys)).collect::<Vec<_>>(),
        vec![("accounts", 2)]
    );
}

#[tokio::test]
async fn scans_and_prefixes_are_ordered_and_bounded_across_pages() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let kv = broker.kv("items").await.unwrap();
    let other = broker.kv("other").await.unwrap();
    other.put("a/0", "x").await.unwrap();
    // More than one page (256) under one prefix, and keys around it. (On etcd in transactions
    // of 100: one etcd transaction holds at most 128 operations.)
    let per_tx = if against_etcd() { 100 } else { 600 };
    let mut tx = broker.transaction();
    for i in 0..600u32 {
        tx.put(&kv, format!("a/{i:04}"), i.to_string()).unwrap();
        if (i + 1) % per_tx == 0 {
            std::mem::replace(&mut tx, broker.transaction()).commit().await.unwrap();
        }
    }
    tx.put(&kv, "a", "exact").unwrap();
    tx.put(&kv, "b/0", "after").unwrap();
    tx.put(&kv, [0xffu8, 0xff], "high").unwrap();
    tx.commit().await.unwrap();
    assert_eq!(kv.len(), 603);

    let a: Vec<_> = kv.prefix("a/").try_collect().await.unwrap();
    assert_eq!(a.len(), 600);
    assert!(a.windows(2).all(|w| w[0].key < w[1].key));
    assert_eq!(&a[0].key[..], b"a/0000");
    assert_eq!(&a[599].key[..], b"a/0599");
    let all: Vec<_> = kv.scan::<&[u8], _>(..).try_collect().await.unwrap();
    assert_eq!(all.len(), 603, "nothing of the other keyspace");
    let high: Vec<_> = kv.prefix([0xffu8]).try_collect().await.unwrap();
    assert_eq!(high.len(), 1);
    let some: Vec<_> = kv.scan(&b"a/0010"[..]..=&b"a/0012"[..]).try_collect().await.unwrap();
    assert_eq!(some.iter().map(text).collect::<Vec<_>>(), vec!["10", "11", "12"]);
    let excl: Vec<_> = kv
        .scan::<&[u8], _>((
            std::ops::Bound::Excluded(&b"a/0010"[..]),
            std::ops::Bound::Excluded(&b"a/0012"[..]),
        ))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(excl.iter().map(text).collect::<Vec<_>>(), vec!["11"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    assert!(matches!(broker.kv("bad name").await, Err(Error::InvalidName(_))));
    assert!(matches!(broker.kv("").await, Err(Error::InvalidName(_))));
    assert!(broker.get_kv("bad name").is_none());
    let kv = broker.kv("k").await.unwrap();
    assert!(matches!(kv.get("").await, Err(Error::Invalid { .. })));
    assert!(matches!(kv.put("", "v").await, Err(Error::Invalid { .. })));
    assert!(matches!(kv.put(vec![b'k'; rockq::MAX_KV_KEY_LEN + 1], "v").await, Err(Error::Invalid { .. })));
    let big = vec![0u8; 4 << 20]; // above the default maximum message size
    assert!(matches!(kv.put("k", big).await, Err(Error::Invalid { .. })));

    // Something of another broker in a transaction: refused whole.
    let dir2 = tempdir();
    let other = open(dir2.path()).await;
    let foreign = other.kv("k").await.unwrap();
    let mut tx = broker.transaction();
    tx.put(&kv, "mine", "1").unwrap();
    tx.put(&foreign, "theirs", "1").unwrap();
    assert!(matches!(tx.commit().await, Err(Error::Invalid { .. })));
    assert_eq!(kv.get("mine").await.unwrap(), None);
    assert_eq!(foreign.get("theirs").await.unwrap(), None);
    other.shutdown().await.unwrap();

    // A transaction is one write batch held in memory: past MAX_TX_BYTES it refuses more.
    let mut tx = broker.transaction();
    let mib = rockq::Bytes::from(vec![0u8; 1 << 20]);
    let refused = (0..100).find_map(|i| tx.put(&kv, format!("k{i}"), mib.clone()).err().map(|e| (i, e)));
    assert!(
        matches!(refused, Some((63, Error::Invalid { .. }))),
        "the 64th MiB (with its key) passes {} bytes: {refused:?}",
        rockq::MAX_TX_BYTES
    );
    drop(tx);
    assert_eq!(kv.len(), 0);

    // An empty transaction commits and writes nothing.
    let done = broker.transaction().commit().await.unwrap();
    assert_eq!((done.revision(), done.sent().len()), (None, 0));
    assert_eq!(kv.len(), 0);

    broker.shutdown().await.unwrap();
    assert!(matches!(kv.put("k", "v").await, Err(Error::Shutdown)));
    assert!(matches!(kv.get("k").await, Err(Error::Shutdown)));
    assert!(matches!(broker.kv("k").await, Err(Error::Shutdown)));
}

#[tokio::test]
async fn a_transaction_acks_writes_and_sends_together() {
    let dir = tempdir();
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let orders = broker.queue("orders").await.unwrap();
    let invoices = broker.queue("invoices").await.unwrap();
    let balances = broker.kv("balances").await.unwrap();
    orders.send_batch(["alice:5", "bob:7"]).await.unwrap();
    let group = orders.work_group("billing").unwrap();
    let mut jobs = group.subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let seq = job.seq();
    let mut tx = broker.transaction();
    assert_eq!(tx.get_for_update(&balances, "alice").await.unwrap(), None);
    tx.put(&balances, "alice", "5").unwrap();
    tx.send(&invoices, "invoice alice 5").unwrap();
    tx.send(&invoices, Message::new("dup").idempotency_key("inv-1")).unwrap();
    tx.send(&invoices, Message::new("dup again").idempotency_key("inv-1")).unwrap();
    tx.send(&invoices, Message::new("later").deliver_after(Duration::from_secs(3600))).unwrap();
    tx.ack_job(job);
    assert_eq!(tx.len(), 7);
    let done = tx.commit().await.unwrap();
    // Applied, all of it, and durable: visible to a reader that reopens.
    assert!(done.revision().is_some());
    assert!(
        matches!(done.sent(), [Sent::Appended(1), Sent::Appended(2), Sent::Duplicate(_), Sent::Scheduled(_)]),
        "{:?}",
        done.sent()
    );
    assert_eq!(group.committed(), Some(seq));
    drop(jobs);
    broker.shutdown().await.unwrap();

    let broker = open(dir.path()).await;
    let balances = broker.get_kv("balances").unwrap();
    let alice = balances.get("alice").await.unwrap().unwrap();
    assert_eq!((text(&alice), Some(alice.revision)), ("5".to_owned(), done.revision()));
    let invoices = broker.get_queue("invoices").unwrap();
    assert_eq!(invoices.len(), 2);
    let peek = broker.peek("invoices", None, 10).await.unwrap();
    assert_eq!(peek.iter().map(|m| m.payload.clone()).collect::<Vec<_>>(), vec!["invoice alice 5", "dup"]);
    let q = broker.get_queue("orders").unwrap();
    let mut jobs = q.work_group("billing").unwrap().subscribe().await.unwrap();
    let next = next_job(&mut jobs).await;
    assert_eq!(next.payload(), "bob:7", "the acked order is not delivered again");
    drop(next);
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_conflict_applies_nothing_and_exactly_one_of_two_racing_transactions_wins() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let out = broker.queue("out").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    let r0 = kv.put("counter", "0").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let group = q.work_group("w").unwrap();
    let mut jobs = group.subscribe().await.unwrap();
    let (ja, jb) = (next_job(&mut jobs).await, next_job(&mut jobs).await);
    let (sa, sb) = (ja.seq(), jb.seq());

    // Both read revision r0 and write under that condition; the writer applies them one
    // after the other, in one round or two, so exactly one finds its condition holding.
    let mut txa = broker.transaction();
    txa.put_if(&kv, "counter", "a", Expect::Revision(r0)).unwrap();
    txa.put(&kv, "side-a", "1").unwrap();
    txa.send(&out, "from a").unwrap();
    txa.ack_job(ja);
    let mut txb = broker.transaction();
    txb.put_if(&kv, "counter", "b", Expect::Revision(r0)).unwrap();
    txb.put(&kv, "side-b", "1").unwrap();
    txb.send(&out, "from b").unwrap();
    txb.ack_job(jb);
    let (ra, rb) = tokio::join!(txa.commit(), txb.commit());
    let (won, lost, loser_seq, loser_side) = match (&ra, &rb) {
        (Ok(_), Err(e)) => ("a", e, sb, "side-b"),
        (Err(e), Ok(_)) => ("b", e, sa, "side-a"),
        other => panic!("exactly one must win: {other:?}"),
    };
    assert!(lost.is_conflict(), "{lost:?}");
    // A text key reads as text; a binary one as hex.
    assert!(lost.to_string().contains(r#"key "counter" expected"#), "{lost}");
    let binary = Error::Conflict {
        keyspace: "k".into(),
        key: vec![0, 0xff],
        expected: Expect::Absent,
        found: Some(3),
    };
    assert!(binary.to_string().contains("key 0x00ff expected"), "{binary}");
    assert!(lost.is_retryable());
    assert!(
        matches!(lost, Error::Conflict { found: Some(_), expected: Expect::Revision(r), .. } if *r == r0)
    );
    assert_eq!(text(&kv.get("counter").await.unwrap().unwrap()), won);
    assert_eq!(kv.get(loser_side).await.unwrap(), None, "the loser wrote nothing");
    let peek = broker.peek("out", None, 10).await.unwrap();
    assert_eq!(peek.len(), 1, "the loser sent nothing");
    assert_eq!(peek[0].payload, format!("from {won}"));
    // The loser's job was released and comes back; a conflict is no failed attempt.
    let again = next_job(&mut jobs).await;
    assert_eq!((again.seq(), again.attempt()), (loser_seq, 1));
    again.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(sa.max(sb)));
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn many_concurrent_compare_and_sets_each_count_once() {
    // Eight tasks increment one counter 25 times each with read-compare-set retry loops:
    // every increment lands exactly once, whatever the interleaving in the writer's rounds.
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let kv = broker.kv("c").await.unwrap();
    let conflicts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (kv, conflicts) = (kv.clone(), conflicts.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                loop {
                    let cur = kv.get("n").await.unwrap();
                    let n: u64 = cur.as_ref().map_or(0, |e| text(e).parse().unwrap());
                    match kv
                        .compare_and_set("n", Expect::from_read(cur.as_ref()), Some((n + 1).to_string()))
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => {
                            conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(text(&kv.get("n").await.unwrap().unwrap()), "200");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_transaction_holding_an_expired_lease_fails_and_applies_nothing() {
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    let out = broker.queue("out").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    q.send("job").await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(30));
    let mut jobs = group.subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let seq = job.seq();
    let mut tx = broker.transaction();
    tx.put(&kv, "result", "done").unwrap();
    tx.send(&out, "follow-up").unwrap();
    tx.ack_job(job);
    // The handler took longer than its lease.
    clock.advance(Duration::from_secs(31));
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(&err, Error::LeaseLost { seq: s, .. } if *s == seq), "{err:?}");
    assert_eq!(kv.get("result").await.unwrap(), None, "no write applied");
    assert_eq!(out.len(), 0, "no send applied");
    assert_eq!(group.committed(), Some(0), "no ack applied");
    // The message is claimable again, by whoever comes next.
    let again = next_job(&mut jobs).await;
    assert_eq!((again.seq(), again.attempt()), (seq, 2));
    drop(again);
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropping_a_transaction_applies_nothing_and_releases_what_it_held() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    q.send_batch(["one", "two"]).await.unwrap();
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let d = next(&mut sub).await;
    let (jseq, dseq) = (job.seq(), d.seq());
    {
        let mut tx = broker.transaction();
        tx.put(&kv, "x", "1").unwrap();
        tx.send(&q, "three").unwrap();
        tx.ack_job(job).ack(d);
    }
    assert_eq!(kv.get("x").await.unwrap(), None);
    assert_eq!(q.len(), 2);
    // The job came back (the subscription may hand out the unclaimed second message first).
    let (j1, j2) = (next_job(&mut jobs).await, next_job(&mut jobs).await);
    assert!(j1.seq() == jseq || j2.seq() == jseq, "the job came back: {} {}", j1.seq(), j2.seq());
    let again = next(&mut sub).await;
    assert_eq!(again.seq(), dseq, "the delivery came back");
    drop((j1, j2, again, jobs, sub));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn ordered_acks_in_transactions_survive_a_crash_even_above_an_unacked_delivery() {
    let dir = tempdir();
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("seen").await.unwrap();
    q.send_batch(["1", "2", "3", "4"]).await.unwrap();
    let group = q.group("o").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let ds = take(&mut sub, 4).await;
    let mut ds = ds.into_iter();
    let (d1, d2, d3, d4) = (ds.next().unwrap(), ds.next().unwrap(), ds.next().unwrap(), ds.next().unwrap());
    // 2 and 4 are acked in transactions while 1 (and 3) are still out: the offset cannot
    // move, so each transaction records its ack with its write.
    for d in [d2, d4] {
        let mut tx = broker.transaction();
        tx.put(&kv, d.payload().clone(), "seen").unwrap();
        tx.ack(d);
        tx.commit().await.unwrap();
    }
    assert_eq!(group.committed(), Some(0));
    // The broker goes away with 1 and 3 unacked (handed back; a kill -9 is in
    // tests/crash_exactly_once.rs): the offset stays at 0, and the transactions' acks stay recorded.
    drop((d1, d3, sub, group, q, kv));
    drop(broker);

    let broker = reopen_after_drop_mode(dir.path(), Durability::Fsync).await;
    let kv = broker.get_kv("seen").unwrap();
    assert_eq!(kv.len(), 2);
    let q = broker.get_queue("q").unwrap();
    let group = q.group("o").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    // Only 1 and 3 come back: 2 and 4 were acked with their writes.
    let d1 = next(&mut sub).await;
    let d3 = next(&mut sub).await;
    assert_eq!((d1.seq(), d3.seq()), (1, 3));
    // Acking 1 and 3 in one transaction moves the offset over everything in that batch.
    let mut tx = broker.transaction();
    tx.put(&kv, "1", "seen").unwrap().put(&kv, "3", "seen").unwrap();
    tx.ack(d1).ack(d3);
    tx.commit().await.unwrap();
    assert_eq!(group.committed(), Some(4));
    assert_next_is_sentinel(&q, &mut sub).await;
    drop(sub);
    broker.shutdown().await.unwrap();

    let broker = open(dir.path()).await;
    let q = broker.get_queue("q").unwrap();
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    assert_next_is_sentinel(&q, &mut sub).await;
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// Acks count toward `MAX_TX_OPS` like writes and sends: a transaction over it is refused at
/// commit, before the writer, and hands back what it held.
#[tokio::test]
async fn acks_count_toward_max_tx_ops_and_a_transaction_over_it_applies_nothing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let group = q.group("o").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let work = q.work_group("w").unwrap();
    let mut jobs = work.subscribe().await.unwrap();
    let full = |tx: &mut rockq::Transaction| {
        for i in 0..rockq::MAX_TX_OPS {
            tx.put(&kv, format!("k{i}"), "v").unwrap();
        }
        assert!(matches!(tx.put(&kv, "one-more", "v"), Err(Error::Invalid { .. })), "full");
    };
    // Full of writes, plus one ordered ack.
    let d = next(&mut sub).await;
    let mut tx = broker.transaction();
    full(&mut tx);
    tx.ack(d);
    assert_eq!(tx.len(), rockq::MAX_TX_OPS + 1);
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(&err, Error::Invalid { reason } if reason.contains("operations")), "{err:?}");
    assert_eq!(kv.len(), 0, "no write applied");
    assert_eq!(group.committed(), Some(0), "no ack applied");
    assert_eq!(next(&mut sub).await.seq(), 1, "the delivery was handed back");
    // Full of writes, plus one job's ack.
    let job = next_job(&mut jobs).await;
    let seq = job.seq();
    let mut tx = broker.transaction();
    full(&mut tx);
    tx.ack_job(job);
    assert!(matches!(tx.commit().await, Err(Error::Invalid { .. })));
    assert_eq!(kv.len(), 0, "no write applied");
    assert_eq!(work.committed(), Some(0), "no ack applied");
    let mut again = next_job(&mut jobs).await;
    if again.seq() != seq {
        again = next_job(&mut jobs).await;
    }
    assert_eq!(again.seq(), seq, "the job was released");
    // Exactly MAX_TX_OPS, acks included, commits.
    let mut tx = broker.transaction();
    for i in 0..rockq::MAX_TX_OPS - 1 {
        tx.put(&kv, format!("k{i}"), "v").unwrap();
    }
    tx.ack_job(again);
    tx.commit().await.unwrap();
    assert_eq!(kv.len(), rockq::MAX_TX_OPS as u64 - 1);
    drop((sub, jobs));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_refused_transaction_hands_its_ordered_delivery_back() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    q.send("m").await.unwrap();
    let group = q.group("o").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let d = next(&mut sub).await;
    let mut tx = broker.transaction();
    tx.put(&kv, "x", "1").unwrap();
    tx.send(&q, "never").unwrap();
    tx.ack(d);
    // Refused for another reason than a conflict (a send to a queue deleted meanwhile).
    let other = broker.queue("other").await.unwrap();
    tx.send(&other, "y").unwrap();
    broker.delete_queue("other").await.unwrap();
    assert!(matches!(tx.commit().await, Err(Error::QueueDeleted { .. })));
    assert_eq!(group.committed(), Some(0));
    let again = next(&mut sub).await;
    // Handed back as a nack is: delivered again, and the delivery counted.
    assert_eq!((again.seq(), again.delivery_count()), (1, 2), "handed back, delivered again");
    again.ack_durable().await.unwrap();
    assert_eq!(kv.get("x").await.unwrap(), None);
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// An ordered loop whose transaction conflicts (someone wrote first) gets its delivery back
/// after a short pause on the broker's clock — not at once, so a busy key does not spin the
/// loop — and uncounted: conflicts never bring a message to its poison limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_ordered_transaction_gets_its_delivery_back_paused_and_uncounted() {
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    kv.put("gate", "closed").await.unwrap();
    q.send("m").await.unwrap();
    // Two deliveries at most, then the dead-letter queue: five conflicts must not get it there.
    let group = q.group("o").unwrap().max_deliveries(2).dead_letter_queue("q.dlq");
    let mut sub = group.subscribe().await.unwrap();
    let mut d = next(&mut sub).await;
    for _ in 0..5 {
        let mut tx = broker.transaction();
        tx.expect(&kv, "gate", Expect::Absent).unwrap();
        tx.ack(d);
        assert!(tx.commit().await.unwrap_err().is_conflict());
        // Not redelivered before the pause: a message sent now is delivered first.
        let sentinel = q.send("sentinel").await.unwrap();
        let s = next(&mut sub).await;
        assert_eq!(s.seq(), sentinel, "the conflicted delivery waits out its pause");
        s.ack().unwrap();
        clock.advance(Duration::from_millis(5));
        d = next(&mut sub).await;
        assert_eq!((d.seq(), d.delivery_count()), (1, 1), "back, its delivery uncounted");
    }
    d.ack_durable().await.unwrap();
    assert_eq!(broker.queue("q.dlq").await.unwrap().len(), 0, "never dead-lettered");
    drop(sub);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn sends_to_a_deleted_queue_and_acks_on_a_deleted_group_refuse_the_transaction() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let gone = broker.queue("gone").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    let mut tx = broker.transaction();
    tx.put(&kv, "x", "1").unwrap();
    tx.send(&gone, "m").unwrap();
    broker.delete_queue("gone").await.unwrap();
    assert!(matches!(tx.commit().await, Err(Error::QueueDeleted { .. })));
    assert_eq!(kv.get("x").await.unwrap(), None);

    q.send("m").await.unwrap();
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let job = next_job(&mut jobs).await;
    let mut tx = broker.transaction();
    tx.put(&kv, "y", "1").unwrap();
    tx.ack_job(job);
    broker.delete_group("q", "w").await.unwrap();
    assert!(matches!(tx.commit().await, Err(Error::GroupDeleted { .. })));
    assert_eq!(kv.get("y").await.unwrap(), None);
    drop(jobs);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_worker_pool_commits_the_handlers_transaction_with_the_ack() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let orders = broker.queue("orders").await.unwrap();
    let invoices = broker.queue("invoices").await.unwrap();
    let balances = broker.kv("balances").await.unwrap();
    for i in 0..60u32 {
        orders.send(Message::new(format!("{}", i % 7 + 1)).key(format!("acct-{}", i % 3))).await.unwrap();
    }
    // Eight workers on three accounts: concurrent read-modify-writes of one key conflict,
    // and a conflict is a failed attempt, retried until the handler's reads are current.
    let group = orders.work_group("billing").unwrap().retry_policy(
        rockq::RetryPolicy::default()
            .max_attempts(1000)
            .backoff(Duration::from_millis(1), Duration::from_millis(2)),
    );
    let (inv, bal) = (invoices.clone(), balances.clone());
    let handle = group.workers(8).spawn(move |task: rockq::Task| {
        let (inv, bal) = (inv.clone(), bal.clone());
        async move {
            let tx = task.tx();
            let account = task.key().unwrap().to_owned();
            let cur = tx.get_for_update(&bal, &account).await?;
            let n: u64 = cur.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap());
            let amount: u64 = String::from_utf8_lossy(task.payload()).parse().unwrap();
            tx.put(&bal, &account, (n + amount).to_string())?;
            tx.send(&inv, format!("order {} charged {amount}", task.seq()))?;
            Ok::<_, rockq::HandlerError>(())
        }
    });
    let last = orders.last_seq();
    tokio::time::timeout(HANG_GUARD, async {
        while group.committed() != Some(last) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the pool drains");
    handle.shutdown().await.unwrap();
    let mut expected = [0u64; 3];
    for i in 0..60u32 {
        expected[(i % 3) as usize] += u64::from(i % 7 + 1);
    }
    for (a, want) in expected.iter().enumerate() {
        let got = balances.get(format!("acct-{a}")).await.unwrap().unwrap();
        assert_eq!(text(&got), want.to_string(), "account {a}");
    }
    // One invoice per order: conflicted attempts sent nothing.
    let peek = broker.peek("invoices", None, 100).await.unwrap();
    assert_eq!(peek.len(), 60);
    let mut orders_invoiced: Vec<String> = peek
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).split(' ').nth(1).unwrap().to_owned())
        .collect();
    orders_invoiced.sort();
    orders_invoiced.dedup();
    assert_eq!(orders_invoiced.len(), 60);
    broker.shutdown().await.unwrap();
}

/// Runs 1,000 jobs through `workers(n)`, each handler incrementing one shared counter with
/// `get_for_update` + `put`, with `max_attempts(1)`: a conflict counted as an attempt would
/// dead-letter the job. Returns the pool's report and how many handler runs there were.
async fn one_counter(workers: usize) -> (rockq::PoolReport, u64) {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let kv = broker.kv("counters").await.unwrap();
    for chunk in 0..10 {
        q.send_batch((0..100).map(|i| format!("{}", chunk * 100 + i))).await.unwrap();
    }
    let group = q
        .work_group("w")
        .unwrap()
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1))
        .dead_letter_queue("jobs.dlq");
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (r, k) = (runs.clone(), kv.clone());
    let handle = group.workers(workers).spawn(move |task: rockq::Task| {
        let (r, k) = (r.clone(), k.clone());
        async move {
            r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tx = task.tx();
            let cur = tx.get_for_update(&k, "n").await?;
            let n: u64 = cur.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().unwrap());
            tx.put(&k, "n", (n + 1).to_string())?;
            Ok::<_, rockq::HandlerError>(())
        }
    });
    tokio::time::timeout(HANG_GUARD, async {
        while group.committed() != Some(1000) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the pool drains");
    let report = handle.shutdown().await.unwrap();
    assert_eq!(text(&kv.get("n").await.unwrap().unwrap()), "1000", "every increment once");
    assert_eq!((report.acked, report.failed, report.unsettled), (1000, 0, 0), "{report:?}");
    assert_eq!(broker.queue("jobs.dlq").await.unwrap().len(), 0, "no job dead-lettered");
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(runs - 1000, report.conflicts, "every re-run is a reported conflict");
    broker.shutdown().await.unwrap();
    (report, runs)
}

/// A pool takes its next job while the previous job's transaction is on its way to the disk;
/// `get_for_update` waits for that commit (the key is held in this process until it is
/// answered), so one worker never conflicts with its own pool, and eight take turns. A conflict
/// that does happen is not a failed attempt: the job runs again, at the same attempt, and is
/// reported in `PoolReport::conflicts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_updating_one_key_does_not_conflict_with_its_own_commits() {
    let (one, runs) = one_counter(1).await;
    assert_eq!((one.conflicts, runs), (0, 1000), "workers(1): no re-run");
    let (eight, runs) = one_counter(8).await;
    println!("re-runs per 1,000 jobs on one key: workers(1) 0, workers(8) {}", runs - 1000);
    assert_eq!(eight.conflicts, runs - 1000);
}

/// A condition that can never hold must not loop: after 16 re-runs in a row the conflict is a
/// failed attempt, and the job is dead-lettered once its attempts are used up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_never_holds_is_a_failed_attempt_after_sixteen_re_runs() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    kv.put("gate", "set").await.unwrap();
    q.send("x").await.unwrap();
    let group = q
        .work_group("w")
        .unwrap()
        .retry_policy(
            rockq::RetryPolicy::default()
                .max_attempts(2)
                .backoff(Duration::from_millis(1), Duration::from_millis(1)),
        )
        .dead_letter_queue("q.dlq");
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, k) = (attempts.clone(), kv.clone());
    let handle = group.workers(1).spawn(move |task: rockq::Task| {
        let (a, k) = (a.clone(), k.clone());
        async move {
            a.lock().unwrap().push(task.attempt());
            task.tx().expect(&k, "gate", Expect::Absent)?;
            task.tx().put(&k, "written", "1")?;
            Ok::<_, rockq::HandlerError>(())
        }
    });
    let dlq = broker.queue("q.dlq").await.unwrap();
    tokio::time::timeout(HANG_GUARD, async {
        while dlq.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("dead-lettered");
    let report = handle.shutdown().await.unwrap();
    let seen = attempts.lock().unwrap().clone();
    let want: Vec<u32> = [1; 17].into_iter().chain([2; 17]).collect();
    assert_eq!(seen, want, "17 runs per attempt: the first and 16 re-runs");
    assert_eq!((report.conflicts, report.failed, report.acked), (32, 2, 0), "{report:?}");
    assert_eq!(kv.get("written").await.unwrap(), None);
    let dead = broker.peek("q.dlq", None, 1).await.unwrap();
    let reason = dead[0]
        .headers
        .iter()
        .find(|(k, _)| k == "rockq-dlq-reason")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    assert!(reason.as_deref().unwrap_or("").contains("conflicted 17 times in a row"), "{reason:?}");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_handler_that_fails_applies_nothing_of_its_transaction() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let kv = broker.kv("k").await.unwrap();
    q.send("x").await.unwrap();
    let group = q.work_group("w").unwrap().retry_policy(
        rockq::RetryPolicy::default()
            .max_attempts(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(1)),
    );
    let attempts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (a, k) = (attempts.clone(), kv.clone());
    let handle = group.workers(1).spawn(move |task: rockq::Task| {
        let (a, k) = (a.clone(), k.clone());
        async move {
            let n = a.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            task.tx().put(&k, format!("attempt-{n}"), "written")?;
            if n == 1 {
                return Err(rockq::HandlerError::retry("first attempt fails"));
            }
            Ok(())
        }
    });
    tokio::time::timeout(HANG_GUARD, async {
        while group.committed() != Some(1) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap();
    handle.shutdown().await.unwrap();
    assert_eq!(kv.get("attempt-1").await.unwrap(), None, "the failed attempt's write was dropped");
    assert!(kv.get("attempt-2").await.unwrap().is_some());
    broker.shutdown().await.unwrap();
}
