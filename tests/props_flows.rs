//! Model-based test of flows under a concurrency limit: random DAGs of steps (each after a
//! random set of earlier steps, `then` or `finally`) and plain jobs in one work group with
//! `concurrency_limit(3)`, claimed by four subscriptions, acked (with a result), dead-lettered
//! or dropped, the dead-letter queue redriven, and restarts — checked after every operation
//! against a small model that says, without the engine's bookkeeping:
//!
//! - which job a claim takes (the oldest one not finished and not held), and that none is
//!   taken while three are held (the next one shows as `Limited`);
//! - when a step becomes ready: a `then` step when every dependency succeeded, a `finally`
//!   step when every dependency finished (failed, or blocked behind a failure, counts); the
//!   steps that become ready are appended in the write that finished their last dependency,
//!   once each, as the next sequences of the queue;
//! - which steps are blocked (a `then` step with a failed or blocked dependency), and that a
//!   redriven dead letter queues its step again and unblocks what waited for it, while a
//!   `finally` step that ran is not sent again;
//! - every step's state, job, counts and result as `Broker::flow_status` reports them, and the
//!   flow's state.
//!
//! Embedded only: the etcd engine refuses flows (tests/etcd_engine.rs).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use proptest::prelude::*;
use rockq::{
    Broker, FlowState, Job, JobState, ManualClock, OutcomeKind, Redrive, StepState, WorkSubscription,
};

const LIMIT: usize = 3;
const SUBS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// A flow: per step, a bit set of earlier steps it runs after (none: sent at once) and
    /// whether it runs `finally` (after all finished) rather than `then`.
    Flow(Vec<(u8, bool)>),
    Send,
    /// Subscription `i % SUBS` claims, if it holds nothing.
    Claim(usize),
    Ack(usize),
    Dead(usize),
    Drop(usize),
    Redrive,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::collection::vec((any::<u8>(), any::<bool>()), 1..6).prop_map(Op::Flow),
        1 => Just(Op::Send),
        6 => any::<usize>().prop_map(Op::Claim),
        4 => any::<usize>().prop_map(Op::Ack),
        2 => any::<usize>().prop_map(Op::Dead),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => Just(Op::Redrive),
        1 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum S {
    Waiting,
    Queued(u64),
    Succeeded(u64),
    /// Dead-lettered as job `seq`.
    Failed(u64),
}

#[derive(Debug)]
struct StepM {
    after: Vec<u32>,
    finally: bool,
    state: S,
}

#[derive(Debug)]
struct FlowM {
    id: u64,
    steps: Vec<StepM>,
}

impl FlowM {
    /// Per step: failed, or a `then` step waiting behind a failed or blocked dependency.
    fn bad(&self) -> Vec<bool> {
        let mut bad = vec![false; self.steps.len()];
        for (i, s) in self.steps.iter().enumerate() {
            bad[i] = match s.state {
                S::Failed(_) => true,
                S::Waiting => !s.finally && s.after.iter().any(|&d| bad[d as usize]),
                _ => false,
            };
        }
        bad
    }

    fn blocked(&self, i: usize, bad: &[bool]) -> bool {
        self.steps[i].state == S::Waiting && bad[i]
    }

    /// Waiting steps whose dependencies are where they run: every one succeeded (`then`), or
    /// finished — succeeded, failed or blocked (`finally`).
    fn ready(&self) -> Vec<u32> {
        let bad = self.bad();
        let succeeded = |d: u32| matches!(self.steps[d as usize].state, S::Succeeded(_));
        (0..self.steps.len())
            .filter(|&i| {
                let s = &self.steps[i];
                s.state == S::Waiting
                    && if s.finally {
                        s.after.iter().all(|&d| succeeded(d) || bad[d as usize])
                    } else {
                        s.after.iter().all(|&d| succeeded(d))
                    }
            })
            .map(|i| i as u32)
            .collect()
    }

    fn state(&self) -> FlowState {
        let bad = self.bad();
        if self.steps.iter().all(|s| matches!(s.state, S::Succeeded(_))) {
            FlowState::Succeeded
        } else if self
            .steps
            .iter()
            .enumerate()
            .any(|(i, s)| matches!(s.state, S::Queued(_)) || (s.state == S::Waiting && !bad[i]))
        {
            FlowState::Running
        } else {
            FlowState::Failed
        }
    }
}

#[derive(Default, Debug)]
struct Model {
    last: u64,
    /// Jobs of the group not finished yet (acked or dead-lettered), by sequence.
    open: BTreeSet<u64>,
    /// The job each subscription holds.
    held: [Option<u64>; SUBS],
    /// Dead letters not redriven yet: the sequence each was dead-lettered as.
    dlq: Vec<u64>,
    flows: Vec<FlowM>,
    /// Which flow step each job is.
    step_of: BTreeMap<u64, (usize, u32)>,
}

impl Model {
    fn holding(&self) -> usize {
        self.held.iter().flatten().count()
    }

    /// The job the next claim takes, limit aside: the oldest open one nobody holds.
    fn next(&self) -> Option<u64> {
        let held: BTreeSet<u64> = self.held.iter().flatten().copied().collect();
        self.open.iter().copied().find(|s| !held.contains(s))
    }
}

struct Real {
    broker: Broker,
    subs: Vec<WorkSubscription>,
    jobs: Vec<Option<Job>>,
}

async fn group(broker: &Broker) -> rockq::WorkGroup {
    broker
        .queue("jobs")
        .await
        .unwrap()
        .work_group("w")
        .unwrap()
        .lease(Duration::from_secs(3600))
        .retry_policy(rockq::RetryPolicy::default().max_attempts(1_000_000))
        .concurrency_limit(LIMIT as u32)
        .read_batch(1)
        .max_in_flight(1)
}

async fn open_real(path: &std::path::Path, clock: &ManualClock) -> Real {
    let broker = rockq::Options::new()
        .clock(clock.clone())
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::ZERO)
        .open(path)
        .await
        .expect("open");
    let g = group(&broker).await;
    let mut subs = Vec::new();
    for _ in 0..SUBS {
        subs.push(g.subscribe().await.unwrap());
    }
    Real { broker, subs, jobs: (0..SUBS).map(|_| None).collect() }
}

/// After an operation that appended `fresh` sequences: the flow steps the model says became
/// ready (`released`: flow index, step) must be queued, each as one of those sequences, and use
/// each exactly once.
async fn bind_released(
    r: &Real,
    m: &mut Model,
    released: &[(usize, u32)],
    fresh: std::ops::RangeInclusive<u64>,
    ctx: &str,
) {
    let mut used = BTreeSet::new();
    for &(f, step) in released {
        let status = r.broker.flow_status(m.flows[f].id).await.unwrap();
        let StepState::Queued { seq } = status.steps[step as usize].state else {
            panic!(
                "{ctx}: flow {} step {step} should be queued: {:?}",
                m.flows[f].id, status.steps[step as usize]
            );
        };
        assert!(fresh.contains(&seq), "{ctx}: step sent as {seq}, outside {fresh:?}");
        assert!(used.insert(seq), "{ctx}: {seq} used twice");
        m.flows[f].steps[step as usize].state = S::Queued(seq);
        m.step_of.insert(seq, (f, step));
        m.open.insert(seq);
    }
    let expected: BTreeSet<u64> = fresh.clone().collect();
    assert_eq!(used, expected, "{ctx}: every new sequence is one step or letter, once");
    m.last = *fresh.end().max(&m.last);
}

/// Job `seq` was acked (`ok`) or dead-lettered: if it is a flow step, the step succeeded or
/// failed, and what became ready was sent in the same write.
async fn finish(r: &Real, m: &mut Model, seq: u64, ok: bool, ctx: &str) {
    m.open.remove(&seq);
    let Some(&(f, step)) = m.step_of.get(&seq) else { return };
    m.flows[f].steps[step as usize].state = if ok { S::Succeeded(seq) } else { S::Failed(seq) };
    let released = release(m, f);
    if !released.is_empty() {
        let fresh = m.last + 1..=m.last + released.len() as u64;
        bind_released(r, m, &released, fresh, ctx).await;
    }
}

/// Marks every ready step of flow `f` as released; returns them (their sequences come from
/// the engine, checked by [`bind_released`]).
fn release(m: &mut Model, f: usize) -> Vec<(usize, u32)> {
    let ready = m.flows[f].ready();
    // Placeholder until bound: not waiting any more.
    for &s in &ready {
        m.flows[f].steps[s as usize].state = S::Queued(0);
    }
    ready.into_iter().map(|s| (f, s)).collect()
}

/// Every flow as `flow_status` reports it, against the model.
async fn check_flows(r: &Real, m: &Model, ctx: &str) {
    for fm in &m.flows {
        let status = r.broker.flow_status(fm.id).await.unwrap();
        assert_eq!(status.steps.len(), fm.steps.len(), "{ctx}");
        let bad = fm.bad();
        for (i, (real, s)) in status.steps.iter().zip(&fm.steps).enumerate() {
            let at = format!("{ctx}: flow {} step {i}", fm.id);
            assert_eq!(real.after, s.after, "{at}");
            let ok = |d: &u32| matches!(fm.steps[*d as usize].state, S::Succeeded(_));
            let succeeded = s.after.iter().filter(|d| ok(d)).count() as u32;
            let failed = s.after.iter().filter(|d| bad[**d as usize]).count() as u32;
            let of = s.after.len() as u32;
            match (s.state, &real.state) {
                (S::Waiting, StepState::Blocked { failed: f, of: o }) if fm.blocked(i, &bad) => {
                    assert_eq!((*f, *o), (failed, of), "{at}");
                }
                (S::Waiting, StepState::Waiting { succeeded: sc, failed: f, of: o })
                    if !fm.blocked(i, &bad) =>
                {
                    assert_eq!((*sc, *f, *o), (succeeded, failed, of), "{at}");
                }
                (S::Queued(a), StepState::Queued { seq }) => assert_eq!(a, *seq, "{at}"),
                (S::Succeeded(a), StepState::Succeeded { seq, result, .. }) => {
                    assert_eq!(a, *seq, "{at}");
                    assert_eq!(
                        result.as_deref(),
                        Some(format!("r{a}").as_bytes()),
                        "{at}: the handler's result"
                    );
                }
                (S::Failed(a), StepState::Failed { seq, how: OutcomeKind::DeadLettered { .. }, .. }) => {
                    assert_eq!(a, *seq, "{at}");
                }
                (want, got) => {
                    panic!("{at}: model {want:?} (blocked {}), engine {got:?}", fm.blocked(i, &bad))
                }
            }
        }
        assert_eq!(status.state, fm.state(), "{ctx}: flow {}", fm.id);
    }
}

async fn run(ops: Vec<Op>) {
    let dir = tempdir();
    let clock = ManualClock::new();
    let mut r = open_real(dir.path(), &clock).await;
    let mut q = r.broker.queue("jobs").await.unwrap();
    let mut m = Model::default();
    for (n, op) in ops.into_iter().enumerate() {
        let ctx = format!("op {n} {op:?}");
        match op {
            Op::Flow(shape) => {
                let g = group(&r.broker).await;
                let mut flow = r.broker.flow();
                let mut handles = Vec::new();
                let mut steps = Vec::new();
                for (i, (mask, finally)) in shape.iter().enumerate() {
                    let after: Vec<u32> = (0..i as u32).filter(|d| mask & (1 << d) != 0).collect();
                    let deps: Vec<_> = after.iter().map(|&d| handles[d as usize]).collect();
                    let msg = format!("step {i}");
                    let h = if deps.is_empty() {
                        flow.job(&g, msg).unwrap()
                    } else if *finally {
                        flow.finally(&g, msg, &deps).unwrap()
                    } else {
                        flow.then(&g, msg, &deps).unwrap()
                    };
                    handles.push(h);
                    let finally = *finally && !after.is_empty();
                    steps.push(StepM { after, finally, state: S::Waiting });
                }
                let submitted = flow.submit().await.unwrap();
                m.flows.push(FlowM { id: submitted.id, steps });
                let f = m.flows.len() - 1;
                let released = release(&mut m, f);
                assert_eq!(submitted.sent.len(), released.len(), "{ctx}: the steps without dependencies");
                let fresh = m.last + 1..=m.last + released.len() as u64;
                if !released.is_empty() {
                    bind_released(&r, &mut m, &released, fresh, &ctx).await;
                }
            }
            Op::Send => {
                let seq = q.send("plain").await.unwrap();
                m.last += 1;
                assert_eq!(seq, m.last, "{ctx}");
                m.open.insert(seq);
            }
            Op::Claim(i) => {
                let i = i % SUBS;
                if m.held[i].is_some() {
                    continue;
                }
                let Some(next) = m.next() else { continue };
                if m.holding() >= LIMIT {
                    // Held back, not claimed: no lease runs out while it waits.
                    let state = r.broker.job("jobs", "w", next).await.unwrap().state;
                    assert_eq!(state, JobState::Limited, "{ctx}: #{next} at the limit");
                    continue;
                }
                let job = tokio::time::timeout(Duration::from_secs(5), r.subs[i].next())
                    .await
                    .unwrap_or_else(|_| panic!("{ctx}: hung"))
                    .unwrap()
                    .unwrap();
                assert_eq!(job.seq(), next, "{ctx}: {m:?}");
                m.held[i] = Some(next);
                r.jobs[i] = Some(job);
            }
            Op::Ack(i) | Op::Dead(i) | Op::Drop(i) => {
                let Some(i) = (0..SUBS).map(|k| (i + k) % SUBS).find(|&k| m.held[k].is_some()) else {
                    continue;
                };
                let seq = m.held[i].take().unwrap();
                let job = r.jobs[i].take().unwrap();
                match op {
                    Op::Ack(_) => {
                        if m.step_of.contains_key(&seq) {
                            // A flow step keeps its result for its dependents, outcomes kept or not.
                            job.set_result(format!("r{seq}")).unwrap();
                        }
                        job.ack_durable().await.unwrap();
                    }
                    Op::Dead(_) => {
                        job.dead_letter_durable("model").await.unwrap();
                        m.dlq.push(seq);
                    }
                    _ => {
                        drop(job);
                        // Released by the writer's next round: wait for it, so that the next
                        // claim sees it (the job's state leaves `Leased`).
                        r.broker.flush().await.unwrap();
                        continue;
                    }
                }
                finish(&r, &mut m, seq, matches!(op, Op::Ack(_)), &ctx).await;
            }
            Op::Redrive => {
                let moved =
                    r.broker.dead_letters("jobs.dlq").await.unwrap().redrive(Redrive::new()).await.unwrap();
                assert_eq!(moved as usize, m.dlq.len(), "{ctx}");
                for origin in std::mem::take(&mut m.dlq) {
                    m.last += 1;
                    m.open.insert(m.last);
                    // A step's own dead letter: the step is queued again as the new job.
                    if let Some(&(f, step)) = m.step_of.get(&origin) {
                        m.flows[f].steps[step as usize].state = S::Queued(m.last);
                        m.step_of.insert(m.last, (f, step));
                    }
                }
                // Reviving never makes a step ready (the revived one has not succeeded).
                for f in 0..m.flows.len() {
                    assert!(m.flows[f].ready().is_empty(), "{ctx}");
                }
            }
            Op::Restart => {
                let Real { broker, subs, jobs } = r;
                // Held jobs die with the process: their claims come back to the group.
                std::mem::forget(jobs);
                drop(subs);
                broker.shutdown().await.unwrap();
                m.held = [None; SUBS];
                r = open_real(dir.path(), &clock).await;
                q = r.broker.queue("jobs").await.unwrap();
            }
        }
        check_flows(&r, &m, &ctx).await;
        assert_eq!(r.broker.queue("jobs").await.unwrap().last_seq(), m.last, "{ctx}: no step sent twice");
    }
    // Drained: claims until the limit, then an ack, until nothing is open; every flow ends.
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 10_000, "never drained");
        let free = (0..SUBS).find(|&k| m.held[k].is_none());
        if let (Some(i), Some(next), true) = (free, m.next(), m.holding() < LIMIT) {
            let job = tokio::time::timeout(Duration::from_secs(5), r.subs[i].next())
                .await
                .expect("drain hung")
                .unwrap()
                .unwrap();
            assert_eq!(job.seq(), next, "drain");
            m.held[i] = Some(next);
            r.jobs[i] = Some(job);
            continue;
        }
        let Some(i) = (0..SUBS).find(|&k| m.held[k].is_some()) else { break };
        let seq = m.held[i].take().unwrap();
        let job = r.jobs[i].take().unwrap();
        if m.step_of.contains_key(&seq) {
            // A flow step keeps its result for its dependents, outcomes kept or not.
            job.set_result(format!("r{seq}")).unwrap();
        }
        job.ack_durable().await.unwrap();
        finish(&r, &mut m, seq, true, "drain").await;
    }
    assert!(m.open.is_empty(), "drained: {m:?}");
    check_flows(&r, &m, "drained").await;
    for f in &m.flows {
        assert_ne!(f.state(), FlowState::Running, "flow {} still running after the drain: {f:?}", f.id);
    }
    let Real { broker, subs, jobs } = r;
    drop((subs, jobs, q));
    broker.shutdown().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]
    #[test]
    fn flows_under_a_concurrency_limit_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}
