//! Flows under `kill -9`: a fan-out of 10,000 children (some failing an attempt first) with a
//! parent `then` all of them and a `finally` callback, and a batch of 200 in which some children
//! are dead-lettered, with its own `then` and `finally`. Pools run every step in a child
//! process that is SIGKILLed at random moments, in Fsync mode; the parent and callback handlers
//! count their runs in a keyspace in the transaction that acks them. At the end: the parent ran
//! exactly once and saw every child's result, each callback ran exactly once, the failed
//! batch's `then` never ran, and each step's message was sent exactly once.

mod common;

use std::time::Duration;

use common::*;
use rockq::{Durability, FlowState, HandlerError, Options, RetryPolicy, StepState, Task};

fn children() -> u64 {
    std::env::var("ROCKQ_FL_CHILDREN").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000)
}
const BATCH: u64 = 200;

/// Whether child `i` of the fan-out fails its first attempt, and whether batch child `i` is
/// dead-lettered: fixed, so the parent knows what to expect.
fn flaky(i: u64) -> bool {
    i % 7 == 3
}
fn doomed(i: u64) -> bool {
    i % 50 == 7
}

fn num(e: Option<rockq::Entry>) -> u64 {
    e.map_or(0, |e| String::from_utf8_lossy(&e.value).parse().expect("a number"))
}

async fn open_fsync(path: &str) -> rockq::Broker {
    Options::new()
        .durability(Durability::Fsync)
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(path)
        .await
        .expect("open")
}

async fn groups(broker: &rockq::Broker) -> (rockq::WorkGroup, rockq::WorkGroup) {
    {
        let policy = RetryPolicy::default()
            .max_attempts(1_000)
            .backoff(Duration::from_millis(1), Duration::from_millis(4));
        let kids = broker
            .queue("kids")
            .await
            .unwrap()
            .work_group("k")
            .unwrap()
            .lease(Duration::from_secs(2))
            .retry_policy(policy.clone())
            .dead_letter_queue("kids.dlq");
        let steps = broker
            .queue("steps")
            .await
            .unwrap()
            .work_group("s")
            .unwrap()
            .lease(Duration::from_secs(2))
            .retry_policy(policy);
        (kids, steps)
    }
}

/// Child: runs the pools until killed, or with `ROCKQ_FL_DRAIN` until both flows are settled,
/// then prints `DONE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by a test in a child process"]
async fn helper_flows() {
    let Ok(path) = std::env::var("ROCKQ_FL_PATH") else { return };
    let drain = std::env::var("ROCKQ_FL_DRAIN").is_ok();
    let broker = open_fsync(&path).await;
    let (kids, steps) = groups(&broker).await;
    let runs = broker.kv("runs").await.unwrap();
    println!("READY");
    let kid_pool = kids.workers(4).spawn(|task: Task| async move {
        let text = String::from_utf8_lossy(task.payload()).into_owned();
        let (kind, i) = text.split_once(':').unwrap();
        let i: u64 = i.parse().unwrap();
        if kind == "batch" && doomed(i) {
            return Err(HandlerError::dead_letter("doomed"));
        }
        if kind == "fan" && flaky(i) && task.attempt() == 1 {
            return Err(HandlerError::retry("flaky"));
        }
        task.set_result(format!("r{i}"))?;
        Ok(())
    });
    let step_pool = steps.workers(2).spawn(move |task: Task| {
        let runs = runs.clone();
        async move {
            let name = String::from_utf8_lossy(task.payload()).into_owned();
            let mut all_results = true;
            if name == "parent" {
                let deps = task.flow_dependencies().await?;
                all_results = deps.len() as u64 == children()
                    && deps.iter().all(|d| match &d.state {
                        StepState::Succeeded { result: Some(r), .. } => {
                            r.as_ref() == format!("r{}", d.step).as_bytes()
                        }
                        _ => false,
                    });
            }
            let tx = task.tx();
            let n = num(tx.get_for_update(&runs, &name).await?);
            tx.put(&runs, &name, (n + 1).to_string())?;
            if !all_results {
                tx.put(&runs, "parent-saw-a-bad-result", "1")?;
            }
            Ok::<_, HandlerError>(())
        }
    });
    if drain {
        let ids: Vec<u64> =
            std::env::var("ROCKQ_FL_IDS").unwrap().split(',').map(|s| s.parse().unwrap()).collect();
        loop {
            let mut settled = true;
            for &id in &ids {
                settled &= broker.flow_status(id).await.unwrap().state != FlowState::Running;
            }
            if settled {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("DONE");
        step_pool.shutdown().await.unwrap();
        kid_pool.shutdown().await.unwrap();
        broker.shutdown().await.unwrap();
    } else {
        std::future::pending::<()>().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_flows_run_every_parent_and_callback_exactly_once() {
    let cycles: u64 = std::env::var("ROCKQ_FL_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(60);
    let dir = tempdir();
    let path = dir.path().to_str().unwrap().to_owned();
    let n = children();
    // The flows, submitted before any child process runs.
    let (fan_id, batch_id) = {
        let broker = open_fsync(&path).await;
        let (kids, steps) = groups(&broker).await;
        let mut fan = broker.flow();
        let mut all = Vec::new();
        for i in 0..n {
            all.push(fan.job(&kids, format!("fan:{i}")).unwrap());
        }
        fan.then(&steps, "parent", &all).unwrap();
        fan.finally(&steps, "fan-callback", &all).unwrap();
        let fan_id = fan.submit().await.unwrap().id;
        let mut batch = broker.flow();
        let jobs: Vec<_> = (0..BATCH).map(|i| batch.job(&kids, format!("batch:{i}")).unwrap()).collect();
        batch.then(&steps, "batch-success", &jobs).unwrap();
        batch.finally(&steps, "batch-callback", &jobs).unwrap();
        let batch_id = batch.submit().await.unwrap().id;
        broker.shutdown().await.unwrap();
        (fan_id, batch_id)
    };
    let mut rng = Rng::from_clock();
    kill_cycles("helper_flows", &[("ROCKQ_FL_PATH", &path)], cycles, 80, &mut rng);

    let ids = format!("{fan_id},{batch_id}");
    let drain = [("ROCKQ_FL_PATH", path.as_str()), ("ROCKQ_FL_DRAIN", "1"), ("ROCKQ_FL_IDS", &ids)];
    run_to_done("helper_flows", &drain, Duration::from_secs(300));

    let broker = open_fsync(&path).await;
    let runs = broker.kv("runs").await.unwrap();
    let ran = |name: &'static str| {
        let runs = runs.clone();
        async move { num(runs.get(name).await.unwrap()) }
    };
    let counts = (
        ran("parent").await,
        ran("fan-callback").await,
        ran("batch-success").await,
        ran("batch-callback").await,
    );
    println!("flows under kill -9: cycles {cycles}, children {n} + {BATCH}, runs {counts:?}");
    assert_eq!(counts, (1, 1, 0, 1), "parent, fan callback, failed batch's then, batch callback");
    assert_eq!(ran("parent-saw-a-bad-result").await, 0, "the parent saw every child's result");
    // Each step message sent once: the parent and the two callbacks.
    assert_eq!(broker.queue("steps").await.unwrap().last_seq(), 3, "no step was sent twice");
    assert_eq!(broker.queue("kids").await.unwrap().last_seq(), n + BATCH);
    assert_eq!(broker.flow_status(fan_id).await.unwrap().state, FlowState::Succeeded);
    let batch = broker.flow_status(batch_id).await.unwrap();
    assert_eq!(batch.state, FlowState::Failed);
    let dead = batch.steps.iter().filter(|s| matches!(s.state, StepState::Failed { .. })).count() as u64;
    assert_eq!(dead, (0..BATCH).filter(|&i| doomed(i)).count() as u64);
    broker.shutdown().await.unwrap();
}
