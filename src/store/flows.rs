//! Flows of dependent jobs in the store (`rockq.scheduled`, under the tag `w`): their keys,
//! the codecs of their records, the writer's operations on them, the reads behind
//! `Broker::flow_status`, and what the writer loads at open.
//!
//! | key | value |
//! | --- | --- |
//! | `wN` | the next flow id (u64 BE): ids are never handed out twice |
//! | `wF<flow u64 BE>` | the flow: `version (1), created µs u64, steps u32` |
//! | `wS<flow u64 BE><step u32 BE>` | a step (see [`encode_step`]) |
//! | `wD<flow u64 BE><step u32 BE>` | the steps it runs after: `u32 BE` each (never changes) |
//! | `wH<flow u64 BE><step u32 BE>` | the message of a step not sent yet (an envelope) |
//! | `wJ<queue_id u32 BE><seq u64 BE>` | which step a sent message is: `flow u64, step u32, group (UTF-8, the rest)` |

// Decoders read untrusted bytes: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use rocksdb::{DB, Direction, IteratorMode};

use super::batch::Batch;
use super::db::{ReadError, Store, bounded, storage};
use super::outcomes::{Reader, decode_outcome, encode_outcome};
use crate::error::{CorruptionError, StorageError};
use crate::flow_state::{FlowHeader, FlowStatus, RunWhen, StepRecord, StoredStep, flow_state};
use crate::stats::{JobOutcome, OutcomeKind};

const NEXT_ID: &[u8] = b"wN";
const FLOW_V1: u8 = 1;
const STEP_V1: u8 = 1;

fn flow_key(flow: u64) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..2].copy_from_slice(b"wF");
    k[2..].copy_from_slice(&flow.to_be_bytes());
    k
}

fn step_key(tag: u8, flow: u64, step: u32) -> [u8; 14] {
    let mut k = [0u8; 14];
    k[0] = b'w';
    k[1] = tag;
    k[2..10].copy_from_slice(&flow.to_be_bytes());
    k[10..].copy_from_slice(&step.to_be_bytes());
    k
}

/// Every `tag` key of one flow.
fn steps_of(tag: u8, flow: u64) -> (Vec<u8>, Vec<u8>) {
    let lo = [&[b'w', tag][..], &flow.to_be_bytes()].concat();
    let hi = match flow.checked_add(1) {
        Some(next) => [&[b'w', tag][..], &next.to_be_bytes()].concat(),
        None => vec![b'w', tag + 1],
    };
    (lo, hi)
}

fn job_key(queue_id: u32, seq: u64) -> [u8; 14] {
    let mut k = [0u8; 14];
    k[..2].copy_from_slice(b"wJ");
    k[2..6].copy_from_slice(&queue_id.to_be_bytes());
    k[6..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Whether a key of `rockq.scheduled` is a flow's (an export leaves them out).
pub(crate) fn is_flow_key(key: &[u8]) -> bool {
    key.first() == Some(&b'w')
}

const WAITING: u8 = 0;
const QUEUED: u8 = 1;
const SUCCEEDED: u8 = 2;
const FAILED: u8 = 3;

/// `version u8 (1), when u8 (0 all succeeded, 1 all finished), deps u32, succeeded u32,
/// failed u32, queue (u16 length, UTF-8), group (u16 length, UTF-8), dependents (u32 count,
/// u32 each), state u8 (0 waiting, 1 queued, 2 succeeded, 3 failed), then for every state but
/// waiting the job's seq u64, and for a finished one its outcome record (`outcomes.rs`) to the
/// end`. Every integer big-endian.
pub(crate) fn encode_step(s: &StepRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + s.queue.len() + s.group.len() + 4 * s.dependents.len());
    v.push(STEP_V1);
    v.push(match s.when {
        RunWhen::AllSucceeded => 0,
        RunWhen::AllFinished => 1,
    });
    for n in [s.deps, s.succeeded, s.failed] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    // Names are at most `MAX_NAME_LEN` bytes.
    for name in [&s.queue, &s.group] {
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name.as_bytes());
    }
    v.extend_from_slice(&(s.dependents.len() as u32).to_be_bytes());
    for d in &s.dependents {
        v.extend_from_slice(&d.to_be_bytes());
    }
    match &s.state {
        StoredStep::Waiting => v.push(WAITING),
        StoredStep::Queued { seq } => {
            v.push(QUEUED);
            v.extend_from_slice(&seq.to_be_bytes());
        }
        StoredStep::Succeeded { seq, at_micros, result } => {
            v.push(SUCCEEDED);
            v.extend_from_slice(&seq.to_be_bytes());
            let finished_at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(*at_micros);
            let o = JobOutcome { kind: OutcomeKind::Acked, finished_at, attempt: 0, result: result.clone() };
            v.extend_from_slice(&encode_outcome(&o));
        }
        StoredStep::Failed { seq, at_micros, how } => {
            v.push(FAILED);
            v.extend_from_slice(&seq.to_be_bytes());
            let finished_at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(*at_micros);
            let o = JobOutcome { kind: how.clone(), finished_at, attempt: 0, result: None };
            v.extend_from_slice(&encode_outcome(&o));
        }
    }
    v
}

pub(crate) fn decode_step(key: &[u8], v: &[u8]) -> Result<StepRecord, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("flow step", key, r);
    let mut r = Reader(v);
    if r.u8() != Some(STEP_V1) {
        return Err(bad("unknown version"));
    }
    let when = match r.u8() {
        Some(0) => RunWhen::AllSucceeded,
        Some(1) => RunWhen::AllFinished,
        _ => return Err(bad("unknown run condition")),
    };
    let deps = r.u32().ok_or_else(|| bad("no dependency count"))?;
    let succeeded = r.u32().ok_or_else(|| bad("no succeeded count"))?;
    let failed = r.u32().ok_or_else(|| bad("no failed count"))?;
    let mut name = |what: &str| -> Result<String, CorruptionError> {
        let len =
            r.take(2).and_then(|b| b.try_into().ok()).map(u16::from_be_bytes).ok_or_else(|| bad(what))?;
        r.text(usize::from(len)).ok_or_else(|| bad(what))
    };
    let queue = name("queue name cut short or not UTF-8")?;
    let group = name("group name cut short or not UTF-8")?;
    let n = r.u32().ok_or_else(|| bad("no dependents count"))? as usize;
    if n > r.0.len() / 4 {
        return Err(bad("dependents cut short"));
    }
    let mut dependents = Vec::with_capacity(n);
    for _ in 0..n {
        dependents.push(r.u32().ok_or_else(|| bad("dependents cut short"))?);
    }
    let state = match r.u8() {
        Some(WAITING) => StoredStep::Waiting,
        Some(tag @ (QUEUED | SUCCEEDED | FAILED)) => {
            let seq = r.u64().ok_or_else(|| bad("no sequence"))?;
            if tag == QUEUED {
                StoredStep::Queued { seq }
            } else {
                let o = decode_outcome(key, r.0)?;
                r.0 = &[];
                let at_micros = crate::store::micros_of(o.finished_at);
                match (tag, o.kind) {
                    (SUCCEEDED, OutcomeKind::Acked) => {
                        StoredStep::Succeeded { seq, at_micros, result: o.result }
                    }
                    (FAILED, how @ (OutcomeKind::Deleted | OutcomeKind::DeadLettered { .. })) => {
                        StoredStep::Failed { seq, at_micros, how }
                    }
                    _ => return Err(bad("outcome does not match the state")),
                }
            }
        }
        _ => return Err(bad("unknown state")),
    };
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(StepRecord { queue, group, when, deps, dependents, succeeded, failed, state })
}

pub(crate) fn encode_header(h: &FlowHeader) -> [u8; 13] {
    let mut v = [0u8; 13];
    v[0] = FLOW_V1;
    v[1..9].copy_from_slice(&h.created_micros.to_be_bytes());
    v[9..].copy_from_slice(&h.steps.to_be_bytes());
    v
}

pub(crate) fn decode_header(key: &[u8], v: &[u8]) -> Result<FlowHeader, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("flow", key, r);
    let mut r = Reader(v);
    if r.u8() != Some(FLOW_V1) {
        return Err(bad("unknown version"));
    }
    let created_micros = r.u64().ok_or_else(|| bad("no creation time"))?;
    let steps = r.u32().ok_or_else(|| bad("no step count"))?;
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(FlowHeader { created_micros, steps })
}

pub(crate) fn encode_deps(deps: &[u32]) -> Vec<u8> {
    deps.iter().flat_map(|d| d.to_be_bytes()).collect()
}

fn decode_deps(key: &[u8], v: &[u8]) -> Result<Vec<u32>, CorruptionError> {
    if !v.len().is_multiple_of(4) {
        return Err(CorruptionError::new("flow step dependencies", key, "not a list of u32"));
    }
    Ok(v.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(u32::from_be_bytes).collect())
}

fn encode_job(flow: u64, step: u32, group: &str) -> Vec<u8> {
    [&flow.to_be_bytes()[..], &step.to_be_bytes(), group.as_bytes()].concat()
}

fn decode_job(key: &[u8], v: &[u8]) -> Result<(u64, u32, String), CorruptionError> {
    let bad = |r: &str| CorruptionError::new("flow job", key, r);
    let mut r = Reader(v);
    let flow = r.u64().ok_or_else(|| bad("no flow id"))?;
    let step = r.u32().ok_or_else(|| bad("no step"))?;
    let group = std::str::from_utf8(r.0).map_err(|_| bad("group is not UTF-8"))?.to_owned();
    Ok((flow, step, group))
}

impl Batch<'_> {
    /// Persists the next flow id.
    pub fn put_next_flow_id(&mut self, next: u64) {
        self.wb.put_cf(self.cfs.scheduled, NEXT_ID, next.to_be_bytes());
    }

    /// Writes flow `flow`'s own record.
    pub fn put_flow(&mut self, flow: u64, h: &FlowHeader) {
        self.wb.put_cf(self.cfs.scheduled, flow_key(flow), encode_header(h));
    }

    /// Writes step `step` of flow `flow`.
    pub fn put_flow_step(&mut self, flow: u64, step: u32, s: &StepRecord) {
        self.wb.put_cf(self.cfs.scheduled, step_key(b'S', flow, step), encode_step(s));
    }

    /// Writes the steps that step `step` runs after.
    pub fn put_flow_deps(&mut self, flow: u64, step: u32, deps: &[u32]) {
        self.wb.put_cf(self.cfs.scheduled, step_key(b'D', flow, step), encode_deps(deps));
    }

    /// Keeps the message of step `step` until it is sent.
    pub fn put_flow_message(&mut self, flow: u64, step: u32, envelope: &[u8]) {
        self.wb.put_cf(self.cfs.scheduled, step_key(b'H', flow, step), envelope);
    }

    /// Deletes the kept message of step `step` (it was sent).
    pub fn delete_flow_message(&mut self, flow: u64, step: u32) {
        self.wb.delete_cf(self.cfs.scheduled, step_key(b'H', flow, step));
    }

    /// Records that message `seq` of queue `queue_id` is step `step` of flow `flow` for `group`.
    pub fn put_flow_job(&mut self, queue_id: u32, seq: u64, flow: u64, step: u32, group: &str) {
        self.wb.put_cf(self.cfs.scheduled, job_key(queue_id, seq), encode_job(flow, step, group));
    }

    /// Forgets which step message `seq` of queue `queue_id` is (its step finished).
    pub fn delete_flow_job(&mut self, queue_id: u32, seq: u64) {
        self.wb.delete_cf(self.cfs.scheduled, job_key(queue_id, seq));
    }

    /// Deletes every record of flow `flow` but its job index entries (the caller deletes
    /// those: it knows which of its steps are sent).
    pub fn delete_flow(&mut self, flow: u64) {
        self.wb.delete_cf(self.cfs.scheduled, flow_key(flow));
        for tag in [b'S', b'D', b'H'] {
            let (lo, hi) = steps_of(tag, flow);
            self.wb.delete_range_cf(self.cfs.scheduled, lo, hi);
        }
    }

    /// Step `step` of flow `flow` as last written (not this batch's own entries).
    pub fn flow_step(&self, flow: u64, step: u32) -> Result<Option<StepRecord>, ReadError> {
        let k = step_key(b'S', flow, step);
        match self.db.get_pinned_cf(self.cfs.scheduled, k).map_err(storage)? {
            Some(v) => Ok(Some(decode_step(&k, &v)?)),
            None => Ok(None),
        }
    }

    /// The kept message of step `step` of flow `flow` (not this batch's own entries).
    pub fn flow_message(&self, flow: u64, step: u32) -> Result<Option<Vec<u8>>, ReadError> {
        let k = step_key(b'H', flow, step);
        Ok(self.db.get_cf(self.cfs.scheduled, k).map_err(storage)?)
    }

    /// Flow `flow`'s own record (not this batch's own entries).
    pub fn flow(&self, flow: u64) -> Result<Option<FlowHeader>, ReadError> {
        let k = flow_key(flow);
        match self.db.get_pinned_cf(self.cfs.scheduled, k).map_err(storage)? {
            Some(v) => Ok(Some(decode_header(&k, &v)?)),
            None => Ok(None),
        }
    }
}

/// Flow `flow` as stored: every step with its dependencies, and the flow's state from them.
/// `None` if there is no such flow. Blocking.
pub(crate) fn flow_status(store: &Store, flow: u64) -> Result<Option<FlowStatus>, ReadError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(StorageError::new("the database is closed").into());
    };
    let cf = cfs.scheduled;
    let k = flow_key(flow);
    // One snapshot for the three reads: a flow deleted meanwhile reads as gone, not as damaged.
    let snap = db.snapshot();
    let Some(h) = snap.get_cf(cf, k).map_err(storage)? else { return Ok(None) };
    let read = |tag| -> Result<Vec<StepKv>, ReadError> {
        let (lo, hi) = steps_of(tag, flow);
        let mut out = Vec::new();
        let from = IteratorMode::From(&lo, Direction::Forward);
        for item in snap.iterator_cf_opt(cf, bounded(lo.clone(), hi), from) {
            let (k, v) = item.map_err(storage)?;
            out.push((step_of(&k)?, k.to_vec(), v.to_vec()));
        }
        Ok(out)
    };
    Ok(Some(status_of(flow, (&k, &h), read(b'D')?, read(b'S')?)?))
}

/// A record of one step as read: the step's number, the record's key and value.
pub(crate) type StepKv = (u32, Vec<u8>, Vec<u8>);

/// A flow's status from its records as read (`header`: its key and value; `deps` and `steps`:
/// each step's number, key and value), in either engine's layout.
pub(crate) fn status_of(
    flow: u64,
    (key, header): (&[u8], &[u8]),
    deps: Vec<StepKv>,
    records: Vec<StepKv>,
) -> Result<FlowStatus, CorruptionError> {
    let header = decode_header(key, header)?;
    // A damaged count must not size an allocation: no flow is larger than the builder allows.
    if header.steps as usize > crate::flow_state::MAX_FLOW_STEPS {
        return Err(CorruptionError::new("flow", key, "more steps than a flow may have"));
    }
    let mut after: Vec<Vec<u32>> = vec![Vec::new(); header.steps as usize];
    for (step, k, v) in deps {
        if let Some(slot) = after.get_mut(step as usize) {
            *slot = decode_deps(&k, &v)?;
        }
    }
    let mut steps = Vec::with_capacity(header.steps as usize);
    for (step, k, v) in records {
        let rec = decode_step(&k, &v)?;
        let after = after.get_mut(step as usize).map(std::mem::take).unwrap_or_default();
        steps.push(rec.status(step, after));
    }
    if steps.len() != header.steps as usize {
        return Err(CorruptionError::new("flow", key, "steps missing"));
    }
    let created_at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(header.created_micros);
    let state = flow_state(&steps);
    Ok(FlowStatus { id: flow, created_at, state, steps })
}

/// Up to `limit` flow ids from `from`, in id order. Blocking.
pub(crate) fn flow_ids(store: &Store, from: u64, limit: usize) -> Result<Vec<u64>, ReadError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(StorageError::new("the database is closed").into());
    };
    let lo = flow_key(from).to_vec();
    let hi = b"wG".to_vec();
    let mut out = Vec::new();
    for item in db.iterator_cf_opt(
        cfs.scheduled,
        bounded(lo.clone(), hi),
        IteratorMode::From(&lo, Direction::Forward),
    ) {
        if out.len() >= limit {
            break;
        }
        let (k, _) = item.map_err(storage)?;
        let id = k.get(2..10).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
        out.push(id.ok_or_else(|| CorruptionError::new("flow", &k, "expected wF<id u64>"))?);
    }
    Ok(out)
}

fn step_of(key: &[u8]) -> Result<u32, CorruptionError> {
    key.get(10..14)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| CorruptionError::new("flow step", key, "expected w<tag><flow u64><step u32>"))
}

/// A sent step's message, as loaded at open: `(queue id, seq) → (flow, step, group)`.
pub(crate) type LoadedFlowJob = ((u32, u64), (u64, u32, String));

/// Every sent step's job, and the next flow id.
#[derive(Debug, Default)]
pub(crate) struct LoadedFlows {
    pub jobs: Vec<LoadedFlowJob>,
    pub next_id: u64,
}

/// Every sent step's job and the next flow id (1 on a database without flows).
pub(super) fn load(db: &DB, cf: &rocksdb::ColumnFamily) -> Result<LoadedFlows, ReadError> {
    let next = match db.get_cf(cf, NEXT_ID).map_err(storage)? {
        Some(v) => super::scheduled::decode_u64(NEXT_ID, &v)?,
        None => 1,
    };
    let mut jobs = Vec::new();
    let (lo, hi) = (b"wJ".to_vec(), b"wK".to_vec());
    for item in db.iterator_cf_opt(cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward)) {
        let (k, v) = item.map_err(storage)?;
        let bad = || CorruptionError::new("flow job", &k, "expected wJ<queue u32><seq u64>");
        let qid = k.get(2..6).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes).ok_or_else(bad)?;
        let seq = k.get(6..14).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).ok_or_else(bad)?;
        jobs.push(((qid, seq), decode_job(&k, &v)?));
    }
    Ok(LoadedFlows { jobs, next_id: next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn step(state: StoredStep) -> StepRecord {
        StepRecord {
            queue: "q".into(),
            group: "g".into(),
            when: RunWhen::AllFinished,
            deps: 3,
            dependents: vec![7, 9],
            succeeded: 1,
            failed: 1,
            state,
        }
    }

    #[test]
    fn steps_round_trip_in_every_state() {
        let states = [
            StoredStep::Waiting,
            StoredStep::Queued { seq: 5 },
            StoredStep::Succeeded { seq: 5, at_micros: 77, result: Some(Bytes::from_static(b"r")) },
            StoredStep::Succeeded { seq: 5, at_micros: 77, result: None },
            StoredStep::Failed { seq: 6, at_micros: 78, how: OutcomeKind::Deleted },
            StoredStep::Failed {
                seq: 6,
                at_micros: 78,
                how: OutcomeKind::DeadLettered {
                    reason: "boom".into(),
                    dead_letter_queue: "q.dlq".into(),
                    dead_letter_seq: 3,
                },
            },
        ];
        for s in states {
            let rec = step(s);
            assert_eq!(decode_step(b"k", &encode_step(&rec)).unwrap(), rec);
        }
    }

    /// The layout is the format: a change to it must be a new version.
    #[test]
    fn the_step_layout_is_pinned() {
        let v = encode_step(&step(StoredStep::Queued { seq: 5 }));
        let want: Vec<u8> = [
            &[1u8, 1][..],
            &3u32.to_be_bytes(),
            &1u32.to_be_bytes(),
            &1u32.to_be_bytes(),
            &1u16.to_be_bytes(),
            b"q",
            &1u16.to_be_bytes(),
            b"g",
            &2u32.to_be_bytes(),
            &7u32.to_be_bytes(),
            &9u32.to_be_bytes(),
            &[1u8],
            &5u64.to_be_bytes(),
        ]
        .concat();
        assert_eq!(v, want);
    }

    #[test]
    fn damaged_records_are_corruption_not_panics() {
        let v = encode_step(&step(StoredStep::Succeeded { seq: 5, at_micros: 7, result: None }));
        for cut in 0..v.len() {
            assert!(decode_step(b"k", &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = v.clone();
        long.push(0);
        assert!(decode_step(b"k", &long).is_err());
        // A dependents count far beyond the record.
        let mut huge = encode_step(&step(StoredStep::Waiting));
        let at = 2 + 12 + 2 + 1 + 2 + 1;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_step(b"k", &huge).is_err());
        assert!(decode_header(b"k", &[1, 0]).is_err());
        assert!(decode_deps(b"k", &[0, 0, 1]).is_err());
        assert!(decode_job(b"k", &[0; 11]).is_err());
        let h = FlowHeader { created_micros: 9, steps: 4 };
        assert_eq!(decode_header(b"k", &encode_header(&h)).unwrap(), h);
    }
}
