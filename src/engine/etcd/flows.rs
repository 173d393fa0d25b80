//! Flows on etcd, the writer's side (the records and the protocol: `store/etcd/flows.rs`).
//!
//! - **Submit**: the flow's records and its first steps' messages in one transaction, compared
//!   with each queue's tail. A flow larger than one transaction holds is refused before
//!   anything is written (`HugeMessage`): its size is checked for the largest change it can
//!   take too, so every later move of it fits one transaction.
//! - **Finish**: the transaction that finishes a step's job (an ack, a dead letter, an
//!   operator's delete, a transaction's ack) puts a change record with it (`flow_change`).
//! - **Move**: any process applies change records as the namespace watch brings them (and at
//!   connect): the flow read as of one revision, moved on by `flow_moves` as embedded, written
//!   in one transaction compared with the change record, every step record and every tail —
//!   whichever process wins, each change is applied once, and a crash in between leaves it for
//!   the next.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::side::{register_queue, retrying};
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::flow_moves::{self, StepBook};
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::{FlowRequest, FlowStepSpec};
use crate::error::{Error, StorageError};
use crate::flow_state::{FlowHeader, FlowStep, Step, StepRecord, StoredStep, Submitted};
use crate::stats::{JobOutcome, OutcomeKind};
use crate::store::envelope;
use crate::store::etcd::flows::{FlowChange, FlowChangeWrite, FlowWrite, LoadedFlow, ReadChange};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// Change records one move reads (and applies) at a time.
const CHANGES_READ: usize = 64;
/// Refused applications of one change in a row before the writer lets other requests in.
const APPLY_TRIES: u32 = 4;
/// How long after a change could not be applied the writer looks again.
const RETRY_MOVE: Duration = Duration::from_secs(1);

impl Writer {
    pub(super) async fn flow(&mut self, req: FlowRequest) {
        match req {
            FlowRequest::Submit { steps, reply } => {
                let res = self.submit_flow(steps).await;
                let _ = reply.send(res);
            }
            FlowRequest::Delete { id, reply } => {
                let store = self.side.store.clone();
                let t = self.side.settings.request_timeout;
                let res = retrying(t, || store.delete_flow(id)).await.map_err(Error::from);
                let _ = reply.send(res);
            }
            FlowRequest::Move => self.move_flows().await,
        }
    }

    /// The change record a transaction finishing job `seq` of `g` carries, if the job is a
    /// flow step (`at`, from its message's header): its outcome, stamped now.
    pub(super) fn flow_change(
        &self,
        g: &WorkGroupState,
        seq: u64,
        at: Option<FlowStep>,
        (kind, attempt, result): (&OutcomeKind, u32, Option<&Bytes>),
    ) -> Option<FlowChangeWrite> {
        let at = at?;
        let finished_at = std::time::UNIX_EPOCH + Duration::from_micros(self.engine.clock().wall_micros());
        let outcome = JobOutcome { kind: kind.clone(), finished_at, attempt, result: result.cloned() };
        let change = FlowChange::Finished {
            step: at.step,
            queue: g.queue.name.to_string(),
            group: g.name.to_string(),
            seq,
            outcome,
        };
        Some(FlowChangeWrite { flow: at.flow, id: self.nonce(), change })
    }

    /// The flow step job `seq` of `queue` is, read from its stored message (`None`: none, the
    /// message is gone, or it does not decode). For the finishes that do not hold the message
    /// (an operator's).
    ///
    /// # Errors
    ///
    /// etcd did not answer: the finish must not go without its flow's change (the step would
    /// stay queued, its flow never finishing).
    pub(super) async fn flow_step_of(
        &self,
        queue: &QueueState,
        seq: u64,
    ) -> Result<Option<FlowStep>, StorageError> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let Some(stored) = retrying(t, || store.message(queue.id, seq)).await? else { return Ok(None) };
        Ok(envelope::decode(b"", &stored).ok().and_then(|env| FlowStep::in_headers(&env.headers)))
    }

    async fn submit_flow(&mut self, steps: Vec<FlowStepSpec>) -> Result<Submitted, Error> {
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
        check_size(&steps, &envs)?;
        let id = retrying(t, || store.take_flow_id()).await?;
        let mut envs = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let m = flow_moves::step_message(s.message.clone(), FlowStep { flow: id, step: i as u32 });
            envs.push(
                envelope::encode(&m, now).map_err(|e| StorageError::new(format!("flow step {i}: {e:?}")))?,
            );
        }
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
                let rec = StepRecord {
                    queue: s.queue.name.to_string(),
                    group: s.group.clone(),
                    when: s.when,
                    deps: s.after.len() as u32,
                    dependents: after.clone(),
                    succeeded: 0,
                    failed: 0,
                    state,
                };
                w.steps.push((step, None, rec));
            }
            match until_deadline(deadline, store.write_flow(&w)).await {
                Ok(true) => {
                    for a in &w.appends {
                        self.tails.insert(a.qid, (a.expected_last + a.envelopes.len() as u64, a.nonce));
                    }
                    self.sent_steps(&queues, &sent, &envs);
                    tracing::debug!(flow = id, sent = sent.len(), "rockq: flow submitted");
                    return Ok(Submitted { id, sent });
                }
                Ok(false) => {
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

    /// Notes the change records a write of this writer's put (at revision `rev`), for
    /// [`apply_own`](Self::apply_own).
    pub(super) fn wrote_changes(&mut self, changes: impl IntoIterator<Item = FlowChangeWrite>, rev: i64) {
        self.own_changes.extend(changes.into_iter().map(|c| (c, rev)));
    }

    /// Applies the change records this writer's writes put ([`wrote_changes`](Self::wrote_changes)),
    /// before their callers are answered and with no group's records held: a flow moves on as
    /// its step's job finishes, as embedded (a crash in between leaves them to the next move).
    /// One that cannot be applied now (an older change of its flow is pending, another
    /// process's, or etcd did not answer) is left to the mover, woken for it.
    pub(super) async fn apply_own(&mut self) {
        let own: Vec<ReadChange> = std::mem::take(&mut self.own_changes)
            .into_iter()
            .map(|(w, rev)| {
                let key = self.side.store.change_key(w.flow, w.id);
                ReadChange { key, rev, created: rev, flow: w.flow, change: w.change }
            })
            .collect();
        if own.is_empty() {
            return;
        }
        let left = self.apply_batch(own).await;
        if !left.is_empty() {
            self.side.flows_changed.notify_one();
        }
    }

    /// Applies `changes` (in the order they were written) with one read of every flow they
    /// move and one transaction for all of them, as far as one transaction holds; returns
    /// those not applied (they did not fit, or the transaction was refused: another process
    /// moved one of the flows, or an earlier change of one is pending), in order.
    async fn apply_batch(&mut self, changes: Vec<ReadChange>) -> Vec<ReadChange> {
        let mut flows: Vec<(u64, Vec<ReadChange>)> = Vec::new();
        for c in changes {
            match flows.iter_mut().find(|(f, _)| *f == c.flow) {
                Some((_, list)) => list.push(c),
                None => flows.push((c.flow, vec![c])),
            }
        }
        // One read: four ranges per flow.
        let take = flows.len().min(MAX_TXN_OPS / 4);
        let mut left: Vec<ReadChange> = flows.split_off(take).into_iter().flat_map(|(_, cs)| cs).collect();
        let store = self.side.store.clone();
        let deadline = Instant::now() + self.side.settings.request_timeout;
        let wanted: Vec<u64> = flows.iter().map(|(f, _)| *f).collect();
        let loaded = match until_deadline(deadline, store.load_flows(&wanted)).await {
            Ok(l) => l,
            Err(_) => {
                flows.into_iter().for_each(|(_, cs)| left.extend(cs));
                left.sort_by_key(|c| c.created);
                return left;
            }
        };
        let now = self.stamp();
        let mut queues: HashMap<String, Option<QueueAt>> = HashMap::new();
        let (mut parts, mut applied): (Vec<FlowWrite>, Vec<ReadChange>) = (Vec::new(), Vec::new());
        // Every message the transaction appends, by queue id, in order.
        let mut sent: Vec<(u32, Vec<u8>)> = Vec::new();
        let (mut ops, mut cmps, mut bytes) = (0, 0, 0);
        for ((flow, cs), got) in flows.into_iter().zip(loaded) {
            let Some(lf) = got else {
                // The flow was deleted: what is left of its changes goes (one whose delete
                // failed is left, so that the mover deletes it in a moment, not at the next
                // change of some other flow).
                for c in cs {
                    if until_deadline(deadline, store.delete_change(&c.key, c.rev)).await.is_err() {
                        left.push(c);
                    }
                }
                continue;
            };
            // The flow's pending changes from the oldest, as long as they are these (as read):
            // applied together they leave no older change behind. The rest of these wait
            // (another process's change is between), or are applied already.
            let mut present = Vec::new();
            let mut cs = cs;
            for (key, rev, _) in &lf.pending {
                match cs.iter().position(|c| c.key == *key && c.rev == *rev) {
                    Some(at) => present.push(cs.swap_remove(at)),
                    None => break,
                }
            }
            left.extend(cs.into_iter().filter(|c| lf.pending.iter().any(|p| p.0 == c.key)));
            if present.is_empty() {
                continue;
            }
            let mut known = true;
            for (_, rec) in lf.steps.values() {
                if matches!(rec.state, StoredStep::Waiting) && !queues.contains_key(&rec.queue) {
                    match self.flow_queue(&rec.queue, deadline).await {
                        Ok(q) => drop(queues.insert(rec.queue.clone(), q)),
                        Err(_) => known = false,
                    }
                }
            }
            if !known {
                left.extend(present);
                continue;
            }
            let mut base: HashMap<u32, u64> = HashMap::new();
            for (qid, _) in &sent {
                *base.entry(*qid).or_default() += 1;
            }
            let mut book = EtcdBook {
                flow,
                loaded: lf,
                written: BTreeMap::new(),
                released: Vec::new(),
                queues: queues.clone(),
                base,
                now,
            };
            for c in &present {
                book.apply(c);
            }
            let first_created = present.iter().map(|c| c.created).min().unwrap_or_default();
            let keys = present.iter().map(|c| (c.key.clone(), c.rev)).collect();
            let part = book.write(keys, first_created, || 0);
            // Its records, and its messages with a tail each (counted as if every queue were new);
            // compares apart (etcd holds both to 128): the flow's two, each change's, each
            // step record's, and two per queue appended to.
            let part_ops = part.ops() + book.released.len() * 2;
            let part_cmps = 2 + part.changes.len() + part.steps.len() + book.released.len() * 2;
            let part_bytes: usize =
                part.steps.iter().map(|(_, _, r)| 256 + r.group.len() + r.queue.len()).sum::<usize>()
                    + part.steps.iter().map(|(_, _, r)| result_len(&r.state)).sum::<usize>()
                    + book.released.iter().map(|(_, _, e)| e.len() + 64).sum::<usize>();
            if ops + part_ops > MAX_TXN_OPS - 1
                || cmps + part_cmps > MAX_TXN_OPS - 1
                || bytes + part_bytes > MAX_TXN_BYTES
            {
                left.extend(present);
                continue;
            }
            ops += part_ops;
            cmps += part_cmps;
            bytes += part_bytes;
            sent.extend(book.released.into_iter().map(|(_, qid, env)| (qid, env)));
            parts.push(FlowWrite { appends: Vec::new(), ..part });
            applied.extend(present);
        }
        if parts.is_empty() {
            left.sort_by_key(|c| c.created);
            return left;
        }
        let mut appends: Vec<DeadLetterAppend> = Vec::new();
        for (qid, env) in sent {
            match appends.iter_mut().find(|a| a.qid == qid) {
                Some(a) => a.envelopes.push(env),
                None => {
                    let tail = queues.values().flatten().find(|(q, _)| q.id == qid).map(|(_, t)| *t);
                    let (last, tail_nonce) = tail.unwrap_or_default();
                    appends.push(DeadLetterAppend {
                        qid,
                        expected_last: last,
                        expected_nonce: tail_nonce,
                        nonce: self.nonce(),
                        envelopes: vec![env],
                    });
                }
            }
        }
        match until_deadline(deadline, store.write_flows(&parts, &appends)).await {
            Ok(true) => {
                for a in &appends {
                    let last = a.expected_last + a.envelopes.len() as u64;
                    self.tails.insert(a.qid, (last, a.nonce));
                    if let Some((q, _)) = queues.values().flatten().find(|(q, _)| q.id == a.qid) {
                        super::writer::index_sent(q, a.expected_last + 1, &a.envelopes);
                        q.publish_max(last);
                        telemetry::produced(&q.name, a.envelopes.len() as u64);
                    }
                }
            }
            _ => {
                for a in &appends {
                    self.tails.remove(&a.qid);
                }
                left.extend(applied);
            }
        }
        left.sort_by_key(|c| c.created);
        left
    }

    /// Applies up to [`CHANGES_READ`] of the change records there are, in the order they were
    /// written, and wakes itself again if more are left (other requests go in between). A
    /// change that cannot be applied holds back the later changes of its flow only; the move
    /// looks again in a moment (the process applying them may stop before it is done).
    pub(super) async fn move_flows(&mut self) {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let later = |side: Arc<super::EtcdSide>| {
            tokio::spawn(async move {
                tokio::time::sleep(RETRY_MOVE).await;
                side.flows_changed.notify_one();
            });
        };
        let changes = match retrying(t, || store.flow_changes(CHANGES_READ)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "rockq: reading flow changes from etcd failed; trying again in a second");
                later(self.side.clone());
                return;
            }
        };
        let full = changes.len() >= CHANGES_READ;
        let read = changes.len();
        // Together first; what that did not apply, one change at a time.
        let changes = self.apply_batch(changes).await;
        let mut held = std::collections::HashSet::new();
        let mut applied = read - changes.len();
        for c in changes {
            if held.contains(&c.flow) {
                continue;
            }
            match self.apply_change(&c).await {
                Ok(()) => applied += 1,
                Err(e) => {
                    tracing::debug!(flow = c.flow, error = %e, "rockq: a flow change was not applied; trying again in a second");
                    held.insert(c.flow);
                }
            }
        }
        if !held.is_empty() {
            later(self.side.clone());
        }
        if full && applied > 0 {
            self.side.flows_changed.notify_one();
        }
    }

    /// Applies change `c` in one transaction, reading again after a refusal (another process
    /// applied it or an older change of the flow, or moved a tail), a few times: an error if
    /// it is still there.
    async fn apply_change(&mut self, c: &ReadChange) -> Result<(), Error> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let mut backoff = Duration::from_millis(5);
        for _ in 0..APPLY_TRIES {
            let Some((loaded, present)) = until_deadline(deadline, store.load_flow(c.flow, &c.key)).await?
            else {
                // The flow was deleted: what is left of its changes goes.
                until_deadline(deadline, store.delete_change(&c.key, c.rev)).await?;
                return Ok(());
            };
            if present != Some(c.rev) {
                return Ok(());
            }
            // Every queue a step may be sent to, with its tail.
            let mut queues = HashMap::new();
            for (_, rec) in loaded.steps.values() {
                if matches!(rec.state, StoredStep::Waiting) && !queues.contains_key(&rec.queue) {
                    let q = self.flow_queue(&rec.queue, deadline).await?;
                    queues.insert(rec.queue.clone(), q);
                }
            }
            let now = self.stamp();
            let mut book = EtcdBook {
                flow: c.flow,
                loaded,
                written: BTreeMap::new(),
                released: Vec::new(),
                queues,
                base: HashMap::new(),
                now,
            };
            book.apply(c);
            let w = book.write(vec![(c.key.clone(), c.rev)], c.created, || self.nonce());
            if w.ops() > MAX_TXN_OPS {
                // Not made by this build's submit (its size is checked for every move).
                tracing::error!(
                    flow = c.flow,
                    ops = w.ops(),
                    "rockq: a flow change does not fit one etcd transaction; left as it is"
                );
                return Err(StorageError::new("etcd: a flow change larger than one transaction").into());
            }
            match until_deadline(deadline, store.write_flow(&w)).await {
                Ok(true) => {
                    for a in &w.appends {
                        let last = a.expected_last + a.envelopes.len() as u64;
                        self.tails.insert(a.qid, (last, a.nonce));
                        if let Some((q, _)) = book.queues.values().flatten().find(|(q, _)| q.id == a.qid) {
                            super::writer::index_sent(q, a.expected_last + 1, &a.envelopes);
                            q.publish_max(last);
                            telemetry::produced(&q.name, a.envelopes.len() as u64);
                        }
                    }
                    return Ok(());
                }
                Ok(false) => {
                    for a in &w.appends {
                        self.tails.remove(&a.qid);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => {
                    for a in &w.appends {
                        self.tails.remove(&a.qid);
                    }
                    return Err(e.into());
                }
            }
        }
        Err(StorageError::new("etcd: a flow's records kept moving").into())
    }

    /// Queue `name` as a step is sent to it, with its tail (`None`: it was deleted).
    async fn flow_queue(&mut self, name: &str, deadline: Instant) -> Result<Option<QueueAt>, Error> {
        let store = self.side.store.clone();
        let q = match self.engine.registry.queue(name) {
            Some(q) => q,
            // Not learned here yet: read, never made (a deleted queue stays deleted).
            None => match until_deadline(deadline, store.queue(name)).await? {
                Some((meta, last)) => register_queue(&self.engine, name, &meta, last),
                None => return Ok(None),
            },
        };
        if q.is_deleted() {
            return Ok(None);
        }
        let tail = match self.tails.get(&q.id) {
            Some(&tail) => Some(tail),
            None => until_deadline(deadline, store.get_tail(q.id)).await?,
        };
        Ok(tail.map(|tail| (q, tail)))
    }
}

/// Refuses a flow larger than one transaction holds, for its submit and for the largest
/// change it can take: every step rewritten (its result at most
/// [`MAX_ETCD_STEP_RESULT_BYTES`](crate::flow_state::MAX_ETCD_STEP_RESULT_BYTES)) and sent,
/// with each queue's tail. What one change reads (every record and kept message of the flow)
/// is as large, far below the client's 4 MiB answer.
fn check_size(steps: &[FlowStepSpec], envs: &[Vec<u8>]) -> Result<(), Error> {
    let mut queues: Vec<&str> = steps.iter().map(|s| &*s.queue.name).collect();
    queues.sort_unstable();
    queues.dedup();
    let index = crate::store::etcd::index_entries(envs.iter().map(Vec::as_slice));
    // A move: the change's delete, and per step its record, its kept message's delete and its
    // append; a submit takes fewer (one record and one message per step, and the flow's).
    let ops = 1 + 3 * steps.len() + index + queues.len();
    let record = crate::flow_state::MAX_ETCD_STEP_RESULT_BYTES + 256;
    let bytes: usize = envs.iter().map(|e| e.len() + 64).sum::<usize>() + record * steps.len();
    if ops > MAX_TXN_OPS || bytes > MAX_TXN_BYTES {
        return Err(capability::refusal(Flavour::Etcd, Capability::HugeMessage));
    }
    Ok(())
}

/// The bytes of the result a step's record carries.
fn result_len(state: &StoredStep) -> usize {
    match state {
        StoredStep::Succeeded { result: Some(r), .. } => r.len(),
        _ => 0,
    }
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

/// `fut`, cut short at `deadline`, its error a storage error.
async fn until_deadline<T>(
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    super::side::until(deadline, fut).await
}

/// A queue a step may be sent to, with its tail as read (last, nonce).
type QueueAt = (Arc<QueueState>, (u64, u64));

/// A flow as read, with what a change does to it: the etcd engine's [`StepBook`].
struct EtcdBook {
    flow: u64,
    loaded: LoadedFlow,
    /// Records rewritten, by step.
    written: BTreeMap<u32, StepRecord>,
    /// Steps sent: their queue's id and envelope, in order.
    released: Vec<(u32, u32, Vec<u8>)>,
    /// Each queue a step may be sent to, with its tail as read (`None`: deleted).
    queues: HashMap<String, Option<QueueAt>>,
    /// Messages other flows' parts of the same transaction append to each queue first.
    base: HashMap<u32, u64>,
    now: u64,
}

impl EtcdBook {
    /// The transaction applying the change `change` (its key and revision).
    fn write(
        &self,
        changes: Vec<(Vec<u8>, i64)>,
        first_created: i64,
        mut nonce: impl FnMut() -> u64,
    ) -> FlowWrite {
        let mut w = FlowWrite { flow: self.flow, changes, first_created, ..FlowWrite::default() };
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
}

impl EtcdBook {
    /// Moves the flow as change `c` says (a change that no longer applies changes nothing).
    fn apply(&mut self, c: &ReadChange) {
        // (This book's reads and writes are in memory: they cannot fail.)
        let _ = match &c.change {
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
        };
    }
}

impl StepBook for EtcdBook {
    type Error = StorageError;

    fn load(&mut self, flow: u64, step: u32) -> Result<Option<StepRecord>, StorageError> {
        if flow != self.flow {
            return Ok(None);
        }
        if let Some(rec) = self.written.get(&step) {
            return Ok(Some(rec.clone()));
        }
        Ok(self.loaded.steps.get(&step).map(|(_, rec)| rec.clone()))
    }

    fn put(&mut self, _flow: u64, step: u32, rec: StepRecord) {
        self.written.insert(step, rec);
    }

    fn release(&mut self, flow: u64, step: u32, rec: &StepRecord) -> Result<Option<u64>, StorageError> {
        let Some(mut env) = self.loaded.messages.get(&step).cloned() else {
            tracing::error!(flow, step, "rockq: a ready flow step has no message");
            return Ok(None);
        };
        let Some(Some((q, (last, _)))) = self.queues.get(&rec.queue) else { return Ok(None) };
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
}
