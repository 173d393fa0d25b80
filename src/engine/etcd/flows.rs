//! Flows on etcd, the writer's side (the records and the protocol: `store/etcd/flows.rs`).
//!
//! - **Submit**: the flow's records and its first steps' messages in one transaction, compared
//!   with each queue's tail; a flow larger than that in parts (`LargeSubmit`, a task of its
//!   own beside the writer), its record last, with a continuation the mover applies to send
//!   its first steps.
//! - **Finish**: the transaction that finishes a step's job (an ack, a dead letter, an
//!   operator's delete, a transaction's ack) puts a change record with it (`flow_change`).
//! - **Move**: any process applies change records as the namespace watch brings them (and at
//!   connect): the flow read as of one revision, moved on by `flow_moves` as embedded, written
//!   in one transaction compared with the change record, every step record and every tail —
//!   whichever process wins, each change is applied once, and a crash in between leaves it for
//!   the next. A large flow is read in part (the steps a move touches, `Need`); a move larger
//!   than a transaction stops when it is full and leaves its change rewritten to the rest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::flow_book::{EtcdBook, Need, QueueAt};
use super::side::{register_queue, retrying};
use super::writer::Writer;
use crate::engine::flow_moves::StepBook;
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::FlowRequest;
use crate::error::{Error, StorageError};
use crate::flow_state::{FlowStep, StoredStep};
use crate::stats::{JobOutcome, OutcomeKind};
use crate::store::envelope;
use crate::store::etcd::flows::{FlowChange, FlowChangeWrite, FlowWrite, ReadChange, STEPS_READ};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// Change records one move reads (and applies) at a time.
const CHANGES_READ: usize = 64;
/// Refused applications of one change in a row before the writer lets other requests in.
pub(super) const APPLY_TRIES: u32 = 4;
/// How long after a change could not be applied the writer looks again.
const RETRY_MOVE: Duration = Duration::from_secs(1);

impl Writer {
    pub(super) async fn flow(&mut self, req: FlowRequest) {
        match req {
            FlowRequest::Submit { steps, reply } => self.submit(steps, reply).await,
            FlowRequest::Delete { id, reply } => {
                let _ = reply.send(self.delete_flow(id).await.map_err(Error::from));
            }
            FlowRequest::Move => self.move_flows().await,
        }
    }

    /// `Broker::delete_flow`: `false` if there is no such flow. A try whose answer was lost is
    /// sent again and finds nothing; the first's marker says the flow was this call's to delete.
    async fn delete_flow(&mut self, id: u64) -> Result<bool, StorageError> {
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        let marked = self.marked(t).await?;
        Ok(retrying(t, || store.delete_flow(id, marked)).await?
            || retrying(t, || store.marker_exists(marked.nonce)).await?)
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

    /// Notes flow `flow` as larger than a whole read (forgotten all at once past 10,000: a
    /// flow forgotten is only read in part once more).
    pub(super) fn note_large(&mut self, flow: u64) {
        if self.large_flows.len() >= 10_000 {
            self.large_flows.clear();
        }
        self.large_flows.insert(flow);
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
        let mut left = self.apply_batch(own).await;
        // A large flow's (read in part, so not batched): applied here too, one flow at a time,
        // tried once (a refusal is another process's change between: the mover's).
        let mut large: Vec<u64> =
            left.iter().map(|c| c.flow).filter(|f| self.large_flows.contains(f)).collect();
        large.sort_unstable();
        large.dedup();
        for flow in large {
            let (cs, rest): (Vec<_>, Vec<_>) = left.into_iter().partition(|c| c.flow == flow);
            left = rest;
            match self.apply_changes(&cs, 1).await {
                Ok(a) if a.continued.is_none() && a.left == 0 => {}
                _ => left.extend(cs),
            }
        }
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
        // A large flow's changes are applied one flow at a time (`apply_changes`).
        let (large, mut flows): (Vec<_>, Vec<_>) =
            flows.into_iter().partition(|(f, _)| self.large_flows.contains(f));
        // One read: four ranges per flow.
        let take = flows.len().min(MAX_TXN_OPS / 4);
        let mut left: Vec<ReadChange> = flows.split_off(take).into_iter().flat_map(|(_, cs)| cs).collect();
        left.extend(large.into_iter().flat_map(|(_, cs)| cs));
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
            if !lf.complete {
                // A large flow: its moves read what they touch, one flow at a time.
                self.note_large(flow);
                left.extend(present);
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
            let mut book = EtcdBook::new(flow, lf, queues.clone(), now);
            book.base = base;
            let built = present.iter().try_for_each(|c| book.apply(c));
            if built.is_err() || book.deferred.is_some() {
                // Larger than a transaction (or a step's queue unknown): one change at a time.
                left.extend(present);
                continue;
            }
            let first_created = present.iter().map(|c| c.created).min().unwrap_or_default();
            let keys = present.iter().map(|c| (c.key.clone(), c.rev)).collect();
            let part = book.write(keys, first_created, || 0);
            // Its records, and its messages with a tail each (counted as if every queue were new);
            // compares apart (etcd holds both to 128): the flow's two, each change's, each
            // step record's, and two per queue appended to.
            let part_ops = part.ops() + book.released.len() * 2;
            let part_cmps = 2 + part.changes.len() + part.steps.len() + book.released.len() * 2;
            let part_bytes = book.cost().2;
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
            Ok(Some(_)) => {
                for a in &appends {
                    let last = a.expected_last + a.envelopes.len() as u64;
                    self.tails.insert(a.qid, (last, a.nonce));
                    if let Some((q, _)) = queues.values().flatten().find(|(q, _)| q.id == a.qid) {
                        super::writer::index_sent(q, a.expected_last + 1, &a.envelopes);
                        q.publish_max(last);
                        telemetry::produced(&q.produced, a.envelopes.len() as u64);
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
        // Before the read: a change put from now on has the mover send another move.
        self.side.move_queued.store(false, std::sync::atomic::Ordering::Release);
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
        let mut failed = false;
        let mut applied = read - changes.len();
        // Each flow's changes in the order they were written, applied together as far as one
        // transaction holds.
        let mut by_flow: Vec<(u64, Vec<ReadChange>)> = Vec::new();
        for c in changes {
            match by_flow.iter_mut().find(|(f, _)| *f == c.flow) {
                Some((_, list)) => list.push(c),
                None => by_flow.push((c.flow, vec![c])),
            }
        }
        for (flow, cs) in by_flow {
            match self.apply_changes(&cs, APPLY_TRIES).await {
                Ok(a) => {
                    applied += a.gone + a.applied;
                    if a.continued.is_some() || (a.left > 0 && a.applied > 0) {
                        // The rest waits its turn, other requests in between.
                        self.side.flows_changed.notify_one();
                    } else if a.left > 0 {
                        // Held behind an older change not read here (another process's, put
                        // since): its put wakes every mover, and this one looks again anyway.
                        failed = true;
                    }
                }
                Err(e) => {
                    tracing::debug!(flow, error = %e, "rockq: a flow change was not applied; trying again in a second");
                    failed = true;
                }
            }
        }
        if failed {
            later(self.side.clone());
        }
        if full && applied > 0 {
            self.side.flows_changed.notify_one();
        }
    }

    /// Applies changes `cs` (of one flow, in the order they were written) in one transaction,
    /// as many as it holds, reading again after a refusal (another process applied them or an
    /// older change of the flow, or moved a tail), a few times: an error if they are still
    /// there. A move larger than one transaction applies what fits and rewrites the first
    /// change's record to the rest (it is the oldest: the rest keeps its place in the order),
    /// and the changes after it wait. Those no longer there were applied by another process.
    pub(super) async fn apply_changes(&mut self, cs: &[ReadChange], tries: u32) -> Result<Applied, Error> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let mut backoff = Duration::from_millis(5);
        let Some(flow) = cs.first().map(|c| c.flow) else { return Ok(Applied::default()) };
        for attempt in 1..=tries {
            // The steps from the first one the changes name: those after a step are numbered
            // after it.
            let from = cs.iter().map(|c| c.change.first_step()).min().unwrap_or(0);
            let Some(loaded) =
                until_deadline(deadline, store.load_steps(flow, from, STEPS_READ as u32)).await?
            else {
                // The flow was deleted: what is left of its changes goes.
                for c in cs {
                    until_deadline(deadline, store.delete_change(&c.key, c.rev)).await?;
                }
                return Ok(Applied { gone: cs.len(), ..Applied::default() });
            };
            // Only from the flow's oldest pending change on, as far as these are the pending
            // ones in order: a move built while an older change is pending would read records
            // that change is about to rewrite (the order compare alone would pass once it is
            // applied). The rest wait; those no longer pending were applied elsewhere.
            let mut there: Vec<&ReadChange> = Vec::new();
            for p in &loaded.pending {
                match cs.iter().find(|c| c.key == p.0 && c.rev == p.1) {
                    Some(c) => there.push(c),
                    None => break,
                }
            }
            let gone =
                cs.iter().filter(|c| !loaded.pending.iter().any(|p| p.0 == c.key && p.1 == c.rev)).count();
            if there.is_empty() {
                return Ok(Applied { gone, left: cs.len() - gone, ..Applied::default() });
            }
            let now = self.stamp();
            let mut book = EtcdBook::new(flow, loaded, HashMap::new(), now);
            book.read(from, STEPS_READ as u32);
            // Built again after each read a large flow's move needs (each reads something new).
            let taken = loop {
                book.restart();
                let mut taken = 0;
                let mut need = None;
                for c in &there {
                    if taken > 0 && (book.full() || book.deferred.is_some()) {
                        break;
                    }
                    if let Err(n) = book.apply(c) {
                        need = Some(n);
                        break;
                    }
                    taken += 1;
                }
                match need {
                    None => break taken,
                    Some(Need::Queue(name)) => {
                        let q = self.flow_queue(&name, deadline).await?;
                        book.queues.insert(name, q);
                    }
                    Some(Need::Step(step)) => {
                        let read =
                            until_deadline(deadline, store.load_steps(flow, step, STEPS_READ as u32)).await?;
                        let Some(more) = read else {
                            return Ok(Applied { gone: cs.len(), ..Applied::default() });
                        };
                        book.read(step, STEPS_READ as u32);
                        for (s, rec) in more.steps {
                            book.loaded.steps.entry(s).or_insert(rec);
                        }
                        for (s, m) in more.messages {
                            book.loaded.messages.entry(s).or_insert(m);
                        }
                    }
                }
            };
            let keys = there[..taken].iter().map(|c| (c.key.clone(), c.rev)).collect();
            let w = book.write(keys, there[0].created, || self.nonce());
            if w.ops() > MAX_TXN_OPS {
                // The book stops a move at a transaction's size: a bug if it did not.
                tracing::error!(
                    flow,
                    ops = w.ops(),
                    "rockq: a flow change does not fit one etcd transaction"
                );
                return Err(StorageError::new("etcd: a flow change larger than one transaction").into());
            }
            match until_deadline(deadline, store.write_flow(&w)).await {
                Ok(Some(rev)) => {
                    for a in &w.appends {
                        let last = a.expected_last + a.envelopes.len() as u64;
                        self.tails.insert(a.qid, (last, a.nonce));
                        if let Some((q, _)) = book.queues.values().flatten().find(|(q, _)| q.id == a.qid) {
                            super::writer::index_sent(q, a.expected_last + 1, &a.envelopes);
                            q.publish_max(last);
                            telemetry::produced(&q.produced, a.envelopes.len() as u64);
                        }
                    }
                    if w.rest.is_some() {
                        tracing::debug!(flow, "rockq: a flow move goes on in the next transaction");
                    }
                    // Of those applied, the first is continued (when anything is left), not gone.
                    let continued = w.rest.map(|rest| (rev, rest));
                    let applied = taken - usize::from(continued.is_some());
                    return Ok(Applied { gone, applied, continued, left: cs.len() - gone - taken });
                }
                Ok(None) => {
                    for a in &w.appends {
                        self.tails.remove(&a.qid);
                    }
                    if attempt < tries {
                        tokio::time::sleep(backoff).await;
                        backoff *= 2;
                    }
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

/// `fut`, cut short at `deadline`, its error a storage error.
pub(super) async fn until_deadline<T>(
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    super::side::until(deadline, fut).await
}

/// What [`Writer::apply_changes`] did with the changes it was given.
#[derive(Default)]
pub(super) struct Applied {
    /// Changes not there any more (another process applied them, or their flow is gone).
    pub(super) gone: usize,
    /// Changes applied and deleted.
    pub(super) applied: usize,
    /// The rest of a move larger than the transaction: the first change's record rewritten to
    /// it, with the write's revision.
    pub(super) continued: Option<(i64, FlowChange)>,
    /// Changes that did not fit, still there.
    pub(super) left: usize,
}
