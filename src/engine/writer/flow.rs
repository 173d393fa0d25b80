//! The writer's half of flows: storing a flow and sending its first steps, and moving a flow on
//! **in the batch that finishes a step's job** — the step's outcome recorded, the counts of the
//! steps after it updated, and every step that became ready sent (appended to its queue) — so
//! that a crash can neither lose a parent (its last child acked, the parent never sent) nor
//! send it twice. A redriven dead letter of a step queues the step again in the redrive's
//! batch, and what its failure blocked waits for it again.
//!
//! The writer alone keeps flows: which message is which step is an index in its memory
//! (`Written::flow_jobs`, loaded at open), so finishing a job that is no step costs one lookup
//! in an empty map; step records are read from the store, through this round's own writes.

use std::sync::Arc;

use bytes::Bytes;

use super::queue;
use super::round::Round;
use crate::engine::flow_moves::{self, StepBook};
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::{FlowRequest, FlowStepSpec, Reply};
use crate::error::{Error, FailedError};
use crate::flow_state::{FLOW_HEADER, FlowHeader, FlowStep, Step, StepRecord, StoredStep, Submitted};
use crate::message::Message;
use crate::stats::OutcomeKind;
use crate::store::envelope;

pub(super) fn apply(r: &mut Round<'_>, req: FlowRequest) {
    match req {
        FlowRequest::Submit { steps, reply } => submit(r, steps, reply),
        FlowRequest::Delete { id, reply } => delete(r, id, reply),
        FlowRequest::Move => {}
    }
}

fn submit(r: &mut Round<'_>, steps: Vec<FlowStepSpec>, reply: Reply<Submitted, Error>) {
    // Everything that could refuse it, before anything is written.
    for s in &steps {
        if s.queue.is_deleted() || !r.written.next_seq.contains_key(&s.queue.id) {
            let _ = reply.send(Err(Error::QueueDeleted { queue: s.queue.name.to_string() }));
            return;
        }
    }
    let id = r.written.next_flow_id;
    let now = r.stamp();
    let mut encoded = Vec::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate() {
        let m = flow_moves::step_message(s.message.clone(), FlowStep { flow: id, step: i as u32 });
        match envelope::encode(&m, now) {
            Ok(v) => encoded.push(v),
            Err(e) => {
                let why = format!("flow step {i} does not encode: {e:?}");
                let _ = reply.send(Err(Error::Failed(FailedError::internal(why))));
                return;
            }
        }
    }
    r.written.next_flow_id += 1;
    r.batch.put_next_flow_id(r.written.next_flow_id);
    let dependents = flow_moves::dependents(steps.iter().map(|s| s.after.as_slice()));
    r.batch.put_flow(id, &FlowHeader { created_micros: now, steps: steps.len() as u32 });
    let mut sent = Vec::new();
    for ((i, s), (mut env, after)) in steps.into_iter().enumerate().zip(encoded.into_iter().zip(dependents)) {
        let step = i as u32;
        let mut rec = s.record(after, StoredStep::Waiting);
        if s.after.is_empty() {
            // Known to the writer and not deleted (checked above): the append cannot fail.
            if let Some(seq) = send(r, &s.queue, id, step, &rec.group, &mut env, now) {
                rec.state = StoredStep::Queued { seq };
                sent.push((Step(step, 0), seq));
            }
        } else {
            r.batch.put_flow_deps(id, step, &s.after);
            r.batch.put_flow_message(id, step, &env);
        }
        put_step(r, id, step, rec);
    }
    tracing::debug!(flow = id, sent = sent.len(), "rockq: flow submitted");
    r.on_done(move |res| {
        drop(reply.send(res.map(|()| Submitted { id, sent }).map_err(|e| Error::Storage(e.clone()))))
    });
}

/// Appends step `step`'s message to `queue` and indexes it as the step's job.
fn send(
    r: &mut Round<'_>,
    queue: &Arc<QueueState>,
    flow: u64,
    step: u32,
    group: &str,
    envelope: &mut [u8],
    now: u64,
) -> Option<u64> {
    envelope::stamp(envelope, now);
    let seq = queue::append(r, queue, envelope)?;
    r.batch.put_flow_job(queue.id, seq, flow, step, group);
    r.written.flow_jobs.insert((queue.id, seq), (flow, step, Arc::from(group)));
    Some(seq)
}

fn delete(r: &mut Round<'_>, id: u64, reply: Reply<bool, Error>) {
    let exists = match flow_exists(r, id) {
        Ok(e) => e,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    if exists {
        r.batch.delete_flow(id);
        let sent: Vec<(u32, u64)> =
            r.written.flow_jobs.iter().filter(|(_, (f, _, _))| *f == id).map(|(k, _)| *k).collect();
        for (qid, seq) in sent {
            r.written.flow_jobs.remove(&(qid, seq));
            r.batch.delete_flow_job(qid, seq);
        }
        r.jobs.flows_deleted.insert(id);
        r.jobs.flow_steps.retain(|(f, _), _| *f != id);
    }
    r.on_done(move |res| drop(reply.send(res.map(|()| exists).map_err(|e| Error::Storage(e.clone())))));
}

fn flow_exists(r: &Round<'_>, id: u64) -> Result<bool, Error> {
    if r.jobs.flows_deleted.contains(&id) {
        return Ok(false);
    }
    if id >= r.written.next_flow_id {
        return Ok(false);
    }
    // Submitted in this round: its record is in the batch, not the store.
    if r.jobs.flow_steps.keys().any(|(f, _)| *f == id) {
        return Ok(true);
    }
    Ok(r.batch.flow(id).map_err(Error::from)?.is_some())
}

/// The round as a flow's [`StepBook`]: records read through this round's own writes.
struct RoundBook<'r, 'a>(&'r mut Round<'a>);

impl StepBook for RoundBook<'_, '_> {
    type Error = Error;

    fn load(&mut self, flow: u64, step: u32) -> Result<Option<StepRecord>, Error> {
        let r = &*self.0;
        if r.jobs.flows_deleted.contains(&flow) {
            return Ok(None);
        }
        if let Some(rec) = r.jobs.flow_steps.get(&(flow, step)) {
            return Ok(Some(rec.clone()));
        }
        r.batch.flow_step(flow, step).map_err(Error::from)
    }

    fn put(&mut self, flow: u64, step: u32, rec: StepRecord) {
        put_step(self.0, flow, step, rec);
    }

    /// Its kept message appended to its queue (`None`: the queue was deleted, or the message is
    /// missing).
    fn release(&mut self, flow: u64, step: u32, rec: &StepRecord) -> Result<Option<u64>, Error> {
        let r = &mut *self.0;
        let Some(mut env) = r.batch.flow_message(flow, step).map_err(Error::from)? else {
            tracing::error!(flow, step, "rockq: a ready flow step has no message");
            return Ok(None);
        };
        // Registered, or created in a round not yet registered; a deleted queue fails the step.
        let name = rec.queue.as_str();
        let queue = r.engine.registry.queue(name).or_else(|| r.done.queues.get(name).map(|(q, _)| q.clone()));
        let Some(queue) = queue.or_else(|| r.written.queues.get(name).cloned()).filter(|q| !q.is_deleted())
        else {
            return Ok(None);
        };
        r.batch.delete_flow_message(flow, step);
        let now = r.stamp();
        let seq = send(r, &queue, flow, step, &rec.group, &mut env, now);
        if let Some(seq) = seq {
            tracing::debug!(flow, step, queue = %queue.name, seq, "rockq: flow step sent");
        }
        Ok(seq)
    }

    fn now_micros(&mut self) -> u64 {
        self.0.stamp()
    }
}

fn put_step(r: &mut Round<'_>, flow: u64, step: u32, rec: StepRecord) {
    r.batch.put_flow_step(flow, step, &rec);
    r.jobs.flow_steps.insert((flow, step), rec);
}

/// Job `seq` of `g`'s queue was finished by `g` (`how`: acked, deleted or dead-lettered; the
/// handler's `result` for an ack). If it is a flow step for that group, records its outcome
/// and moves its flow on, in this batch. Called by every path that finishes a work-group job.
pub(super) fn finished(
    r: &mut Round<'_>,
    g: &WorkGroupState,
    seq: u64,
    how: &OutcomeKind,
    result: Option<&Bytes>,
) {
    if r.written.flow_jobs.is_empty() {
        return;
    }
    let key = (g.queue.id, seq);
    let Some((flow, step, group)) = r.written.flow_jobs.get(&key) else { return };
    // Another group of the queue processed it: only the step's own group moves the flow.
    if **group != *g.name {
        return;
    }
    let (flow, step) = (*flow, *step);
    r.written.flow_jobs.remove(&key);
    r.batch.delete_flow_job(g.queue.id, seq);
    let at = (g.queue.name.as_ref(), g.name.as_ref(), seq);
    if let Err(e) = flow_moves::settle(&mut RoundBook(r), (flow, step), at, how, result) {
        // The job is finished either way; the flow stays where it was (and says so when read).
        tracing::error!(flow, step, seq, error = %e, "rockq: a flow step's outcome was not recorded");
    }
}

/// A dead letter of queue `queue`'s job was redriven to it as `seq` (`message`, with the
/// headers it had): if it is a flow step that failed as that letter, the step is queued again
/// as `seq` (`flow_moves::revive`).
pub(super) fn redriven(
    r: &mut Round<'_>,
    queue: &QueueState,
    seq: u64,
    message: &Message,
    letter: (&str, u64),
) {
    let Some(at) =
        message.headers.iter().find(|(k, _)| k == FLOW_HEADER).and_then(|(_, v)| FlowStep::parse(v))
    else {
        return;
    };
    match flow_moves::revive(&mut RoundBook(r), (at.flow, at.step), (&queue.name, seq), letter) {
        Ok(Some(group)) => {
            r.batch.put_flow_job(queue.id, seq, at.flow, at.step, &group);
            r.written.flow_jobs.insert((queue.id, seq), (at.flow, at.step, Arc::from(group.as_str())));
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!(flow = at.flow, step = at.step, seq, error = %e, "rockq: a redriven flow step was not queued again");
        }
    }
}
