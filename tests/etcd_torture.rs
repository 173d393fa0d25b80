//! The exactly-once pipeline across instances under kills (issue 32, point 4): on a real
//! 3-member etcd cluster, two rockq processes run worker pools whose handlers consume a job,
//! update the keyspace and send a message in one transaction, while this process produces and,
//! cycle after cycle, SIGKILLs one of them (and starts it again) or SIGKILLs the etcd leader
//! (and starts that member again once another leads); then the whole cluster is killed for 10 s
//! and started again under the running processes. At the end every input's effect is there
//! exactly once: one keyspace increment and one output message per input sequence, whichever
//! process ran it, however many times it was started.
//!
//! Nothing here waits on time to decide a result: the kills land at random points (the seed is
//! printed), and the checks read what etcd holds after the pools drained.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, EtcdOptions, Queue, RetryPolicy, WorkGroup};

use common::{HANG_GUARD, HelperProcess, Rng};

const NS: &str = "torture";
/// Kill cycles: each one produces a batch, lets the pools run for a random while, then kills.
const CYCLES: u64 = 100;
const PER_CYCLE: u64 = 20;

/// The group as every process builds it (its settings are shared through etcd): short leases,
/// so a killed process's jobs come back within the run; attempts never run out (a kill counts
/// one), so no input is dead-lettered instead of processed.
fn group(q: &Queue) -> WorkGroup {
    q.work_group("w").expect("group").lease(Duration::from_secs(2)).retry_policy(
        RetryPolicy::default()
            .max_attempts(1_000_000)
            .backoff(Duration::from_millis(1), Duration::from_millis(50)),
    )
}

/// One pipeline process: a pool of 4 workers whose handler reads the input's counter for
/// update, writes it incremented, sends the input's sequence to `out` and acks the job, all in
/// one transaction. Prints `@ready` once its pool runs; runs until SIGKILLed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of the kill torture"]
async fn pipeline_helper_process() {
    let Ok(endpoints) = std::env::var("ROCKQ_ETCD_ENDPOINTS") else { return };
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let broker = Broker::connect_etcd(endpoints, NS, EtcdOptions::new()).await.expect("connect");
    let input = broker.queue("in").await.expect("queue in");
    let out = broker.queue("out").await.expect("queue out");
    let effects = broker.kv("effects").await.expect("keyspace");
    let _pool = group(&input).workers(4).spawn(move |task: rockq::Task| {
        let (out, effects) = (out.clone(), effects.clone());
        async move {
            let tx = task.tx();
            let key = format!("n:{}", task.seq());
            let cur = tx.get_for_update(&effects, &key).await?;
            let n: u64 = cur.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().expect("a count"));
            tx.put(&effects, &key, (n + 1).to_string())?;
            tx.send(&out, task.seq().to_string())?;
            Ok::<_, rockq::HandlerError>(())
        }
    });
    println!("@ready");
    futures::future::pending::<()>().await;
}

/// A helper process running the pools.
fn worker(endpoints: &str) -> HelperProcess {
    HelperProcess::start("pipeline_helper_process", &[("ROCKQ_ETCD_ENDPOINTS", endpoints)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exactly_once_pipeline_survives_kills_of_its_processes_and_of_the_etcd_leader() {
    let mut cluster = etcd::Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let mut rng = Rng::from_clock();
    let cycles: u64 =
        std::env::var("ROCKQ_TORTURE_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(CYCLES);

    // This process produces and checks; its broker lives through every kill.
    let broker = Broker::connect_etcd(cluster.endpoints(), NS, EtcdOptions::new()).await.expect("connect");
    let input = broker.queue("in").await.unwrap();
    // The group exists before the first input (nothing is trimmed before it is consumed).
    drop(group(&input).subscribe().await.unwrap());

    let mut workers = [worker(&endpoints), worker(&endpoints)];
    for w in &workers {
        w.wait_ready().await;
    }
    let (mut process_kills, mut leader_kills, mut failed_sends) = (0u64, 0u64, 0u64);
    for cycle in 0..cycles {
        // A send that fails (during an election) may still be stored: then it is one more
        // input like the others, which the checks find by reading the queue's tail.
        let batch: Vec<String> = (0..PER_CYCLE).map(|i| format!("c{cycle}-{i}")).collect();
        if let Err(e) = input.send_batch(batch).await {
            eprintln!("cycle {cycle}: send failed: {e}");
            failed_sends += 1;
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.next(200))).await;
        if rng.next(8) == 0 {
            let leader = cluster.wait_for_leader(HANG_GUARD).await;
            cluster.members[leader].kill();
            cluster.wait_for_leader(HANG_GUARD).await;
            cluster.members[leader].restart();
            leader_kills += 1;
        } else {
            let i = rng.next(2) as usize;
            workers[i].kill();
            workers[i] = worker(&endpoints);
            // Half the time the next kill may land while it is still starting.
            if rng.next(2) == 0 {
                workers[i].wait_ready().await;
            }
            process_kills += 1;
        }
    }
    println!(
        "{cycles} cycles: {process_kills} process kills, {leader_kills} leader kills, {failed_sends} failed sends"
    );
    assert!(leader_kills > 0 && process_kills > 0, "both kinds of kill happened");

    // Then the whole cluster down for 10 s and back. A send meanwhile fails clearly (a
    // transient storage error, after `request_timeout`) — or, sent again by the caller, may
    // turn out stored: one more input. The pipeline processes are left alone: they resume on
    // their own.
    for w in &workers {
        w.wait_ready().await;
    }
    let down = tokio::time::Instant::now();
    for m in &mut cluster.members {
        m.kill();
    }
    match input.send("during the outage").await {
        Err(e) => assert!(e.storage_error().is_some_and(|s| s.is_transient()), "{e:?}"),
        Ok(seq) => panic!("a send resolved with every member down (seq {seq})"),
    }
    tokio::time::sleep_until(down + Duration::from_secs(10)).await;
    for m in &mut cluster.members {
        m.restart();
    }
    let back = tokio::time::Instant::now();
    cluster.wait_for_leader(HANG_GUARD).await;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while let Err(e) = input.send_batch((0..PER_CYCLE).map(|i| format!("after-{i}"))).await {
        assert!(tokio::time::Instant::now() < deadline, "sends never resumed: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("after the outage: a send resolved {:?} after the members were started", back.elapsed());

    // Both processes run to the end: the group's offset, as etcd holds it, reaches the tail.
    let stats = |s: &rockq::Stats| {
        let tail = s.queues.iter().find(|q| q.name == "in").map_or(0, |q| q.last_seq);
        let committed = s.groups.iter().find(|g| g.group == "w").map_or(0, |g| g.committed);
        (tail, committed)
    };
    let deadline = tokio::time::Instant::now() + HANG_GUARD * 2;
    let tail = loop {
        let (tail, committed) = stats(&broker.stats().await.unwrap());
        if tail > 0 && committed == tail {
            break tail;
        }
        assert!(tokio::time::Instant::now() < deadline, "the pools never drained: {committed} of {tail}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("drained {:?} after the members were started", back.elapsed());
    for w in &mut workers {
        w.kill();
    }
    assert!(tail >= (cycles - failed_sends + 1) * PER_CYCLE, "every resolved send is an input");

    // Each input's effect, exactly once: its counter is 1, and `out` holds its sequence once.
    let effects = broker.kv("effects").await.unwrap();
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut scan = effects.scan::<&[u8], _>(..);
    while let Some(e) = scan.next().await {
        let e = e.unwrap();
        let key = String::from_utf8(e.key.to_vec()).unwrap();
        let seq: u64 = key.strip_prefix("n:").expect("an input's key").parse().unwrap();
        counts.insert(seq, String::from_utf8_lossy(&e.value).parse().unwrap());
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "inputs whose effect applied more than once: {twice:?}");
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        (1..=tail).collect::<Vec<_>>(),
        "every input's effect"
    );
    let sent = broker.peek("out", None, 100_000).await.unwrap();
    let mut outputs: Vec<u64> =
        sent.iter().map(|m| std::str::from_utf8(&m.payload).unwrap().parse().unwrap()).collect();
    outputs.sort_unstable();
    assert_eq!(outputs, (1..=tail).collect::<Vec<_>>(), "one output per input");
    assert_eq!(broker.dead_letters("in.dlq").await.unwrap().len().await.unwrap(), 0, "nothing dead-lettered");
    broker.shutdown().await.unwrap();
}
