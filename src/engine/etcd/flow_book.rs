//! A flow as the etcd engine moves it: [`EtcdBook`], the [`StepBook`] of a move built in
//! memory from what was read, then written in one transaction (`flows.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::engine::flow_moves::{self, StepBook};
use crate::engine::registry::QueueState;
use crate::flow_state::{Change, StepRecord, StoredStep};
use crate::store::envelope;
use crate::store::etcd::flows::{FlowChange, FlowWrite, LoadedFlow, ReadChange};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};

/// A queue a step may be sent to, with its tail as read (last, nonce).
pub(super) type QueueAt = (Arc<QueueState>, (u64, u64));

/// What a move of a large flow must read before it is built again: a step not read yet, or a
/// queue a step is sent to.
#[derive(Debug)]
pub(super) enum Need {
    Step(u32),
    Queue(String),
}

/// A flow as read, with what a change does to it: the etcd engine's [`StepBook`]. A large
/// flow is read in part: a step not read yet stops the move ([`Need`]), the writer reads it
/// (with the steps after it) and builds the move again; a move stops when its transaction is
/// full, deferring the rest of its work.
pub(super) struct EtcdBook {
    pub(super) flow: u64,
    pub(super) loaded: LoadedFlow,
    /// Ranges of steps read whole, `[from, to)` (a flow read in part).
    pub(super) read: Vec<(u32, u32)>,
    /// Records rewritten, by step.
    pub(super) written: BTreeMap<u32, StepRecord>,
    /// Steps sent: their queue's id and envelope, in order.
    pub(super) released: Vec<(u32, u32, Vec<u8>)>,
    /// Each queue a step may be sent to, with its tail as read (`None`: deleted).
    pub(super) queues: HashMap<String, Option<QueueAt>>,
    /// Messages other flows' parts of the same transaction append to each queue first.
    pub(super) base: HashMap<u32, u64>,
    pub(super) now: u64,
    /// The work a full transaction left.
    pub(super) deferred: Option<Vec<(u32, Change)>>,
    /// Changes applied (each one's record deleted, and compared).
    pub(super) changes: usize,
}

/// Operations, compares and value bytes one more step of a move may add at most: its record,
/// its kept message's delete, its append with an index entry, a new queue's tail.
const STEP_OPS: usize = 5;
const STEP_CMPS: usize = 3;
/// Value bytes a move leaves for its continuation record (5 bytes per step of work; a flow's
/// work is at most its dependency lists and its first steps, which `check_size` bounds).
const CONTINUATION_BYTES: usize = 5 * MAX_ETCD_FLOW_WORK;
/// Dependency-list entries and first steps of a flow on etcd, at most: its stored worklist
/// (5 bytes an entry) stays within 40 KB, so the 64 change records a mover reads at once stay
/// well below the client's 4 MiB answer.
pub(crate) const MAX_ETCD_FLOW_WORK: usize = 8_000;
/// Largest kept message (an encoded envelope) of a step of a flow larger than
/// [`WHOLE_FLOW_STEPS`](crate::store::etcd::flows::WHOLE_FLOW_STEPS) on etcd: a read of its steps stays far below the client's 4 MiB.
pub(crate) const MAX_ETCD_LARGE_FLOW_MESSAGE: usize = 32 << 10;

impl EtcdBook {
    pub(super) fn new(
        flow: u64,
        loaded: LoadedFlow,
        queues: HashMap<String, Option<QueueAt>>,
        now: u64,
    ) -> EtcdBook {
        EtcdBook {
            flow,
            loaded,
            read: Vec::new(),
            written: BTreeMap::new(),
            released: Vec::new(),
            queues,
            base: HashMap::new(),
            now,
            deferred: None,
            changes: 0,
        }
    }

    /// Notes that steps `from..from + count` are read: those without a record are not there.
    pub(super) fn read(&mut self, from: u32, count: u32) {
        self.read.push((from, from.saturating_add(count)));
    }

    /// Starts building again, from what is read (a step or queue read since, or a retry).
    pub(super) fn restart(&mut self) {
        self.written.clear();
        self.released.clear();
        self.deferred = None;
        self.changes = 0;
    }

    /// The operations, compares and value bytes of the write built so far (besides its
    /// change records).
    pub(super) fn cost(&self) -> (usize, usize, usize) {
        let mut qids: Vec<u32> = self.released.iter().map(|(_, q, _)| *q).collect();
        qids.sort_unstable();
        qids.dedup();
        let index = crate::store::etcd::index_entries(self.released.iter().map(|(_, _, e)| e.as_slice()));
        let ops = self.changes + self.written.len() + 2 * self.released.len() + index + qids.len();
        let cmps = self.changes + self.written.len() + 2 * qids.len();
        let bytes = self
            .written
            .values()
            .map(|r| 256 + r.group.len() + r.queue.len() + 4 * r.dependents.len() + result_len(&r.state))
            .sum::<usize>()
            + self.released.iter().map(|(_, _, e)| e.len() + 64).sum::<usize>();
        (ops, cmps, bytes)
    }

    /// The transaction applying the changes `changes` (their keys and revisions; the first
    /// rewritten to what is deferred, if anything is).
    pub(super) fn write(
        &self,
        changes: Vec<(Vec<u8>, i64)>,
        first_created: i64,
        mut nonce: impl FnMut() -> u64,
    ) -> FlowWrite {
        let rest = self.deferred.clone().map(|work| FlowChange::Continued { work });
        let mut w = FlowWrite { flow: self.flow, changes, first_created, rest, ..FlowWrite::default() };
        for (step, rec) in &self.written {
            let rev = self.loaded.steps.get(step).map_or(0, |(rev, _)| *rev);
            w.steps.push((*step, Some(rev), rec.clone()));
        }
        let mut appends: Vec<DeadLetterAppend> = Vec::new();
        for (step, qid, env) in &self.released {
            w.delete_messages.push(*step);
            match appends.iter_mut().find(|a| a.qid == *qid) {
                Some(a) => a.envelopes.push(env.clone()),
                None => {
                    let tail = self.queues.values().flatten().find(|(q, _)| q.id == *qid).map(|(_, t)| *t);
                    let (last, tail_nonce) = tail.unwrap_or_default();
                    appends.push(DeadLetterAppend {
                        qid: *qid,
                        expected_last: last,
                        expected_nonce: tail_nonce,
                        nonce: nonce(),
                        envelopes: vec![env.clone()],
                    });
                }
            }
        }
        w.appends = appends;
        w
    }

    /// Moves the flow as change `c` says (a change that no longer applies changes nothing);
    /// `Err`: something to read first.
    pub(super) fn apply(&mut self, c: &ReadChange) -> Result<(), Need> {
        self.changes += 1;
        match &c.change {
            FlowChange::Finished { step, queue, group, seq, outcome } => flow_moves::settle(
                self,
                (c.flow, *step),
                (queue, group, *seq),
                &outcome.kind,
                outcome.result.as_ref(),
            )
            .map(|_| ()),
            FlowChange::Revived { step, queue, seq, letter } => {
                flow_moves::revive(self, (c.flow, *step), (queue, *seq), (&letter.0, letter.1)).map(|_| ())
            }
            FlowChange::Continued { work } => flow_moves::resume(self, c.flow, work.clone()),
        }
    }
}

impl StepBook for EtcdBook {
    type Error = Need;

    fn load(&mut self, flow: u64, step: u32) -> Result<Option<StepRecord>, Need> {
        if flow != self.flow {
            return Ok(None);
        }
        if let Some(rec) = self.written.get(&step) {
            return Ok(Some(rec.clone()));
        }
        if let Some((_, rec)) = self.loaded.steps.get(&step) {
            return Ok(Some(rec.clone()));
        }
        match self.loaded.complete || self.read.iter().any(|(from, to)| (*from..*to).contains(&step)) {
            true => Ok(None),
            false => Err(Need::Step(step)),
        }
    }

    fn put(&mut self, _flow: u64, step: u32, rec: StepRecord) {
        self.written.insert(step, rec);
    }

    fn release(&mut self, flow: u64, step: u32, rec: &StepRecord) -> Result<Option<u64>, Need> {
        let Some(tail) = self.queues.get(&rec.queue) else { return Err(Need::Queue(rec.queue.clone())) };
        // (A step's record and its kept message are read together.)
        let Some(mut env) = self.loaded.messages.get(&step).cloned() else {
            tracing::error!(flow, step, "rockq: a ready flow step has no message");
            return Ok(None);
        };
        let Some((q, (last, _))) = tail else { return Ok(None) };
        let qid = q.id;
        let before = self.base.get(&qid).copied().unwrap_or(0)
            + self.released.iter().filter(|(_, id, _)| *id == qid).count() as u64;
        let seq = last + 1 + before;
        envelope::stamp(&mut env, self.now);
        tracing::debug!(flow, step, queue = %rec.queue, seq, "rockq: flow step sent");
        self.released.push((step, qid, env));
        Ok(Some(seq))
    }

    fn now_micros(&mut self) -> u64 {
        self.now
    }

    fn full(&self) -> bool {
        let (ops, cmps, bytes) = self.cost();
        let largest = self.loaded.messages.values().map(Vec::len).max().unwrap_or(0);
        let step_bytes = crate::flow_state::MAX_ETCD_STEP_RESULT_BYTES + 1024 + largest;
        // Beside the step records, appends and change records: the flow's compares.
        ops + STEP_OPS >= MAX_TXN_OPS - 2
            || cmps + STEP_CMPS >= MAX_TXN_OPS - 4
            || bytes + step_bytes + CONTINUATION_BYTES > MAX_TXN_BYTES
    }

    fn defer(&mut self, work: Vec<(u32, Change)>) {
        self.deferred = Some(work);
    }
}

/// The bytes of the result a step's record carries.
fn result_len(state: &StoredStep) -> usize {
    match state {
        StoredStep::Succeeded { result: Some(r), .. } => r.len(),
        _ => 0,
    }
}
