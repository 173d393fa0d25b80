//! How a flow moves on, for both engines: a step's job finished (or its dead letter was
//! redriven), its record changes, the counts of the steps after it change, the steps that
//! became ready are sent, and what a step's own change means for the steps after it (blocked,
//! unblocked, failed to send) is passed on — a worklist, not recursion: a chain may be 100,000
//! steps long.
//!
//! The engines differ only in where records are read and written and how a step's kept
//! message is sent: [`StepBook`]. The embedded writer moves a flow in the batch that finishes
//! the job (`writer/flow.rs`); the etcd engine in one transaction per finished job, compared
//! with every record it read (`etcd/flows.rs`).

use bytes::Bytes;

pub(crate) use crate::flow_state::Change;
use crate::flow_state::{FLOW_HEADER, FlowStep, StepRecord, StoredStep};
use crate::message::Message;
use crate::stats::OutcomeKind;

/// The message a step is sent as: its own, with the [`FLOW_HEADER`] naming the step.
pub(crate) fn step_message(mut m: Message, at: FlowStep) -> Message {
    m.headers.retain(|(k, _)| k != FLOW_HEADER);
    m.headers.push((FLOW_HEADER.to_owned(), Bytes::from(at.header_value())));
    m
}

/// The steps each step runs before (`after` lists turned round).
pub(crate) fn dependents<'a>(afters: impl ExactSizeIterator<Item = &'a [u32]>) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); afters.len()];
    for (i, after) in afters.enumerate() {
        for &d in after {
            if let Some(list) = out.get_mut(d as usize) {
                list.push(i as u32);
            }
        }
    }
    out
}

/// Where a flow's step records are read and written, as of this point of the write being
/// built (its own earlier writes included).
pub(crate) trait StepBook {
    type Error;
    /// Step `step` of `flow` (`None`: no such step, or its flow was deleted).
    fn load(&mut self, flow: u64, step: u32) -> Result<Option<StepRecord>, Self::Error>;
    /// Writes step `step`'s record.
    fn put(&mut self, flow: u64, step: u32, rec: StepRecord);
    /// Sends a step that became ready: its kept message appended to its queue. `None`: its
    /// queue was deleted, or the message is missing (the step fails).
    fn release(&mut self, flow: u64, step: u32, rec: &StepRecord) -> Result<Option<u64>, Self::Error>;
    /// The wall clock now, in µs (a finish time).
    fn now_micros(&mut self) -> u64;
    /// Whether the write being built holds no more work: the move stops before its next step
    /// and hands what is left to [`defer`](Self::defer). Never before the first step of a
    /// move, so every write makes progress. (The embedded writer's batch is never full.)
    fn full(&self) -> bool {
        false
    }
    /// Takes the work a full write left (steps and the change each one is to take, in the
    /// order [`resume`] takes them), for a later write to go on with.
    fn defer(&mut self, _work: Vec<(u32, Change)>) {}
}

/// Goes on with work a full write left ([`StepBook::defer`]), as the move that left it would
/// have.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only the etcd engine stores work to go on with
pub(crate) fn resume<B: StepBook>(book: &mut B, flow: u64, work: Vec<(u32, Change)>) -> Result<(), B::Error> {
    propagate(book, flow, work)
}

/// Job `seq` of `queue`, step `step` of `flow`, was finished by `group` (`how`; the handler's
/// `result` for an ack): records it and moves the flow on. Nothing changes unless the step is
/// that job of that queue, queued for that group (another group of the queue processed it, a
/// reset replayed it, or a copied header named it).
pub(crate) fn settle<B: StepBook>(
    book: &mut B,
    (flow, step): (u64, u32),
    (queue, group, seq): (&str, &str, u64),
    how: &OutcomeKind,
    result: Option<&Bytes>,
) -> Result<bool, B::Error> {
    let Some(mut rec) = book.load(flow, step)? else { return Ok(false) };
    if rec.state != (StoredStep::Queued { seq }) || rec.queue != queue || rec.group != group {
        return Ok(false);
    }
    let at_micros = book.now_micros();
    let change = match how {
        OutcomeKind::Acked => {
            rec.state = StoredStep::Succeeded { seq, at_micros, result: result.cloned() };
            Change::Succeeded
        }
        other => {
            rec.state = StoredStep::Failed { seq, at_micros, how: other.clone() };
            Change::Failed
        }
    };
    tracing::debug!(flow, step, seq, state = ?change, "rockq: flow step finished");
    let after = rec.dependents.clone();
    book.put(flow, step, rec);
    propagate(book, flow, after.into_iter().map(|d| (d, change)).collect())?;
    Ok(true)
}

/// A dead letter of `queue`'s job was redriven to it as `seq`: if it is step `step` of `flow`
/// and failed as that very letter (`letter`: the dead-letter queue and the letter's sequence
/// there), the step is queued again as `seq` and what its failure blocked waits for it again.
/// Returns the step's group if it was (another group's letter of the same message, or a
/// copied header, is an ordinary redrive).
pub(crate) fn revive<B: StepBook>(
    book: &mut B,
    (flow, step): (u64, u32),
    (queue, seq): (&str, u64),
    letter: (&str, u64),
) -> Result<Option<String>, B::Error> {
    let Some(mut rec) = book.load(flow, step)? else { return Ok(None) };
    let own_letter = matches!(
        &rec.state,
        StoredStep::Failed { how: OutcomeKind::DeadLettered { dead_letter_queue, dead_letter_seq, .. }, .. }
            if dead_letter_queue.as_str() == letter.0 && *dead_letter_seq == letter.1
    );
    if !own_letter || rec.queue != queue {
        return Ok(None);
    }
    rec.state = StoredStep::Queued { seq };
    tracing::debug!(flow, step, seq, "rockq: flow step queued again");
    let after = rec.dependents.clone();
    let group = rec.group.clone();
    book.put(flow, step, rec);
    propagate(book, flow, after.into_iter().map(|d| (d, Change::Revived)).collect())?;
    Ok(Some(group))
}

/// Applies each change to its step, sending the steps that become ready and passing a step's
/// own change (blocked, unblocked, or failed to send) on to the steps after it. Stops when the
/// book is full, deferring the rest (the first step is always taken).
fn propagate<B: StepBook>(book: &mut B, flow: u64, mut work: Vec<(u32, Change)>) -> Result<(), B::Error> {
    let mut first = true;
    loop {
        if !first && book.full() && !work.is_empty() {
            book.defer(work);
            return Ok(());
        }
        first = false;
        let Some((step, change)) = work.pop() else { break };
        let Some(mut rec) = book.load(flow, step)? else { continue };
        let blocked = rec.is_blocked();
        match change {
            Change::Succeeded => rec.succeeded = rec.succeeded.saturating_add(1),
            Change::Failed => rec.failed = rec.failed.saturating_add(1),
            Change::Revived => rec.failed = rec.failed.saturating_sub(1),
            Change::Start => {}
        }
        let mut passed = None;
        if rec.is_ready() {
            match book.release(flow, step, &rec)? {
                Some(seq) => rec.state = StoredStep::Queued { seq },
                None => {
                    // Its queue is gone: the step fails, as a job deleted by an operator.
                    let at_micros = book.now_micros();
                    rec.state = StoredStep::Failed { seq: 0, at_micros, how: OutcomeKind::Deleted };
                    passed = Some(Change::Failed);
                }
            }
        } else if !blocked && rec.is_blocked() {
            passed = Some(Change::Failed);
        } else if blocked && !rec.is_blocked() {
            passed = Some(Change::Revived);
        }
        if let Some(c) = passed {
            work.extend(rec.dependents.iter().map(|&d| (d, c)));
        }
        book.put(flow, step, rec);
    }
    Ok(())
}
