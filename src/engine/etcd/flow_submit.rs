//! Submitting a flow on etcd (`flows.rs` moves it on): a small flow in one transaction, by
//! the writer; a larger one in parts, by a task of its own (`LargeSubmit`) — its step records
//! and kept messages under its id, then its record with a continuation change that sends its
//! first steps, which the writer's mover applies a transaction at a time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flow_book::{MAX_ETCD_FLOW_WORK, MAX_ETCD_LARGE_FLOW_MESSAGE};
use tokio_util::sync::CancellationToken;

use super::EtcdSide;
use super::flows::until_deadline;
use super::side::retrying;
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::flow_moves;
use crate::engine::registry::QueueState;
use crate::engine::request::{FlowStepSpec, Reply};
use crate::error::{Error, StorageError};
use crate::flow_state::{Change, FlowHeader, FlowStep, Step, StoredStep, Submitted};
use crate::store::envelope;
use crate::store::etcd::flows::{FlowChange, FlowChangeWrite, FlowWrite, WHOLE_FLOW_STEPS};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// What the writer made of a flow's submit.
enum Planned {
    /// Submitted in one transaction.
    Whole(Submitted),
    /// Larger than one transaction: submitted by a task of its own (`Writer::spawn_submit`).
    Parts(LargeSubmit),
}

impl Writer {
    /// Submits a flow and answers `reply`: at once if it fits one transaction, from a task of
    /// its own if it is larger ([`spawn_submit`](Self::spawn_submit)).
    pub(super) async fn submit(&mut self, steps: Vec<FlowStepSpec>, reply: Reply<Submitted>) {
        match self.submit_flow(steps).await {
            Ok(Planned::Whole(s)) => drop(reply.send(Ok(s))),
            Ok(Planned::Parts(large)) => self.spawn_submit(large, reply),
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    /// Submits a flow that fits one transaction; plans a larger one, to be submitted by a task
    /// of its own ([`spawn_submit`](Self::spawn_submit)).
    async fn submit_flow(&mut self, steps: Vec<FlowStepSpec>) -> Result<Planned, Error> {
        if let Some(f) = self.engine.failure() {
            return Err(crate::error::Closed::Failed(f).into());
        }
        for s in &steps {
            if s.queue.is_deleted() {
                return Err(Error::QueueDeleted { queue: s.queue.name.to_string() });
            }
        }
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let store = self.side.store.clone();
        let now = self.stamp();
        // The id is taken first: a flow refused below leaves a gap (ids are never reused).
        // Encoded with a placeholder id, only to size them: the longest header there is.
        let size = check_size(&steps, &encode_steps(&steps, u64::MAX, now)?)?;
        let id = retrying(t, || store.take_flow_id()).await?;
        if size == Size::Parts {
            // Known here, so that the moves of its changes read it in part from the first.
            if steps.len() > WHOLE_FLOW_STEPS {
                self.note_large(id);
            }
            return Ok(Planned::Parts(LargeSubmit { id, steps, now, deadline }));
        }
        let envs = encode_steps(&steps, id, now)?;
        let dependents = flow_moves::dependents(steps.iter().map(|s| s.after.as_slice()));
        // The first steps by queue, in order.
        let mut queues: Vec<(Arc<QueueState>, Vec<u32>)> = Vec::new();
        for (i, s) in steps.iter().enumerate().filter(|(_, s)| s.after.is_empty()) {
            match queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &s.queue)) {
                Some((_, list)) => list.push(i as u32),
                None => queues.push((s.queue.clone(), vec![i as u32])),
            }
        }
        // Whether a try's answer was lost: it may land later, whatever the next tries find.
        let mut in_doubt = false;
        let mut backoff = Duration::from_millis(10);
        loop {
            if in_doubt {
                // The flow's id is this call's alone: if its record is there, a try landed, and
                // its records say where the first steps went.
                match until_deadline(deadline, store.flow_status(id)).await {
                    Ok(Some(status)) => {
                        let sent = first_steps(&status);
                        self.sent_steps(&queues, &sent, &envs);
                        return Ok(Planned::Whole(Submitted { id, sent }));
                    }
                    Ok(None) => {}
                    Err(e) if Instant::now() >= deadline => return Err(e.into()),
                    Err(_) => {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(super::side::RETRY_CAP);
                        continue;
                    }
                }
            }
            let mut w = FlowWrite {
                flow: id,
                header: Some(FlowHeader { created_micros: now, steps: steps.len() as u32 }),
                ..FlowWrite::default()
            };
            let mut sent = Vec::new();
            let mut seqs: HashMap<u32, u64> = HashMap::new();
            for (q, list) in &queues {
                let (last, nonce) = match self.tails.get(&q.id) {
                    Some(&tail) => tail,
                    None => match until_deadline(deadline, store.get_tail(q.id)).await? {
                        Some(tail) => tail,
                        None => return Err(Error::QueueDeleted { queue: q.name.to_string() }),
                    },
                };
                for (k, &step) in list.iter().enumerate() {
                    let seq = last + 1 + k as u64;
                    seqs.insert(step, seq);
                    sent.push((Step(step, 0), seq));
                }
                w.appends.push(DeadLetterAppend {
                    qid: q.id,
                    expected_last: last,
                    expected_nonce: nonce,
                    nonce: self.nonce(),
                    envelopes: list.iter().map(|&s| envs[s as usize].clone()).collect(),
                });
            }
            for (i, (s, after)) in steps.iter().zip(&dependents).enumerate() {
                let step = i as u32;
                let state = match seqs.get(&step) {
                    Some(&seq) => StoredStep::Queued { seq },
                    None => {
                        w.deps.push((step, s.after.clone()));
                        w.put_messages.push((step, envs[i].clone()));
                        StoredStep::Waiting
                    }
                };
                let rec = s.record(after.clone(), state);
                w.steps.push((step, None, rec));
            }
            match until_deadline(deadline, store.write_flow(&w)).await {
                Ok(Some(_)) => {
                    for a in &w.appends {
                        self.tails.insert(a.qid, (a.expected_last + a.envelopes.len() as u64, a.nonce));
                    }
                    self.sent_steps(&queues, &sent, &envs);
                    // In step order, as embedded (they were appended queue by queue).
                    sent.sort_by_key(|(s, _)| s.0);
                    tracing::debug!(flow = id, sent = sent.len(), "rockq: flow submitted");
                    return Ok(Planned::Whole(Submitted { id, sent }));
                }
                Ok(None) => {
                    // A tail moved (the flow id is this call's alone): read them again.
                    for (q, _) in &queues {
                        self.tails.remove(&q.id);
                    }
                }
                Err(e) => {
                    for (q, _) in &queues {
                        self.tails.remove(&q.id);
                    }
                    if Instant::now() >= deadline {
                        return Err(e.into());
                    }
                    in_doubt = true;
                }
            }
            if Instant::now() >= deadline {
                return Err(StorageError::new("etcd: a flow's queues kept moving").into());
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(super::side::RETRY_CAP);
        }
    }

    /// Submits `large` on a task of its own, which answers `reply`: the writer serves other
    /// requests meanwhile, its mover sending the flow's first steps a transaction at a time.
    /// A shutdown waits for the task (`Writer::finish_submits`).
    fn spawn_submit(&mut self, large: LargeSubmit, reply: Reply<Submitted>) {
        // Reaps the tasks done since the last submit.
        while self.submits.try_join_next().is_some() {}
        let (side, stop) = (self.side.clone(), self.submits_stop.clone());
        self.submits.spawn(async move {
            let _ = reply.send(large.run(&side, &stop).await);
        });
    }

    /// Ends the large submits in flight before a shutdown is answered: each finishes writing,
    /// stops waiting for the mover (which stops with this writer) and answers with the first
    /// steps sent so far. A submit whose writes go unanswered (etcd slow or away) may need
    /// [`SUBMIT_GRACE`] request timeouts to settle — its deadline, a last read, the deletion of
    /// its parts with its mark — and is waited for that long, so that no write of its lands
    /// after the shutdown is answered. One still at it then is abandoned: its caller gets
    /// `Shutdown`, its outcome unknown (a try of its record may still land), and parts it
    /// wrote stay, as a killed process's do.
    pub(super) async fn finish_submits(&mut self) {
        self.submits_stop.cancel();
        let t = self.side.settings.request_timeout;
        let all = async { while self.submits.join_next().await.is_some() {} };
        if tokio::time::timeout(t * SUBMIT_GRACE, all).await.is_err() {
            self.submits.abort_all();
            while self.submits.join_next().await.is_some() {}
        }
    }

    /// Publishes the first steps a submit appended (`sent`, by queue `queues`; `envs`, every
    /// step's envelope), with their priorities.
    fn sent_steps(&self, queues: &[(Arc<QueueState>, Vec<u32>)], sent: &[(Step, u64)], envs: &[Vec<u8>]) {
        for (q, list) in queues {
            for (step, seq) in sent.iter().filter(|(s, _)| list.contains(&s.0)) {
                if let Some(env) = envs.get(step.0 as usize) {
                    super::writer::index_sent(q, *seq, [env]);
                }
            }
            let last = sent.iter().filter(|(s, _)| list.contains(&s.0)).map(|(_, seq)| *seq).max();
            if let Some(last) = last {
                q.publish_max(last);
                telemetry::produced(&q.produced, list.len() as u64);
            }
        }
    }
}

/// A flow larger than one transaction, planned by the writer (its steps checked and sized, its
/// stamp taken) and submitted by a task of its own (`Writer::spawn_submit`), which needs no
/// writer state: its id is fresh, its parts go under that id and its record is compared
/// absent; what appends (the continuation) is applied by the writer's mover.
struct LargeSubmit {
    id: u64,
    steps: Vec<FlowStepSpec>,
    /// The stamp its step messages carry.
    now: u64,
    deadline: Instant,
}

impl LargeSubmit {
    /// Writes the step records, dependency lists and kept messages in parts (nothing reads
    /// them before the flow's record is there), then the flow's record with a continuation
    /// that sends its first steps; waits while the movers (this process's, woken here, or
    /// another's) send them, and reads back where they went.
    ///
    /// A submit that fails before the flow's record deletes what it wrote; a crash in between
    /// leaves records no flow names (`docs/etcd.md`). `stop`: the writer is shutting down —
    /// the wait ends and the first steps sent so far are answered.
    async fn run(self, side: &EtcdSide, stop: &CancellationToken) -> Result<Submitted, Error> {
        let LargeSubmit { id, steps, now, deadline } = self;
        let store = side.store.clone();
        let t = side.settings.request_timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        let envs = encode_steps(&steps, id, now)?;
        let dependents = flow_moves::dependents(steps.iter().map(|s| s.after.as_slice()));
        // Logged: a process killed before the flow's record leaves parts only this id names.
        tracing::info!(flow = id, steps = steps.len(), "rockq: a large flow is written in parts");
        let mut part = FlowWrite { flow: id, ..FlowWrite::default() };
        let (mut ops, mut bytes) = (0, 0);
        let mut parts = Vec::new();
        for (i, (s, after)) in steps.iter().zip(dependents).enumerate() {
            let step = i as u32;
            let rec = s.record(after, StoredStep::Waiting);
            let step_ops = 2 + usize::from(!s.after.is_empty());
            let step_bytes = envs[i].len()
                + 256
                + rec.group.len()
                + rec.queue.len()
                + 4 * (s.after.len() + rec.dependents.len());
            if ops + step_ops > MAX_TXN_OPS - 1 || bytes + step_bytes > MAX_TXN_BYTES {
                parts.push(std::mem::replace(&mut part, FlowWrite { flow: id, ..FlowWrite::default() }));
                (ops, bytes) = (0, 0);
            }
            ops += step_ops;
            bytes += step_bytes;
            if !s.after.is_empty() {
                part.deps.push((step, s.after.clone()));
            }
            part.put_messages.push((step, envs[i].clone()));
            part.steps.push((step, None, rec));
        }
        parts.push(part);
        for p in &parts {
            // Puts only, under this call's own id: a try whose answer was lost is tried again.
            match retrying(left(), || store.write_flow_steps(p)).await {
                Ok(true) => {}
                Ok(false) => return Err(StorageError::new("etcd: a new flow's id was taken").into()),
                Err(e) => {
                    if let Err(d) = abandon(&store, id, t).await {
                        tracing::warn!(flow = id, error = %d, "rockq: a failed flow submit's records were not deleted");
                    }
                    return Err(e.into());
                }
            }
        }
        // Sent from the end: the first steps go in step order.
        let work: Vec<(u32, Change)> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.after.is_empty())
            .map(|(i, _)| (i as u32, Change::Start))
            .rev()
            .collect();
        let start =
            FlowChangeWrite { flow: id, id: fastrand::u64(1..), change: FlowChange::Continued { work } };
        let key = store.change_key(id, start.id);
        let head = FlowWrite {
            flow: id,
            header: Some(FlowHeader { created_micros: now, steps: steps.len() as u32 }),
            put_changes: vec![start],
            after_parts: true,
            ..FlowWrite::default()
        };
        // The flow's record with its continuation. A try whose answer was lost may land: the
        // flow is read back (its id is this call's alone) and the write tried again, until the
        // deadline; then read back once more (a read of its own), so that a try in doubt is
        // settled where it can be.
        let mut backoff = Duration::from_millis(10);
        loop {
            let late = Instant::now() >= deadline;
            // Refused (`Ok(None)`): the flow's record is there, a try whose answer was lost
            // landed; read back below, as after an error.
            if !late && let Ok(Some(_)) = until_deadline(deadline, store.write_flow(&head)).await {
                break;
            }
            let read = match late {
                false => until_deadline(deadline, store.load_steps(id, 0, 1)).await,
                true => retrying(t, || store.load_steps(id, 0, 1)).await,
            };
            match read {
                // The flow's record is there (a try landed).
                Ok(Some(_)) => break,
                // Not there: its parts go, in one transaction compared with the record absent —
                // a try still in flight then finds no part and is refused. Refused itself, the
                // record landed meanwhile.
                Ok(None) if late => match abandon(&store, id, t).await {
                    Ok(false) => break,
                    Ok(true) => {
                        return Err(
                            StorageError::new("etcd: a large flow's record could not be written").into()
                        );
                    }
                    // Unknown: no mark turns a try still in flight away, and its parts stay
                    // (a record that lands names them): the flow may yet run.
                    Err(d) => {
                        tracing::warn!(flow = id, error = %d, "rockq: a failed flow submit's records were not deleted");
                        return Err(in_doubt(id, &d).into());
                    }
                },
                // Unknown: the parts stay (a record that landed names them).
                Err(e) if late => return Err(in_doubt(id, &e).into()),
                _ => {}
            }
            let nap = backoff.min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(nap).await;
            backoff = (backoff * 2).min(super::side::RETRY_CAP);
        }
        // The writer's mover sends the first steps, a transaction at a time, other requests in
        // between (the namespace watch wakes it too, and every other process's). Looked at
        // every 10 ms at most: each of its transactions takes a few.
        side.flows_changed.notify_one();
        let mut backoff = Duration::from_millis(2);
        while Instant::now() < deadline && !stop.is_cancelled() {
            match until_deadline(deadline, store.load_steps(id, 0, 1)).await {
                Ok(Some(l)) if l.pending.iter().any(|p| p.0 == key) => {}
                _ => break,
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => {}
            }
            backoff = (backoff * 2).min(Duration::from_millis(10));
        }
        // Read back (within a request timeout of its own: the deadline may have passed; one
        // try within a second when the writer is stopping): the movers may have sent part of
        // them so far. Unread, none is named — the flow is stored all the same.
        let read = match stop.is_cancelled() {
            false => retrying(t, || store.flow_status(id)).await,
            true => {
                until_deadline(Instant::now() + t.min(Duration::from_secs(1)), store.flow_status(id)).await
            }
        };
        let mut sent = match read {
            Ok(Some(status)) => first_steps(&status),
            _ => Vec::new(),
        };
        sent.sort_by_key(|(s, _)| s.0);
        tracing::debug!(flow = id, steps = steps.len(), sent = sent.len(), "rockq: flow submitted in parts");
        Ok(Submitted { id, sent })
    }
}

/// How many request timeouts a shutdown waits for the large submits in flight
/// ([`Writer::finish_submits`]): the submit's own deadline (one), the read after it (one), the
/// lease of its mark and the deletion of its parts (a quarter and one).
const SUBMIT_GRACE: u32 = 4;

/// The error of a large submit whose flow record may or may not be stored (etcd did not
/// answer in time): transient, as every error that says nothing about the data — not a
/// refusal, which a caller could answer by submitting the flow again, so that it ran twice.
fn in_doubt(flow: u64, cause: &StorageError) -> StorageError {
    StorageError::unreachable(format!(
        "etcd: a large flow's record (flow {flow}) may or may not have been written: {}",
        cause.message()
    ))
}

/// How long an abandoned submit's mark outlives the submit's request timeout. The writes it
/// must turn away were sent before the submit gave up, each cut short by the client at its
/// request timeout; one that reached etcd is applied within its raft round, at worst an
/// election or two later. Ten minutes is far beyond that, and marks do not pile up.
const MARK_LASTS: Duration = Duration::from_secs(600);

/// Deletes a given-up submit's parts and leaves its mark ([`EtcdStore::delete_flow_parts`]),
/// under a lease of its own: `false` if the flow's record is there (nothing deleted). A lease
/// not granted within a quarter of `t` (tried again meanwhile: etcd struggling) leaves the
/// mark for good: safe, only not tidy.
///
/// [`EtcdStore::delete_flow_parts`]: crate::store::etcd::EtcdStore::delete_flow_parts
async fn abandon(store: &crate::store::etcd::EtcdStore, id: u64, t: Duration) -> Result<bool, StorageError> {
    let lease = match retrying(t / 4, || store.grant_expiring(t + MARK_LASTS)).await {
        Ok(lease) => Some(lease),
        Err(e) => {
            tracing::debug!(flow = id, error = %e, "rockq: no lease for an abandoned flow submit's mark; it stays");
            None
        }
    };
    retrying(t, || store.delete_flow_parts(id, lease)).await
}

/// Each step's message, as flow `flow`'s step, stamped `now`.
fn encode_steps(steps: &[FlowStepSpec], flow: u64, now: u64) -> Result<Vec<Vec<u8>>, Error> {
    let mut envs = Vec::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate() {
        let m = flow_moves::step_message(s.message.clone(), FlowStep { flow, step: i as u32 });
        envs.push(envelope::encode(&m, now).map_err(|e| StorageError::new(format!("flow step {i}: {e:?}")))?);
    }
    Ok(envs)
}

/// How a flow's submit is written.
#[derive(Debug, PartialEq, Eq)]
enum Size {
    /// In one transaction: its records, its first steps' messages and the flow's record.
    Whole,
    /// Its records in parts, then the flow's record with a continuation sending its first
    /// steps (`LargeSubmit`).
    Parts,
}

/// How a flow is submitted, or its refusal: one transaction if it holds the whole submit
/// and the flow is small enough to be read whole; else in parts, if each step's message is
/// at most [`MAX_ETCD_LARGE_FLOW_MESSAGE`] (so that a read of a large flow's steps stays far
/// below the client's answer limit) and its worklist at most [`MAX_ETCD_FLOW_WORK`] (so that
/// a stored continuation fits a transaction).
fn check_size(steps: &[FlowStepSpec], envs: &[Vec<u8>]) -> Result<Size, Error> {
    let refuse = || capability::refusal(Flavour::Etcd, Capability::HugeMessage);
    let record = |s: &FlowStepSpec| 256 + s.group.len() + s.queue.name.len() + 4 * s.after.len();
    let mut first_queues: Vec<&str> =
        steps.iter().filter(|s| s.after.is_empty()).map(|s| &*s.queue.name).collect();
    first_queues.sort_unstable();
    first_queues.dedup();
    let firsts = steps.iter().filter(|s| s.after.is_empty()).count();
    let first_envs = steps.iter().zip(envs).filter(|(s, _)| s.after.is_empty()).map(|(_, e)| e.as_slice());
    // The flow's record, a record per step, a message (kept or appended) per step, the
    // dependency lists of the steps after others, an index entry per prioritised first step
    // and a tail per first steps' queue.
    let ops = 1
        + 2 * steps.len()
        + (steps.len() - firsts)
        + crate::store::etcd::index_entries(first_envs)
        + first_queues.len();
    let bytes: usize = steps.iter().zip(envs).map(|(s, e)| e.len() + 64 + record(s)).sum();
    if steps.len() <= WHOLE_FLOW_STEPS && ops <= MAX_TXN_OPS - 2 && bytes <= MAX_TXN_BYTES {
        return Ok(Size::Whole);
    }
    let work: usize = steps.iter().map(|s| s.after.len()).sum::<usize>() + firsts;
    if envs.iter().any(|e| e.len() > MAX_ETCD_LARGE_FLOW_MESSAGE) || work > MAX_ETCD_FLOW_WORK {
        return Err(refuse());
    }
    Ok(Size::Parts)
}

/// Where a stored flow's first steps (those that run after nothing) went: each one's sequence,
/// whatever became of its job since.
fn first_steps(status: &crate::flow_state::FlowStatus) -> Vec<(Step, u64)> {
    use crate::flow_state::StepState;
    status
        .steps
        .iter()
        .filter(|s| s.after.is_empty())
        .filter_map(|s| match s.state {
            // A failure at sequence 0 was never sent (its queue was deleted first).
            StepState::Queued { seq } | StepState::Succeeded { seq, .. } | StepState::Failed { seq, .. }
                if seq != 0 =>
            {
                Some((Step(s.step, 0), seq))
            }
            _ => None,
        })
        .collect()
}
