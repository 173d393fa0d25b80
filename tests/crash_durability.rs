//! Durability modes: what each one syncs, and that resolved sends survive a process crash.

mod common;

use std::io::BufRead;

use common::*;
use rockq::{Durability, Options};

async fn wal_syncs_after_sends(durability: Durability) -> (u64, u64) {
    let dir = tempdir();
    let broker = Options::new().durability(durability).statistics(true).open(dir.path()).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    let base = broker.storage_stats().unwrap().wal_syncs;
    for i in 0..20u64 {
        q.send(format!("{i}")).await.unwrap();
        if durability == Durability::Fsync {
            // The sync covering this send finished before it resolved.
            let synced = broker.storage_stats().unwrap().wal_syncs - base;
            assert!(synced > i, "send {i} resolved after only {synced} syncs");
        }
    }
    let after_sends = broker.storage_stats().unwrap().wal_syncs - base;
    broker.shutdown().await.unwrap();
    (after_sends, 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_mode_syncs_the_wal_before_each_send_resolves() {
    let (syncs, sends) = wal_syncs_after_sends(Durability::Fsync).await;
    // Sequential sends cannot share a group commit: each one waited for its own sync.
    assert!(syncs >= sends, "{syncs} syncs for {sends} sends");
}

/// WAL syncs counted across each step of a work group's life and a transaction under
/// `durability`: `[claim handed out, ack_durable, commit, keyspace put]`, each the syncs the
/// step made before it returned.
async fn wal_syncs_per_step(durability: Durability) -> [u64; 4] {
    let dir = tempdir();
    let broker = Options::new().durability(durability).statistics(true).open(dir.path()).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let accounts = broker.kv("accounts").await.unwrap();
    let mut jobs = q.work_group("w").unwrap().read_batch(1).subscribe().await.unwrap();
    let syncs = || broker.storage_stats().unwrap().wal_syncs;
    let mut steps = [0; 4];
    let before = syncs();
    let first = next_job(&mut jobs).await;
    steps[0] = syncs() - before;
    let before = syncs();
    first.ack_durable().await.unwrap();
    steps[1] = syncs() - before;
    let second = next_job(&mut jobs).await;
    let mut tx = broker.transaction();
    tx.ack_job(second);
    tx.put(&accounts, "alice", "opened").unwrap();
    let before = syncs();
    tx.commit().await.unwrap();
    steps[2] = syncs() - before;
    let before = syncs();
    accounts.put("bob", "opened").await.unwrap();
    steps[3] = syncs() - before;
    drop(jobs);
    broker.shutdown().await.unwrap();
    steps
}

/// Under `Fsync` a claim is synced before its job is handed out, and an outcome before
/// `ack_durable`, a transaction's `commit` and a keyspace write return (docs/guarantees.md):
/// each step made at least one WAL sync before it returned. Under `Buffered` none of them
/// syncs: the count above is the steps' own, not background work's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_mode_syncs_claims_outcomes_commits_and_keyspace_writes_before_they_return() {
    let fsync = wal_syncs_per_step(Durability::Fsync).await;
    assert!(fsync.iter().all(|&n| n >= 1), "syncs per step [claim, ack_durable, commit, put]: {fsync:?}");
    let buffered = wal_syncs_per_step(Durability::Buffered).await;
    assert_eq!(buffered, [0; 4], "syncs per step under Buffered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_mode_does_not_sync_on_send_but_syncs_at_shutdown() {
    let (syncs, _) = wal_syncs_after_sends(Durability::Buffered).await;
    assert_eq!(syncs, 0);

    let dir = tempdir();
    let broker =
        Options::new().durability(Durability::Buffered).statistics(true).open(dir.path()).await.unwrap();
    broker.queue("q").await.unwrap().send("x").await.unwrap();
    let stats = broker.clone();
    let before = stats.storage_stats().unwrap().wal_syncs;
    broker.shutdown().await.unwrap();
    // Statistics outlive the closed database; the final sync is counted.
    assert!(stats.storage_stats().unwrap().wal_syncs > before, "shutdown syncs the WAL");
}

/// Child side of the crash tests: sends forever from several tasks, printing each sequence
/// once its send resolved, until the parent kills it with SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_send_until_killed() {
    let Ok(path) = std::env::var("ROCKQ_CRASH_PATH") else { return };
    let durability = match std::env::var("ROCKQ_CRASH_MODE").as_deref() {
        Ok("fsync") => Durability::Fsync,
        _ => Durability::Buffered,
    };
    let broker = open_with(std::path::Path::new(&path), durability).await;
    let q = broker.queue("crash").await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, String)>();
    for t in 0..8 {
        let q = q.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let payload = format!("t{t}-{i}");
                let seq = q.send(payload.clone()).await.unwrap();
                if tx.send((seq, payload)).is_err() {
                    return;
                }
            }
        });
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    while let Some((seq, payload)) = rx.recv().await {
        writeln!(out, "ACK {seq} {payload}").unwrap();
        out.flush().unwrap();
    }
}

fn crash_and_check(mode: &str) {
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    let mut child =
        spawn_helper("helper_send_until_killed", &[("ROCKQ_CRASH_PATH", &path), ("ROCKQ_CRASH_MODE", mode)]);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut acknowledged = Vec::new();
    let mut line = String::new();
    while acknowledged.len() < 300 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "helper exited early");
        // libtest prints its own text too (without a newline before the first of ours); our
        // records are "ACK <seq> <payload>".
        let Some(at) = line.find("ACK ") else { continue };
        let Some((seq, payload)) = line[at + 4..].trim().split_once(' ') else { continue };
        let Ok(seq) = seq.parse::<u64>() else { continue };
        acknowledged.push((seq, payload.to_owned()));
    }
    child.kill().unwrap(); // SIGKILL: no shutdown, no destructors.
    child.wait().unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let broker = open(dir.path()).await;
        let q = broker.queue("crash").await.unwrap();
        let last = q.last_seq();
        assert!(last >= acknowledged.iter().map(|a| a.0).max().unwrap());
        let mut sub = q.group("check").unwrap().read_batch(1000).subscribe().await.unwrap();
        let all = take(&mut sub, last as usize).await;
        // Dense: every sequence from 1 to last is present, in order.
        assert!(all.iter().map(|d| d.seq()).eq(1..=last));
        for (seq, payload) in &acknowledged {
            let d = &all[(*seq - 1) as usize];
            assert_eq!(d.payload().as_ref(), payload.as_bytes(), "resolved send {seq} lost or changed");
        }
        // The next send continues after the recovered tail: no reuse.
        assert_eq!(q.send("after").await.unwrap(), last + 1);
        drop(all);
        broker.shutdown().await.unwrap();
    });
}

#[test]
fn resolved_sends_survive_a_process_crash_in_fsync_mode() {
    crash_and_check("fsync");
}

#[test]
fn resolved_sends_survive_a_process_crash_in_buffered_mode() {
    crash_and_check("buffered");
}
