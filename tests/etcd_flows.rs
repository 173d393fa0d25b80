//! Flows on the etcd engine, across processes (two brokers on one namespace, as two instances
//! of a service), against a real etcd: a flow submitted by one process moves on as any
//! process's workers finish its steps; a parent is sent exactly once however the children's
//! acks race between processes; a flow larger than one etcd transaction is written and moved
//! in parts (its failure and redrive too); a flow too large for etcd is refused before
//! anything is written. The single-process semantics are `tests/flows.rs`, which
//! `scripts/etcd-semantics.sh` runs against etcd; a change left by a stopped process is
//! `tests/etcd_faults.rs`. Each test starts its own etcd on loopback ports chosen at run time
//! and stops it by its pid.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rockq::{Broker, Bytes, EtcdOptions, FlowState, StepState, Task};

use common::HANG_GUARD;

async fn connect(cluster: &etcd::Cluster, ns: &str) -> Broker {
    let opts = EtcdOptions::new().options(rockq::Options::new().metrics_interval(Duration::ZERO));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

/// Polls `check` (bounded by the hang guard) until it holds.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Broker `a` submits six children and a parent after them (and a `finally` step); both
/// brokers' pools run the children, each returning a result; broker `b` runs the parent,
/// whose handler reads the six results through `flow_dependencies`. The parent is sent once,
/// and `a` reads the flow succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_moves_on_as_any_process_finishes_its_steps() {
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "flows").await, connect(&cluster, "flows").await);
    let resize = a.queue("images").await.unwrap().work_group("resize").unwrap();
    let build = a.queue("albums").await.unwrap().work_group("build").unwrap();
    let mut flow = a.flow();
    let kids: Vec<_> = (0..6).map(|i| flow.job(&resize, format!("img-{i}")).unwrap()).collect();
    let parent = flow.then(&build, "album", &kids).unwrap();
    let done = flow.finally(&build, "cleanup", &kids).unwrap();
    let submitted = flow.submit().await.unwrap();
    assert_eq!(submitted.sent.len(), 6);
    let ran: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut pools = Vec::new();
    for broker in [&a, &b] {
        let group = broker.queue("images").await.unwrap().work_group("resize").unwrap();
        let ran = ran.clone();
        pools.push(group.workers(3).spawn(move |task: Task| {
            let ran = ran.clone();
            async move {
                let name = String::from_utf8_lossy(task.payload()).into_owned();
                *ran.lock().unwrap().entry(name.clone()).or_default() += 1;
                task.set_result(format!("thumb of {name}"))?;
                Ok(())
            }
        }));
    }
    let results: Arc<Mutex<Vec<Vec<Option<Bytes>>>>> = Arc::default();
    let bbuild = b.queue("albums").await.unwrap().work_group("build").unwrap();
    let seen = results.clone();
    pools.push(bbuild.workers(2).spawn(move |task: Task| {
        let seen = seen.clone();
        async move {
            if task.payload().as_ref() == b"album" {
                let deps = task.flow_dependencies().await?;
                seen.lock().unwrap().push(deps.iter().map(|d| d.state.result().cloned()).collect());
            }
            Ok(())
        }
    }));
    let id = submitted.id;
    until("the flow succeeded", || {
        let a = a.clone();
        async move { a.flow_status(id).await.unwrap().state == FlowState::Succeeded }
    })
    .await;
    for p in pools {
        p.shutdown().await.unwrap();
    }
    let want: Vec<Option<Bytes>> = (0..6).map(|i| Some(Bytes::from(format!("thumb of img-{i}")))).collect();
    assert_eq!(*results.lock().unwrap(), vec![want], "the parent ran once and read every result");
    assert_eq!(a.queue("albums").await.unwrap().last_seq(), 2, "the parent and the finally step, once each");
    let status = b.flow_status(id).await.unwrap();
    for step in [parent, done] {
        assert!(
            matches!(status.steps[step.index() as usize].state, StepState::Succeeded { .. }),
            "{:?}",
            status.steps[step.index() as usize]
        );
    }
    assert!(ran.lock().unwrap().values().all(|&n| n == 1), "each child ran once: {:?}", ran.lock().unwrap());
    assert_eq!(b.flows(0, 10).await.unwrap(), vec![id]);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Twenty flows of eight children and a parent, the children acked by two processes' pools at
/// once: each process applies the changes its acks wrote while the other applies its own, to
/// the same flows. Every parent is sent exactly once, and every flow ends succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acks_in_two_processes_send_each_parent_once() {
    const FLOWS: usize = 20;
    const KIDS: usize = 8;
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "race").await, connect(&cluster, "race").await);
    let work = a.queue("work").await.unwrap().work_group("w").unwrap();
    let parents = a.queue("parents").await.unwrap().work_group("p").unwrap();
    let mut ids = Vec::new();
    for f in 0..FLOWS {
        let mut flow = a.flow();
        let kids: Vec<_> = (0..KIDS).map(|k| flow.job(&work, format!("{f}/{k}")).unwrap()).collect();
        flow.then(&parents, format!("parent {f}"), &kids).unwrap();
        ids.push(flow.submit().await.unwrap().id);
    }
    let mut pools = Vec::new();
    for broker in [&a, &b] {
        let group = broker.queue("work").await.unwrap().work_group("w").unwrap();
        pools.push(group.workers(4).spawn(|_task: Task| async move { Ok(()) }));
    }
    let pq = a.queue("parents").await.unwrap();
    until("every parent was sent", || {
        let pq = pq.clone();
        async move { pq.last_seq() >= FLOWS as u64 }
    })
    .await;
    for p in pools {
        p.shutdown().await.unwrap();
    }
    // Every change applied (none left pending), and no parent sent twice.
    for &id in &ids {
        let a = a.clone();
        until("the flow's changes applied", || {
            let a = a.clone();
            async move {
                let s = a.flow_status(id).await.unwrap();
                matches!(s.steps[KIDS].state, StepState::Queued { .. })
                    && s.steps[..KIDS].iter().all(|k| matches!(k.state, StepState::Succeeded { .. }))
            }
        })
        .await;
    }
    assert_eq!(pq.last_seq(), FLOWS as u64, "one parent per flow");
    let mut sub = parents.subscribe().await.unwrap();
    let mut payloads = Vec::new();
    for _ in 0..FLOWS {
        let j = common::next_job(&mut sub).await;
        payloads.push(String::from_utf8_lossy(j.payload()).into_owned());
        j.ack_durable().await.unwrap();
    }
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), FLOWS, "each flow's own parent");
    for &id in &ids {
        assert_eq!(b.flow_status(id).await.unwrap().state, FlowState::Succeeded);
    }
    drop(sub);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A flow larger than one etcd transaction (421 steps: 120 first steps, a parent after all
/// of them, a chain of 300 after the parent) is submitted in parts and its first steps sent
/// over several transactions, in step order, before the submit returns; two processes' pools
/// run the children, the parent is sent once and reads all 120 results; the chain runs to its
/// end, each step with the largest result a step may have, so the flow's records (~5 MiB)
/// pass the client's 4 MiB answer: its status is read in pages. Every move of it reads only
/// the steps it touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_larger_than_one_transaction_is_written_in_parts_and_runs_to_its_end() {
    const KIDS: usize = 120;
    const CHAIN: usize = 300;
    let cluster = etcd::Cluster::start(1).await;
    let (a, b) = (connect(&cluster, "large").await, connect(&cluster, "large").await);
    let kids_q = a.queue("kids").await.unwrap();
    let chain_q = a.queue("chain").await.unwrap();
    let kids_g = kids_q.work_group("k").unwrap();
    let chain_g = chain_q.work_group("c").unwrap();
    let mut flow = a.flow();
    let kids: Vec<_> = (0..KIDS).map(|i| flow.job(&kids_g, format!("kid {i}")).unwrap()).collect();
    let parent = flow.then(&chain_g, "parent", &kids).unwrap();
    let mut last = parent;
    for i in 0..CHAIN {
        last = flow.then(&chain_g, format!("link {i}"), &[last]).unwrap();
    }
    let submitted = flow.submit().await.unwrap();
    let id = submitted.id;
    let want: Vec<u64> = (1..=KIDS as u64).collect();
    assert_eq!(
        submitted.sent.iter().map(|(_, seq)| *seq).collect::<Vec<_>>(),
        want,
        "every first step, in order"
    );
    for (k, step) in kids.iter().enumerate() {
        assert_eq!(submitted.seq_of(*step), Some(k as u64 + 1));
    }
    assert_eq!(kids_q.last_seq(), KIDS as u64);
    assert_eq!(chain_q.last_seq(), 0, "nothing after the children is sent yet");

    let mut pools = Vec::new();
    for broker in [&a, &b] {
        let group = broker.queue("kids").await.unwrap().work_group("k").unwrap();
        pools.push(group.workers(4).spawn(|task: Task| async move {
            let name = String::from_utf8_lossy(task.payload()).into_owned();
            task.set_result(format!("done {name}"))?;
            Ok(())
        }));
    }
    let mut sub = b.queue("chain").await.unwrap().work_group("c").unwrap().subscribe().await.unwrap();
    let j = common::next_job(&mut sub).await;
    assert_eq!(j.payload(), &Bytes::from_static(b"parent"));
    let deps = j.flow_dependencies().await.unwrap();
    let results: Vec<_> = deps.iter().map(|d| d.state.result().cloned()).collect();
    let expected: Vec<_> = (0..KIDS).map(|i| Some(Bytes::from(format!("done kid {i}")))).collect();
    assert_eq!(results, expected, "the parent reads every child's result");
    j.ack_durable().await.unwrap();
    for p in pools {
        p.shutdown().await.unwrap();
    }
    for i in 0..CHAIN {
        let j = common::next_job(&mut sub).await;
        assert_eq!(j.payload(), &Bytes::from(format!("link {i}")));
        j.set_result(vec![b'r'; rockq::MAX_ETCD_STEP_RESULT_BYTES]).unwrap();
        j.ack_durable().await.unwrap();
    }
    until("the flow succeeded", || {
        let a = a.clone();
        async move { a.flow_status(id).await.unwrap().state == FlowState::Succeeded }
    })
    .await;
    let status = b.flow_status(id).await.unwrap();
    assert_eq!(status.steps.len(), KIDS + 1 + CHAIN);
    assert!(status.steps.iter().all(|s| matches!(s.state, StepState::Succeeded { .. })));
    assert_eq!(
        status.steps[last.index() as usize].state.result().map(|r| r.len()),
        Some(rockq::MAX_ETCD_STEP_RESULT_BYTES)
    );
    assert_eq!(chain_q.last_seq(), 1 + CHAIN as u64, "the parent and each link, once");
    assert_eq!(kids_q.last_seq(), KIDS as u64, "each child once");
    drop(sub);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A large flow's failure and its redrive cross transactions too: a root before a chain of
/// 200 steps is dead-lettered, and every step of the chain ends blocked (200 records, more
/// than a transaction holds); the root's dead letter redriven, the chain waits again, and
/// the root's ack sends its first link.
#[tokio::test]
async fn a_large_flows_failure_blocks_every_step_and_a_redrive_revives_them() {
    const CHAIN: usize = 200;
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "blocked").await;
    let q = broker.queue("jobs").await.unwrap();
    let w = q
        .work_group("w")
        .unwrap()
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1))
        .dead_letter_queue("jobs.dlq");
    let mut flow = broker.flow();
    let root = flow.job(&w, "root").unwrap();
    let mut chain = Vec::new();
    let mut last = root;
    for i in 0..CHAIN {
        last = flow.then(&w, format!("link {i}"), &[last]).unwrap();
        chain.push(last);
    }
    let id = flow.submit().await.unwrap().id;
    let mut sub = w.subscribe().await.unwrap();
    common::next_job(&mut sub).await.dead_letter_durable("bad input").await.unwrap();
    until("every link is blocked", || {
        let broker = broker.clone();
        let chain = chain.clone();
        async move {
            let status = broker.flow_status(id).await.unwrap();
            chain.iter().all(|s| matches!(status.steps[s.index() as usize].state, StepState::Blocked { .. }))
        }
    })
    .await;
    assert_eq!(broker.flow_status(id).await.unwrap().state, FlowState::Failed);
    let dlq = broker.dead_letters("jobs.dlq").await.unwrap();
    let letter = dlq.list(10).await.unwrap().pop().expect("the dead root");
    dlq.redrive_one(letter.dlq_seq, None).await.unwrap();
    until("every link waits again", || {
        let broker = broker.clone();
        let chain = chain.clone();
        async move {
            let status = broker.flow_status(id).await.unwrap();
            chain.iter().all(|s| {
                matches!(status.steps[s.index() as usize].state, StepState::Waiting { failed: 0, .. })
            })
        }
    })
    .await;
    let j = common::next_job(&mut sub).await;
    assert_eq!(j.payload(), &Bytes::from_static(b"root"));
    j.ack_durable().await.unwrap();
    let j = common::next_job(&mut sub).await;
    assert_eq!(j.payload(), &Bytes::from_static(b"link 0"));
    assert_eq!(broker.flow_status(id).await.unwrap().state, FlowState::Running);
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// A flow too large for etcd is refused before anything is written: a step message over
/// 32 KiB in a flow that does not fit one transaction, or a worklist (dependency entries and
/// first steps) over 8,000. The same message in a flow that does fit is accepted.
#[tokio::test]
async fn a_large_flow_with_a_large_step_message_or_worklist_is_refused_and_writes_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let broker = connect(&cluster, "refused").await;
    let q = broker.queue("jobs").await.unwrap();
    let w = q.work_group("w").unwrap();
    let build = |n: usize| {
        let mut flow = broker.flow();
        let first = flow.job(&w, vec![b'x'; 40 << 10]).unwrap();
        let mut last = first;
        for i in 1..n {
            last = flow.then(&w, format!("{i}"), &[last]).unwrap();
        }
        flow
    };
    let e = build(100).submit().await.unwrap_err();
    assert_eq!(e.unsupported().map(|u| u.engine()), Some("etcd"), "{e}");
    assert!(e.to_string().contains("flow"), "the refusal names the limit: {e}");
    assert_eq!(q.last_seq(), 0, "nothing was sent");
    assert!(broker.flows(0, 10).await.unwrap().is_empty(), "nothing was stored");
    // A fan-in whose worklist (4,001 children and as many dependency entries) passes 8,000.
    let mut wide = broker.flow();
    let kids: Vec<_> = (0..4_001).map(|i| wide.job(&w, format!("{i}")).unwrap()).collect();
    wide.then(&w, "parent", &kids).unwrap();
    let e = wide.submit().await.unwrap_err();
    assert_eq!(e.unsupported().map(|u| u.engine()), Some("etcd"), "{e}");
    assert_eq!(q.last_seq(), 0, "nothing was sent");
    assert!(broker.flows(0, 10).await.unwrap().is_empty(), "nothing was stored");
    let submitted = build(10).submit().await.unwrap();
    assert_eq!(submitted.sent.len(), 1);
    assert_eq!(q.last_seq(), 1);
    broker.shutdown().await.unwrap();
}
