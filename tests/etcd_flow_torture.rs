//! Flows across instances under kills (issue 32): two rockq processes run the pools of a flow's
//! children and of its parents on one etcd namespace while this process submits flows and,
//! cycle after cycle, SIGKILLs one of them (and starts it again). A killed process may have
//! written a step's ack and its flow change without applying it; the other process (or the
//! restarted one) applies it. At the end every flow has succeeded, and each step ran its effect
//! exactly once: each handler counts its runs in a keyspace in the transaction that acks its
//! job, each parent checks it read every child's result, and each step's message was sent once.
//!
//! Nothing here waits on time to decide a result: the kills land at random points (the seed is
//! printed), and the checks read what etcd holds after the pools drained.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::time::Duration;

use rockq::{Broker, EtcdOptions, FlowState, Queue, RetryPolicy, StepState, WorkGroup};

use common::{HANG_GUARD, HelperProcess, Rng};

const NS: &str = "flowtorture";
const CYCLES: u64 = 30;
const FLOWS_PER_CYCLE: u64 = 5;
const KIDS: usize = 4;

/// A group as every process builds it: short leases, so a killed process's jobs come back
/// within the run; attempts never run out (a kill counts one).
fn group(q: &Queue, name: &str) -> WorkGroup {
    q.work_group(name).expect("group").lease(Duration::from_secs(2)).retry_policy(
        RetryPolicy::default()
            .max_attempts(1_000_000)
            .backoff(Duration::from_millis(1), Duration::from_millis(50)),
    )
}

/// One process: pools for the children (each counts its run under `k:<flow>/<step>` and
/// returns its step as its result) and for the parents and `finally` steps (counting under
/// `p:<flow>` and `f:<flow>`; a parent counts under `bad:<flow>` instead if it did not read
/// every child's result), each count in the transaction that acks the job. Prints `@ready`
/// once its pools run; runs until SIGKILLed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of the flow kill torture"]
async fn flow_helper_process() {
    let Ok(endpoints) = std::env::var("ROCKQ_ETCD_ENDPOINTS") else { return };
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let broker = Broker::connect_etcd(endpoints, NS, EtcdOptions::new()).await.expect("connect");
    let effects = broker.kv("effects").await.expect("keyspace");
    let kids = broker.queue("kids").await.expect("queue");
    let parents = broker.queue("parents").await.expect("queue");
    let counts = effects.clone();
    let _kids = group(&kids, "k").workers(4).spawn(move |task: rockq::Task| {
        let effects = counts.clone();
        async move {
            let at = task.flow_step().expect("a flow step");
            task.set_result(at.step.to_string())?;
            count(&task, &effects, format!("k:{}/{}", at.flow, at.step)).await
        }
    });
    let _parents = group(&parents, "p").workers(4).spawn(move |task: rockq::Task| {
        let effects = effects.clone();
        async move {
            let at = task.flow_step().expect("a flow step");
            let key = if task.payload().as_ref() == b"parent" {
                let deps = task.flow_dependencies().await?;
                let results: Vec<_> = deps.iter().map(|d| d.state.result().cloned()).collect();
                let want: Vec<_> = (0..KIDS).map(|i| Some(rockq::Bytes::from(i.to_string()))).collect();
                if results == want { format!("p:{}", at.flow) } else { format!("bad:{}", at.flow) }
            } else {
                format!("f:{}", at.flow)
            };
            count(&task, &effects, key).await
        }
    });
    println!("@ready");
    futures::future::pending::<()>().await;
}

/// Increments `key` and acks `task`, in one transaction.
async fn count(
    task: &rockq::Task,
    effects: &rockq::Keyspace,
    key: String,
) -> Result<(), rockq::HandlerError> {
    let tx = task.tx();
    let cur = tx.get_for_update(effects, &key).await?;
    let n: u64 = cur.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().expect("a count"));
    tx.put(effects, &key, (n + 1).to_string())?;
    Ok(())
}

/// A helper process running the pools.
fn worker(endpoints: &str) -> HelperProcess {
    HelperProcess::start("flow_helper_process", &[("ROCKQ_ETCD_ENDPOINTS", endpoints)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flow_step_runs_once_while_its_processes_are_killed() {
    let cluster = etcd::Cluster::start(1).await;
    let endpoints = cluster.endpoints().join(",");
    let mut rng = Rng::from_clock();
    let cycles: u64 =
        std::env::var("ROCKQ_TORTURE_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(CYCLES);

    // This process submits and checks; its broker runs no pool and lives through every kill.
    let broker = Broker::connect_etcd(cluster.endpoints(), NS, EtcdOptions::new()).await.expect("connect");
    let kids = group(&broker.queue("kids").await.unwrap(), "k");
    let parents = group(&broker.queue("parents").await.unwrap(), "p");
    let mut workers = [worker(&endpoints), worker(&endpoints)];
    for w in &workers {
        w.wait_ready().await;
    }
    let mut ids = Vec::new();
    for _ in 0..cycles {
        for _ in 0..FLOWS_PER_CYCLE {
            let mut flow = broker.flow();
            let steps: Vec<_> = (0..KIDS).map(|i| flow.job(&kids, format!("kid {i}")).unwrap()).collect();
            flow.then(&parents, "parent", &steps).unwrap();
            flow.finally(&parents, "finally", &steps).unwrap();
            ids.push(flow.submit().await.unwrap().id);
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.next(200))).await;
        let i = rng.next(2) as usize;
        workers[i].kill();
        workers[i] = worker(&endpoints);
        // Half the time the next kill may land while it is still starting.
        if rng.next(2) == 0 {
            workers[i].wait_ready().await;
        }
    }
    println!("{cycles} cycles, {} flows, a process killed in each", ids.len());

    // Every flow runs to its end.
    let deadline = tokio::time::Instant::now() + HANG_GUARD * 2;
    for &id in &ids {
        loop {
            let s = broker.flow_status(id).await.unwrap();
            if s.state == FlowState::Succeeded {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "flow {id} never finished: {:?}", s.tally());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for w in &mut workers {
        w.kill();
    }

    // Each step's effect exactly once, each parent with every child's result.
    let effects = broker.kv("effects").await.unwrap();
    for &id in &ids {
        let mut keys: Vec<String> = (0..KIDS).map(|k| format!("k:{id}/{k}")).collect();
        keys.extend([format!("p:{id}"), format!("f:{id}")]);
        for key in keys {
            let n = effects.get(&key).await.unwrap().map(|e| String::from_utf8_lossy(&e.value).into_owned());
            assert_eq!(n.as_deref(), Some("1"), "{key}: run once");
        }
        assert!(
            effects.get(format!("bad:{id}")).await.unwrap().is_none(),
            "flow {id}'s parent missed a result"
        );
        let status = broker.flow_status(id).await.unwrap();
        assert!(status.steps.iter().all(|s| matches!(s.state, StepState::Succeeded { .. })));
    }
    // Each step's message sent once: the queues hold exactly one message per step (their
    // tails as etcd holds them).
    let n = ids.len() as u64;
    let stats = broker.stats().await.unwrap();
    let tail = |name: &str| stats.queues.iter().find(|q| q.name == name).map_or(0, |q| q.last_seq);
    assert_eq!(tail("kids"), n * KIDS as u64, "one message per child");
    assert_eq!(tail("parents"), n * 2, "one parent and one finally per flow");
    broker.shutdown().await.unwrap();
}
