//! Flows of dependent jobs in etcd (`engine/etcd/flows.rs` drives them):
//!
//! | key | value |
//! | --- | --- |
//! | `N meta/flow-id` | the next flow id not handed out, `u64` |
//! | `N fl/<flow u64>` | the flow (same codec as RocksDB's) |
//! | `N fs/<flow u64><step u32>` | a step (same codec) |
//! | `N fd/<flow u64><step u32>` | the steps it runs after (same codec; never changes) |
//! | `N fm/<flow u64><step u32>` | the message of a step not sent yet (an envelope) |
//! | `N sf/<flow u64><id u64>` | a change not applied yet: a step's job finished, or its dead letter redriven ([`FlowChange`]) |
//!
//! A job's outcome cannot move its flow in its own transaction on etcd: the steps after it
//! may be anywhere, and every process acks. So the transaction that finishes a step's job (or
//! redrives its dead letter) also puts a **change record**, and any process applies it in a
//! transaction of its own: the change record deleted, the step records rewritten and the ready
//! steps appended to their queues, compared with the change record, every step record and every
//! tail as read. Two processes applying one change cannot both succeed; a crash in between
//! leaves the record for the next process to apply. Change records lie inside the namespace
//! watch's range, so every process learns of one without polling.
//!
//! A small flow is written in one transaction (its records and its first steps' messages); a
//! larger one in parts, its record last with a continuation change sending its first steps. A
//! change is applied in one transaction, or, when its move is larger, in several: each applies
//! what fits and rewrites the change record into a continuation ([`FlowChange::Continued`]).

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::delayed::Marked;
use super::{DeadLetterAppend, EtcdStore, corrupt};
use crate::error::{CorruptionError, StorageError};
use crate::flow_state::{Change, FlowHeader, FlowStatus, StepRecord};
use crate::stats::JobOutcome;
use crate::store::flows::{StepKv, decode_step, encode_deps, encode_header, encode_step, status_of};
use crate::store::outcomes::{Reader, decode_outcome, encode_outcome};

const CHANGE_V1: u8 = 1;
/// Steps of a flow read whole by a move; a larger flow's moves read only the steps they touch.
pub(crate) const WHOLE_FLOW_STEPS: usize = 64;
/// Steps one read of a large flow's move asks for (two keys each).
pub(crate) const STEPS_READ: usize = 60;
/// Records one page of a flow's status read holds (each at most a step's largest result).
const STATUS_PAGE: i64 = 128;
const FINISHED: u8 = 0;
const REVIVED: u8 = 1;
const CONTINUED: u8 = 2;

/// A change to a flow not applied yet (`sf/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FlowChange {
    /// Job `seq` of `queue`, step `step`, was finished by `group`.
    Finished { step: u32, queue: String, group: String, seq: u64, outcome: JobOutcome },
    /// Step `step`'s dead letter `letter` (its queue and sequence) was redriven to `queue` as
    /// `seq`.
    Revived { step: u32, queue: String, seq: u64, letter: (String, u64) },
    /// What a move larger than one transaction left, to go on with (rewritten in place of the
    /// change that began it, so it keeps that change's place in the order): each step and the
    /// change it is to take, in the order taken from the end. A large flow's submit leaves its
    /// first steps so.
    Continued { work: Vec<(u32, Change)> },
}

impl FlowChange {
    /// `version u8 (1), kind u8 (0 finished, 1 revived), step u32, seq u64, queue (u16
    /// length, UTF-8)`, then for a finish `group (u16 length, UTF-8)` and its outcome record
    /// (`outcomes.rs`) to the end, for a redrive the letter's `seq u64` and its queue (UTF-8)
    /// to the end; a continuation is `version, kind (2), count u32`, then per step `step u32,
    /// change u8`. Integers big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![CHANGE_V1];
        let text = |v: &mut Vec<u8>, s: &str| {
            v.extend_from_slice(&(s.len() as u16).to_be_bytes());
            v.extend_from_slice(s.as_bytes());
        };
        match self {
            FlowChange::Finished { step, queue, group, seq, outcome } => {
                v.push(FINISHED);
                v.extend_from_slice(&step.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
                text(&mut v, queue);
                text(&mut v, group);
                v.extend_from_slice(&encode_outcome(outcome));
            }
            FlowChange::Revived { step, queue, seq, letter } => {
                v.push(REVIVED);
                v.extend_from_slice(&step.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
                text(&mut v, queue);
                v.extend_from_slice(&letter.1.to_be_bytes());
                v.extend_from_slice(letter.0.as_bytes());
            }
            FlowChange::Continued { work } => {
                v.push(CONTINUED);
                v.extend_from_slice(&(work.len() as u32).to_be_bytes());
                for (step, change) in work {
                    v.extend_from_slice(&step.to_be_bytes());
                    v.push(change.code());
                }
            }
        }
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<FlowChange, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("flow change", key, r);
        let mut r = Reader(v);
        if r.u8() != Some(CHANGE_V1) {
            return Err(bad("unknown version"));
        }
        let kind = r.u8().ok_or_else(|| bad("no kind"))?;
        if kind == CONTINUED {
            let n = r.u32().ok_or_else(|| bad("no count"))? as usize;
            if r.0.len() != n.saturating_mul(5) {
                return Err(bad("worklist length"));
            }
            let work =
                r.0.chunks_exact(5)
                    .map(|c| {
                        let step = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
                        Change::from_code(c[4]).map(|ch| (step, ch)).ok_or_else(|| bad("unknown change"))
                    })
                    .collect::<Result<_, _>>()?;
            return Ok(FlowChange::Continued { work });
        }
        let step = r.u32().ok_or_else(|| bad("no step"))?;
        let seq = r.u64().ok_or_else(|| bad("no sequence"))?;
        let mut text = |what: &str| -> Result<String, CorruptionError> {
            let len = r.take(2).and_then(|b| b.try_into().ok()).map(u16::from_be_bytes);
            let len = len.ok_or_else(|| bad(what))?;
            r.text(len as usize).ok_or_else(|| bad(what))
        };
        let queue = text("no queue")?;
        match kind {
            FINISHED => {
                let group = text("no group")?;
                let outcome = decode_outcome(key, r.0)?;
                Ok(FlowChange::Finished { step, queue, group, seq, outcome })
            }
            REVIVED => {
                let letter_seq = r.u64().ok_or_else(|| bad("no letter"))?;
                let letter_queue = std::str::from_utf8(r.0).map_err(|_| bad("letter queue is not UTF-8"))?;
                Ok(FlowChange::Revived { step, queue, seq, letter: (letter_queue.to_owned(), letter_seq) })
            }
            _ => Err(bad("unknown kind")),
        }
    }
}

impl FlowChange {
    /// The step a move of it touches first (the steps it touches next are numbered after it).
    pub fn first_step(&self) -> u32 {
        match self {
            FlowChange::Finished { step, .. } | FlowChange::Revived { step, .. } => *step,
            FlowChange::Continued { work } => work.iter().map(|(s, _)| *s).min().unwrap_or(0),
        }
    }
}

/// A change record a transaction puts with what it finishes (`sf/<flow><id>`; `id` unique per
/// change, kept through the transaction's retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlowChangeWrite {
    pub flow: u64,
    pub id: u64,
    pub change: FlowChange,
}

/// A change record as read: its key, revisions (last written, created), flow and change.
#[derive(Debug, Clone)]
pub(crate) struct ReadChange {
    pub key: Vec<u8>,
    pub rev: i64,
    pub created: i64,
    pub flow: u64,
    pub change: FlowChange,
}

/// A flow as a change reads it before applying: every step record with its revision, and
/// the kept messages of the steps not sent yet.
#[derive(Debug, Default)]
pub(crate) struct LoadedFlow {
    pub steps: std::collections::BTreeMap<u32, (i64, StepRecord)>,
    pub messages: std::collections::BTreeMap<u32, Vec<u8>>,
    /// Its changes not applied yet (key, revision, `create_revision`), oldest first.
    pub pending: Vec<(Vec<u8>, i64, i64)>,
    /// Every step is here (`false`: a large flow, read in part: only the steps asked for).
    pub complete: bool,
}

/// One transaction creating or moving a flow ([`EtcdStore::write_flow`]).
#[derive(Debug, Default)]
pub(crate) struct FlowWrite {
    pub flow: u64,
    /// A submit: the flow's record, put if the flow is not there yet.
    pub header: Option<FlowHeader>,
    /// Changes applied: each one's key and revision as read (compared, deleted), with the
    /// earliest one's `create_revision`: no change of the flow created before it may be left
    /// (changes apply in the order they were written). The flow is compared present.
    pub changes: Vec<(Vec<u8>, i64)>,
    pub first_created: i64,
    /// What the move could not fit: the first change is rewritten to it instead of deleted
    /// (it keeps its `create_revision`, so its place in the order).
    pub rest: Option<FlowChange>,
    /// Change records put (a large flow's submit: its first steps, to send).
    pub put_changes: Vec<FlowChangeWrite>,
    /// A large flow's record, written after its parts: compared with the submit not
    /// abandoned (`delete_flow_parts` marks it so), so that a try of the record still in
    /// flight cannot land after the parts were deleted (a flow with no steps, unreadable).
    pub after_parts: bool,
    /// Step records: each step's number, its revision as read (compared; `None`: a new step),
    /// and its record.
    pub steps: Vec<(u32, Option<i64>, StepRecord)>,
    /// New steps' dependency lists.
    pub deps: Vec<(u32, Vec<u32>)>,
    /// Kept messages of steps not sent yet, put.
    pub put_messages: Vec<(u32, Vec<u8>)>,
    /// Kept messages of steps sent now, deleted.
    pub delete_messages: Vec<u32>,
    /// Steps sent now, per queue: appended at its tail as read.
    pub appends: Vec<DeadLetterAppend>,
}

impl FlowWrite {
    /// The operations of its transaction.
    pub fn ops(&self) -> usize {
        let appended: usize = self
            .appends
            .iter()
            .map(|a| 1 + a.envelopes.len() + super::index_entries(a.envelopes.iter().map(Vec::as_slice)))
            .sum();
        usize::from(self.header.is_some())
            + self.changes.len()
            + self.put_changes.len()
            + self.steps.len()
            + self.deps.len()
            + self.put_messages.len()
            + self.delete_messages.len()
            + appended
    }
}

/// A flow's changes not applied yet, as a keys-only read of its `sf/` range found them: each
/// one's key, revision and `create_revision`, oldest first.
fn pending_of(changes: &etcd_client::GetResponse) -> Vec<(Vec<u8>, i64, i64)> {
    let mut pending: Vec<_> =
        changes.kvs().iter().map(|kv| (kv.key().to_vec(), kv.mod_revision(), kv.create_revision())).collect();
    pending.sort_by_key(|p| p.2);
    pending
}

fn flow_step_rest(flow: u64, step: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&flow.to_be_bytes());
    k[8..].copy_from_slice(&step.to_be_bytes());
    k
}

impl EtcdStore {
    fn flow_key(&self, flow: u64) -> Vec<u8> {
        self.key(b"fl/", &flow.to_be_bytes())
    }

    /// The mark a large flow's abandoned submit leaves (`fx/<flow>`), put as its parts are
    /// deleted: a write of the submit still in flight (a part, or the flow's record) compares
    /// it absent, so none can land after the deletion. Put under a lease that outlives every
    /// such write by far ([`delete_flow_parts`](Self::delete_flow_parts)), so marks do not
    /// pile up in the namespace; ids are never reused.
    fn abandoned_key(&self, flow: u64) -> Vec<u8> {
        self.key(b"fx/", &flow.to_be_bytes())
    }
    fn flow_step_key(&self, kind: &[u8], flow: u64, step: u32) -> Vec<u8> {
        self.key(kind, &flow_step_rest(flow, step))
    }
    /// Every `kind` key of flow `flow`: the range `[lo, hi)`.
    fn flow_range(&self, kind: &[u8], flow: u64) -> (Vec<u8>, Vec<u8>) {
        let lo = self.key(kind, &flow.to_be_bytes());
        let hi = match flow.checked_add(1) {
            Some(next) => self.key(kind, &next.to_be_bytes()),
            None => crate::store::prefix_end(&self.key(kind, b"")).unwrap_or_default(),
        };
        (lo, hi)
    }
    pub fn change_key(&self, flow: u64, id: u64) -> Vec<u8> {
        let mut rest = flow.to_be_bytes().to_vec();
        rest.extend_from_slice(&id.to_be_bytes());
        self.key(b"sf/", &rest)
    }
    pub(super) fn change_prefix(&self) -> Vec<u8> {
        self.key(b"sf/", b"")
    }

    /// The step number at the end of a `fs/`, `fd/` or `fm/` key.
    fn step_of(&self, key: &[u8]) -> Result<u32, StorageError> {
        let bad = || corrupt(CorruptionError::new("flow step", key, "expected <flow u64><step u32>"));
        let rest = key.get(self.ns.len() + 3..).ok_or_else(bad)?;
        let rest: &[u8; 12] = rest.try_into().map_err(|_| bad())?;
        let step: [u8; 4] = rest[8..].try_into().map_err(|_| bad())?;
        Ok(u32::from_be_bytes(step))
    }

    /// The flow a change key names (`None`: not a change key).
    pub(super) fn flow_of_change(&self, key: &[u8]) -> Option<u64> {
        let rest = key.strip_prefix(self.change_prefix().as_slice())?;
        let rest: &[u8; 16] = rest.try_into().ok()?;
        Some(u64::from_be_bytes(rest[..8].try_into().ok()?))
    }

    /// Puts `w`'s change record (a transaction finishing a step's job, or redriving its dead
    /// letter).
    pub(super) fn push_flow_change(&self, w: &FlowChangeWrite, ops: &mut Vec<TxnOp>) {
        ops.push(TxnOp::put(self.change_key(w.flow, w.id), w.change.encode(), None));
    }

    /// A fresh flow id, taken from the namespace's counter by a compare-and-set: no two
    /// processes (and no restart) hand out one twice.
    pub async fn take_flow_id(&self) -> Result<u64, StorageError> {
        self.take_ids(b"flow-id", 1, "flow id").await
    }

    /// Writes `w` in one transaction: its revision if written, `None` if a compare failed
    /// (the flow there already or gone, the change applied already, a step record or a tail
    /// moved): nothing written, the caller reads again.
    pub async fn write_flow(&self, w: &FlowWrite) -> Result<Option<i64>, StorageError> {
        self.write_flows(std::slice::from_ref(w), &w.appends).await
    }

    /// Writes `parts` (several flows' writes, their own appends left out) and `appends` in one
    /// transaction, as [`write_flow`](Self::write_flow) writes one.
    pub async fn write_flows(
        &self,
        parts: &[FlowWrite],
        appends: &[DeadLetterAppend],
    ) -> Result<Option<i64>, StorageError> {
        let mut cmps = Vec::new();
        let mut ops = Vec::new();
        for w in parts {
            self.push_flow_write(w, &mut cmps, &mut ops);
        }
        for a in appends {
            self.push_append(a, &mut cmps, &mut ops);
        }
        // Tests lose the request (not applied) or its answer (applied).
        crate::faults::check("rockq-etcd-flow-request")?;
        let txn = Txn::new().when(cmps).and_then(ops);
        #[cfg(feature = "failpoints")]
        let txn = self.late("rockq-etcd-flow-request-late", txn)?;
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-flow-answer")?;
        Ok(resp.succeeded().then(|| resp.header().map(|h| h.revision()).unwrap_or_default()))
    }

    /// Adds one flow's compares and writes, its appends left out.
    fn push_flow_write(&self, w: &FlowWrite, cmps: &mut Vec<Compare>, ops: &mut Vec<TxnOp>) {
        let fkey = self.flow_key(w.flow);
        match &w.header {
            Some(h) => {
                cmps.push(Compare::version(fkey.clone(), CompareOp::Equal, 0));
                ops.push(TxnOp::put(fkey, encode_header(h).to_vec(), None));
            }
            None => cmps.push(Compare::version(fkey, CompareOp::Greater, 0)),
        }
        if w.after_parts {
            cmps.push(Compare::version(self.abandoned_key(w.flow), CompareOp::Equal, 0));
        }
        if !w.changes.is_empty() {
            let (lo, hi) = self.flow_range(b"sf/", w.flow);
            cmps.push(Compare::create_revision(lo, CompareOp::Greater, w.first_created - 1).with_range(hi));
        }
        for (i, (key, rev)) in w.changes.iter().enumerate() {
            cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
            match (&w.rest, i) {
                (Some(rest), 0) => ops.push(TxnOp::put(key.clone(), rest.encode(), None)),
                _ => ops.push(TxnOp::delete(key.clone(), None)),
            }
        }
        for c in &w.put_changes {
            self.push_flow_change(c, ops);
        }
        for (step, rev, rec) in &w.steps {
            let key = self.flow_step_key(b"fs/", w.flow, *step);
            if let Some(rev) = rev {
                cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
            }
            ops.push(TxnOp::put(key, encode_step(rec), None));
        }
        for (step, deps) in &w.deps {
            ops.push(TxnOp::put(self.flow_step_key(b"fd/", w.flow, *step), encode_deps(deps), None));
        }
        for (step, env) in &w.put_messages {
            ops.push(TxnOp::put(self.flow_step_key(b"fm/", w.flow, *step), env.clone(), None));
        }
        for step in &w.delete_messages {
            ops.push(TxnOp::delete(self.flow_step_key(b"fm/", w.flow, *step), None));
        }
    }

    /// Several flows' step records (with their revisions), kept messages and pending changes,
    /// in one read at one revision (four operations per flow). A flow of more than
    /// [`WHOLE_FLOW_STEPS`] steps is read in part (`complete` false: read its steps with
    /// [`load_steps`](Self::load_steps)), so that no answer nears the client's limit.
    pub async fn load_flows(&self, flows: &[u64]) -> Result<Vec<Option<LoadedFlow>>, StorageError> {
        let mut ops = Vec::new();
        let limit = WHOLE_FLOW_STEPS as i64;
        for flow in flows {
            let range = |kind: &[u8], opts: GetOptions| {
                let (lo, hi) = self.flow_range(kind, *flow);
                TxnOp::get(lo, Some(opts.with_range(hi)))
            };
            ops.push(TxnOp::get(self.flow_key(*flow), Some(GetOptions::new().with_count_only())));
            ops.push(range(b"fs/", GetOptions::new().with_limit(limit)));
            ops.push(range(b"fm/", GetOptions::new().with_limit(limit)));
            ops.push(range(b"sf/", GetOptions::new().with_keys_only()));
        }
        let resp = self.kv().txn(Txn::new().and_then(ops)).await?;
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let short = || StorageError::new("etcd: a read of flows answered without every range");
        let mut out = Vec::with_capacity(flows.len());
        for _ in flows {
            let (header, steps, messages, changes) = (
                gets.next().ok_or_else(short)?,
                gets.next().ok_or_else(short)?,
                gets.next().ok_or_else(short)?,
                gets.next().ok_or_else(short)?,
            );
            if header.count() == 0 {
                out.push(None);
                continue;
            }
            let mut loaded =
                LoadedFlow { complete: !steps.more() && !messages.more(), ..LoadedFlow::default() };
            for kv in steps.kvs() {
                let step = self.step_of(kv.key())?;
                let rec = decode_step(kv.key(), kv.value()).map_err(corrupt)?;
                loaded.steps.insert(step, (kv.mod_revision(), rec));
            }
            for kv in messages.kvs() {
                loaded.messages.insert(self.step_of(kv.key())?, kv.value().to_vec());
            }
            if !loaded.complete {
                // Read in part: only the steps both ranges cover whole (a record without the
                // message the other range cut off would read as a step with none).
                let last = |g: &etcd_client::GetResponse| match g.more() {
                    true => g.kvs().last().map(|kv| self.step_of(kv.key())).transpose(),
                    false => Ok(None),
                };
                let cut = [last(&steps)?, last(&messages)?].into_iter().flatten().min().unwrap_or(0);
                loaded.steps.retain(|s, _| *s <= cut);
                loaded.messages.retain(|s, _| *s <= cut);
            }
            loaded.pending = pending_of(&changes);
            out.push(Some(loaded));
        }
        Ok(out)
    }

    /// Steps `from..from + count` of flow `flow` (at most [`STEPS_READ`]): each one's record
    /// with its revision and its kept message, with the flow's pending changes, as of one
    /// revision (`None`: no such flow). For a move of a large flow, which reads what it
    /// touches (the steps after a step are numbered after it: one range reads a chain on).
    pub async fn load_steps(
        &self,
        flow: u64,
        from: u32,
        count: u32,
    ) -> Result<Option<LoadedFlow>, StorageError> {
        let count = count.min(STEPS_READ as u32);
        let (lo, hi) = self.flow_range(b"sf/", flow);
        let steps = |kind: &[u8]| {
            let lo = self.flow_step_key(kind, flow, from);
            let hi = match from.checked_add(count) {
                Some(end) => self.flow_step_key(kind, flow, end),
                None => self.flow_range(kind, flow).1,
            };
            TxnOp::get(lo, Some(GetOptions::new().with_range(hi)))
        };
        let ops = vec![
            TxnOp::get(self.flow_key(flow), Some(GetOptions::new().with_count_only())),
            TxnOp::get(lo, Some(GetOptions::new().with_range(hi).with_keys_only())),
            steps(b"fs/"),
            steps(b"fm/"),
        ];
        let resp = self.kv().txn(Txn::new().and_then(ops)).await?;
        let gets: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [header, changes, records, messages] = gets.as_slice() else {
            return Err(StorageError::new("etcd: a read of flow steps answered without its four ranges"));
        };
        if header.count() == 0 {
            return Ok(None);
        }
        let mut loaded = LoadedFlow::default();
        for kv in records.kvs() {
            let rec = decode_step(kv.key(), kv.value()).map_err(corrupt)?;
            loaded.steps.insert(self.step_of(kv.key())?, (kv.mod_revision(), rec));
        }
        for kv in messages.kvs() {
            loaded.messages.insert(self.step_of(kv.key())?, kv.value().to_vec());
        }
        loaded.pending = pending_of(changes);
        Ok(Some(loaded))
    }

    /// Tests deliver a request late, as a slow member would (failpoint `point`): it is sent by
    /// a task once failpoint `rockq-etcd-flow-late-send` lets it go — after the caller, answered
    /// with an error now, gave up — and `rockq-etcd-flow-late-sent` is reached once answered.
    #[cfg(feature = "failpoints")]
    fn late(&self, point: &str, txn: Txn) -> Result<Txn, StorageError> {
        if crate::faults::check(point).is_ok() {
            return Ok(txn);
        }
        let members = self.members.clone();
        tokio::spawn(async move {
            let held = tokio::task::spawn_blocking(|| crate::faults::reached("rockq-etcd-flow-late-send"));
            let _ = held.await;
            let _ = super::members::Kv(&members).txn(txn).await;
            crate::faults::reached("rockq-etcd-flow-late-sent");
        });
        Err(StorageError::new(format!("etcd: no answer (failpoint {point})")))
    }

    /// Writes part of a large flow's submit before its flow record: new step records, their
    /// dependency lists and kept messages, if the flow record is not there yet and the submit
    /// was not abandoned (`false`: nothing written). Without the flow record nothing reads them; a submit cut short
    /// deletes them ([`delete_flow_parts`](Self::delete_flow_parts)).
    pub async fn write_flow_steps(&self, w: &FlowWrite) -> Result<bool, StorageError> {
        let fkey = self.flow_key(w.flow);
        let mut ops = Vec::new();
        for (step, _, rec) in &w.steps {
            ops.push(TxnOp::put(self.flow_step_key(b"fs/", w.flow, *step), encode_step(rec), None));
        }
        for (step, deps) in &w.deps {
            ops.push(TxnOp::put(self.flow_step_key(b"fd/", w.flow, *step), encode_deps(deps), None));
        }
        for (step, env) in &w.put_messages {
            ops.push(TxnOp::put(self.flow_step_key(b"fm/", w.flow, *step), env.clone(), None));
        }
        crate::faults::check("rockq-etcd-flow-request")?;
        let cmps = [
            Compare::version(fkey, CompareOp::Equal, 0),
            Compare::version(self.abandoned_key(w.flow), CompareOp::Equal, 0),
        ];
        let txn = Txn::new().when(cmps).and_then(ops);
        #[cfg(feature = "failpoints")]
        let txn = self.late("rockq-etcd-flow-steps-late", txn)?;
        let written = self.kv().txn(txn).await?.succeeded();
        crate::faults::check("rockq-etcd-flow-answer")?;
        Ok(written)
    }

    /// Deletes what a large flow's submit wrote before its flow record, if the flow record is
    /// not there (the submit failed before it), and marks the submit abandoned, under
    /// `mark_lease` if given (none: the mark stays): `false` if the record is there (nothing
    /// deleted).
    pub async fn delete_flow_parts(&self, flow: u64, mark_lease: Option<i64>) -> Result<bool, StorageError> {
        let fkey = self.flow_key(flow);
        let lease = mark_lease.map(|l| PutOptions::new().with_lease(l));
        let mut ops = vec![TxnOp::put(self.abandoned_key(flow), Vec::new(), lease)];
        for kind in [&b"fs/"[..], b"fd/", b"fm/"] {
            let (lo, hi) = self.flow_range(kind, flow);
            ops.push(TxnOp::delete(lo, Some(DeleteOptions::new().with_range(hi))));
        }
        let txn = Txn::new().when([Compare::version(fkey, CompareOp::Equal, 0)]).and_then(ops);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// Deletes change record `key` if its revision is still `rev` (a change of a deleted flow).
    pub async fn delete_change(&self, key: &[u8], rev: i64) -> Result<(), StorageError> {
        let txn = Txn::new()
            .when([Compare::mod_revision(key.to_vec(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        self.kv().txn(txn).await?;
        Ok(())
    }

    /// Flow `flow` as it stands (`None`: no such flow), read as of one revision, in pages of
    /// [`STATUS_PAGE`] records (a large flow's results would pass the client's answer limit).
    pub async fn flow_status(&self, flow: u64) -> Result<Option<FlowStatus>, StorageError> {
        let fkey = self.flow_key(flow);
        let got = self.kv().get(fkey, None).await?;
        let Some(h) = got.kvs().first() else { return Ok(None) };
        let rev = got.header().map(|h| h.revision()).unwrap_or_default();
        let deps = self.flow_records(b"fd/", flow, rev).await?;
        let steps = self.flow_records(b"fs/", flow, rev).await?;
        let status = status_of(flow, (h.key(), h.value()), deps, steps).map_err(corrupt)?;
        Ok(Some(status))
    }

    /// Every `kind` record of flow `flow` as of revision `rev`, read in pages.
    async fn flow_records(&self, kind: &[u8], flow: u64, rev: i64) -> Result<Vec<StepKv>, StorageError> {
        let (mut from, hi) = self.flow_range(kind, flow);
        let mut out = Vec::new();
        loop {
            let opts = GetOptions::new().with_range(hi.clone()).with_limit(STATUS_PAGE).with_revision(rev);
            let got = self.kv().get(from.clone(), Some(opts)).await?;
            for kv in got.kvs() {
                out.push((self.step_of(kv.key())?, kv.key().to_vec(), kv.value().to_vec()));
            }
            match got.kvs().last() {
                Some(last) if got.more() => from = [last.key(), &[0][..]].concat(),
                _ => return Ok(out),
            }
        }
    }

    /// Up to `limit` flow ids from `from`, in id order.
    pub async fn flow_ids(&self, from: u64, limit: usize) -> Result<Vec<u64>, StorageError> {
        let lo = self.flow_key(from);
        let hi = crate::store::prefix_end(&self.key(b"fl/", b"")).unwrap_or_default();
        let opts = GetOptions::new()
            .with_range(hi)
            .with_keys_only()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .with_sort(SortTarget::Key, SortOrder::Ascend);
        let got = self.kv().get(lo, Some(opts)).await?;
        let prefix = self.key(b"fl/", b"");
        got.kvs()
            .iter()
            .map(|kv| {
                let id = kv.key().strip_prefix(prefix.as_slice()).and_then(|b| b.try_into().ok());
                id.map(u64::from_be_bytes)
                    .ok_or_else(|| corrupt(CorruptionError::new("flow", kv.key(), "expected fl/<id u64>")))
            })
            .collect()
    }

    /// Deletes flow `flow`'s records, its changes not applied yet included, with the call's
    /// marker if there was such a flow: `false` if there was none (what a large flow's submit
    /// killed before its flow's record wrote is deleted all the same).
    pub async fn delete_flow(&self, flow: u64, marked: Marked) -> Result<bool, StorageError> {
        let fkey = self.flow_key(flow);
        let mut ops = vec![TxnOp::delete(fkey.clone(), None)];
        self.push_marker(Some(marked), &mut ops);
        let mut parts = Vec::new();
        for kind in [&b"fs/"[..], b"fd/", b"fm/", b"sf/"] {
            let (lo, hi) = self.flow_range(kind, flow);
            ops.push(TxnOp::delete(lo.clone(), Some(DeleteOptions::new().with_range(hi.clone()))));
            parts.push(TxnOp::delete(lo, Some(DeleteOptions::new().with_range(hi))));
        }
        let txn =
            Txn::new().when([Compare::version(fkey, CompareOp::Greater, 0)]).and_then(ops).or_else(parts);
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-flow-delete-answer")?;
        Ok(resp.succeeded())
    }

    /// Up to `limit` changes not applied yet, in the order they were written.
    pub async fn flow_changes(&self, limit: usize) -> Result<Vec<ReadChange>, StorageError> {
        let prefix = self.change_prefix();
        let opts = GetOptions::new()
            .with_prefix()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let got = self.kv().get(prefix, Some(opts)).await?;
        got.kvs()
            .iter()
            .map(|kv| {
                let flow = self.flow_of_change(kv.key()).ok_or_else(|| {
                    corrupt(CorruptionError::new("flow change", kv.key(), "expected sf/<flow u64><id u64>"))
                })?;
                let change = FlowChange::decode(kv.key(), kv.value()).map_err(corrupt)?;
                let (rev, created) = (kv.mod_revision(), kv.create_revision());
                Ok(ReadChange { key: kv.key().to_vec(), rev, created, flow, change })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::OutcomeKind;

    #[test]
    fn changes_round_trip_and_damage_is_corruption() {
        let finished = FlowChange::Finished {
            step: 3,
            queue: "q".into(),
            group: "g".into(),
            seq: 9,
            outcome: JobOutcome {
                kind: OutcomeKind::Acked,
                finished_at: std::time::UNIX_EPOCH + std::time::Duration::from_micros(5),
                attempt: 2,
                result: Some(bytes::Bytes::from_static(b"r")),
            },
        };
        let revived = FlowChange::Revived { step: 1, queue: "q".into(), seq: 4, letter: ("dlq".into(), 7) };
        let continued = FlowChange::Continued {
            work: vec![(4, Change::Succeeded), (9, Change::Failed), (2, Change::Revived), (0, Change::Start)],
        };
        assert!(FlowChange::decode(b"k", &[1, 2, 0, 0, 0, 1, 0, 0, 0, 1, 7]).is_err(), "an unknown change");
        for c in [finished, revived, continued] {
            let v = c.encode();
            assert_eq!(FlowChange::decode(b"k", &v).unwrap(), c);
            for cut in 0..v.len() {
                let _ = FlowChange::decode(b"k", &v[..cut]);
            }
            assert!(FlowChange::decode(b"k", &v[..v.len() / 2]).is_err());
        }
        assert!(FlowChange::decode(b"k", &[2, 0]).is_err());
    }
}
