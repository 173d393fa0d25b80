//! Submitting a flow on etcd (`flows.rs` moves it on): a small flow in one transaction, a
//! larger one in parts — its step records and kept messages under its id, then its record
//! with a continuation change that sends its first steps, applied at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flow_book::{MAX_ETCD_FLOW_WORK, MAX_ETCD_LARGE_FLOW_MESSAGE};
use super::flows::{APPLY_TRIES, until_deadline};
use super::side::retrying;
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::flow_moves;
use crate::engine::registry::QueueState;
use crate::engine::request::FlowStepSpec;
use crate::error::{Error, StorageError};
use crate::flow_state::{Change, FlowHeader, FlowStep, Step, StoredStep, Submitted};
use crate::store::envelope;
use crate::store::etcd::flows::{FlowChange, FlowChangeWrite, FlowWrite, ReadChange, WHOLE_FLOW_STEPS};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

impl Writer {
    pub(super) async fn submit_flow(&mut self, steps: Vec<FlowStepSpec>) -> Result<Submitted, Error> {
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
        let mut envs = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            // Encoded with a placeholder id, only to size it: the longest header there is.
            let m = flow_moves::step_message(s.message.clone(), FlowStep { flow: u64::MAX, step: i as u32 });
            envs.push(
                envelope::encode(&m, now).map_err(|e| StorageError::new(format!("flow step {i}: {e:?}")))?,
            );
        }
        let size = check_size(&steps, &envs)?;
        let id = retrying(t, || store.take_flow_id()).await?;
        let mut envs = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let m = flow_moves::step_message(s.message.clone(), FlowStep { flow: id, step: i as u32 });
            envs.push(
                envelope::encode(&m, now).map_err(|e| StorageError::new(format!("flow step {i}: {e:?}")))?,
            );
        }
        let dependents = flow_moves::dependents(steps.iter().map(|s| s.after.as_slice()));
        if size == Size::Parts {
            return self.submit_in_parts(id, &steps, &envs, dependents, now, deadline).await;
        }
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
                        return Ok(Submitted { id, sent });
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
                    tracing::debug!(flow = id, sent = sent.len(), "rockq: flow submitted");
                    return Ok(Submitted { id, sent });
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

    /// Submits a flow larger than one transaction: its step records, dependency lists and
    /// kept messages in parts (nothing reads them before the flow's record is there), then
    /// the flow's record with a continuation that sends its first steps, applied here at once
    /// (another process may take part of it: the first steps' sequences are read back).
    ///
    /// A submit that fails before the flow's record deletes what it wrote; a crash in between
    /// leaves records no flow names (`docs/etcd.md`).
    async fn submit_in_parts(
        &mut self,
        id: u64,
        steps: &[FlowStepSpec],
        envs: &[Vec<u8>],
        dependents: Vec<Vec<u32>>,
        now: u64,
        deadline: Instant,
    ) -> Result<Submitted, Error> {
        let store = self.side.store.clone();
        let left = || deadline.saturating_duration_since(Instant::now());
        if steps.len() > WHOLE_FLOW_STEPS {
            self.note_large(id);
        }
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
                    if let Err(d) =
                        retrying(self.side.settings.request_timeout, || store.delete_flow_parts(id)).await
                    {
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
        let start = FlowChangeWrite { flow: id, id: self.nonce(), change: FlowChange::Continued { work } };
        let key = store.change_key(id, start.id);
        let head = FlowWrite {
            flow: id,
            header: Some(FlowHeader { created_micros: now, steps: steps.len() as u32 }),
            put_changes: vec![start.clone()],
            ..FlowWrite::default()
        };
        // The flow's record with its continuation. A try whose answer was lost may land: the
        // flow is read back (its id is this call's alone) and the write tried again, until the
        // deadline.
        let mut backoff = Duration::from_millis(10);
        let (rev, created) = loop {
            // Refused (`Ok(None)`): the flow's record is there, a try whose answer was lost
            // landed; read back below, as after an error.
            if let Ok(Some(rev)) = until_deadline(deadline, store.write_flow(&head)).await {
                break (Some(rev), rev);
            }
            let absent = match until_deadline(deadline, store.load_steps(id, 0, 1)).await {
                Ok(Some(l)) => {
                    // Gone already: another process's mover applied the continuation.
                    let p = l.pending.iter().find(|p| p.0 == key);
                    break (p.map(|p| p.1), p.map_or(0, |p| p.2));
                }
                Ok(None) => true,
                Err(_) => false,
            };
            if Instant::now() >= deadline {
                if absent {
                    // Not there as last read: its parts go. (Unknown, they stay: a record that
                    // landed names them.)
                    if let Err(d) =
                        retrying(self.side.settings.request_timeout, || store.delete_flow_parts(id)).await
                    {
                        tracing::warn!(flow = id, error = %d, "rockq: a failed flow submit's records were not deleted");
                    }
                }
                return Err(StorageError::new("etcd: a large flow's record could not be written").into());
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(super::side::RETRY_CAP);
        };
        // Its first steps sent now, as a small flow's are (the mover goes on should this stop).
        let mut sent: Vec<(Step, u64)> = Vec::new();
        let mut change =
            ReadChange { key, rev: rev.unwrap_or_default(), created, flow: id, change: start.change };
        while rev.is_some() && Instant::now() < deadline {
            match self.apply_changes(std::slice::from_ref(&change), APPLY_TRIES).await {
                Ok(a) => {
                    sent.extend(a.sent.into_iter().map(|(s, seq)| (Step(s, 0), seq)));
                    let Some((rev, rest)) = a.continued else { break };
                    change.rev = rev;
                    change.change = rest;
                }
                Err(e) => {
                    tracing::debug!(flow = id, error = %e, "rockq: a large flow's first steps are left to the mover");
                    self.side.flows_changed.notify_one();
                    break;
                }
            }
        }
        // Another process's mover (woken by the continuation's put) may have taken part of it:
        // wait while its record is there, within the deadline (else it is left to the movers).
        let mut backoff = Duration::from_millis(2);
        while Instant::now() < deadline {
            match until_deadline(deadline, store.load_steps(id, 0, 1)).await {
                Ok(Some(l)) if l.pending.iter().any(|p| p.0 == change.key) => {}
                _ => break,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
        // Read back: part may have been sent by another process, or be left to the mover.
        if let Ok(Some(status)) = until_deadline(deadline, store.flow_status(id)).await {
            sent = first_steps(&status);
        }
        sent.sort_by_key(|(s, _)| s.0);
        tracing::debug!(flow = id, steps = steps.len(), sent = sent.len(), "rockq: flow submitted in parts");
        Ok(Submitted { id, sent })
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
                telemetry::produced(&q.name, list.len() as u64);
            }
        }
    }
}

/// How a flow's submit is written.
#[derive(Debug, PartialEq, Eq)]
enum Size {
    /// In one transaction: its records, its first steps' messages and the flow's record.
    Whole,
    /// Its records in parts, then the flow's record with a continuation sending its first
    /// steps (`submit_in_parts`).
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
            StepState::Queued { seq } | StepState::Succeeded { seq, .. } | StepState::Failed { seq, .. } => {
                Some((Step(s.step, 0), seq))
            }
            _ => None,
        })
        .collect()
}
