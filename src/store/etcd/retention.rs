//! Retention in etcd: a queue's policy in its record, the trim transaction that deletes a
//! queue's head with one ranged delete, the scan for a `MaxAge` cut, etcd's MVCC compaction,
//! and the watch that tells every process of the namespace about new queue records.
//!
//! A trim is one transaction:
//!
//! `If mod_revision(q/<name>) == seen` (the policy and first sequence it was computed from)
//! `and create_revision(o/…) <= read` (no group created since its cut was computed: a new
//! `Earliest` group keeps its messages) `and mod_revision(o/<g>) == seen` for each work group
//! behind the cut; `Then Delete m/<qid>/..=to, Put q/<name> (first = to + 1)`, and for each
//! group behind the cut: `Delete` its claim records or marks up to `to`, and for a work group
//! `Put o/<g> = to`. Offsets only move forward on etcd, so a group's offset read before the
//! transaction is at most what it is when the transaction applies.
//!
//! More groups behind the cut than one transaction holds (etcd's 128 operations: about 60 work
//! groups): the work groups beyond it are moved past the cut first, 60 to a transaction with
//! the same compares, and the marks of ordered groups beyond it are deleted after the trim
//! ([`TrimPlan::split`]). A process stopped in between leaves groups moved past messages that
//! are still there, which the next pass trims: what the policy decided, in more steps.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, WatchFilterType, WatchOptions};
use futures::StreamExt;

use super::{EtcdStore, WatchedKind, corrupt, decode_envelope, decode_purge, decode_tail};
use crate::error::{CorruptionError, StorageError};
use crate::model::{GroupMode, GroupOffset, QueueMeta};
use crate::store::{keys, records};

/// Deletes the records under `prefix` (claims or marks) up to sequence `to`.
fn upto(prefix: &[u8], to: u64) -> TxnOp {
    TxnOp::delete(
        keys::claim_key(prefix, 0),
        Some(DeleteOptions::new().with_range(keys::claim_key(prefix, to.saturating_add(1)))),
    )
}

/// A group of the queue a [`TrimPlan`] trims.
#[derive(Debug, Clone)]
pub(crate) struct TrimGroup {
    pub group: String,
    pub mode: GroupMode,
    /// Its committed offset, read at the plan's revision.
    pub committed: u64,
    /// Its offset record's `mod_revision` then.
    pub rev: i64,
}

/// One queue's trim (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct TrimPlan {
    pub queue: String,
    /// The queue record after the trim (`first_seq = to + 1`).
    pub meta: QueueMeta,
    /// The queue record's `mod_revision` the cut was computed from.
    pub queue_rev: i64,
    /// The last sequence deleted.
    pub to: u64,
    /// The queue's groups whose offsets are behind `to`.
    pub behind: Vec<TrimGroup>,
    /// The revision the plan was read at: no offset record may have been created after it.
    pub read_at: i64,
    /// A purge (`Broker::purge_queue`), not a retention cut: the trim also writes the queue's
    /// purge mark (`s/<qid>` = `to`), which tells the owners of its ordered groups in other
    /// processes to drop what they had read ahead, as embedded.
    pub purge: bool,
}

/// A change to the namespace another process (or this one) made, seen by
/// [`EtcdStore::watch_namespace`].
#[derive(Debug, Clone)]
pub(crate) enum NamespaceEvent {
    /// Queue `qid`'s tail moved to `last`.
    Tail { qid: u32, last: u64 },
    /// Queue `name`'s record was written (created, its policy changed, or trimmed).
    Queue { name: String, meta: QueueMeta },
    /// Queue `qid` was purged through `through` ([`TrimPlan::purge`]).
    Purged { qid: u32, through: u64 },
    /// A delayed message due at `due` was written (`delayed.rs`).
    Due { due: u64 },
    /// Queue `name` of id `id` was deleted (`deletion.rs`).
    QueueGone { name: String, id: u32 },
    /// Keyspace `name` (`id`) was made (`kv.rs`).
    Keyspace { name: String, id: u32 },
    /// Message `seq` of queue `qid` was sent with `priority` (its index entry, put in the
    /// transaction that published it).
    Priority { qid: u32, seq: u64, priority: u8 },
    /// A flow change record was written (`flows.rs`): some process should apply it.
    FlowChange,
}

impl TrimPlan {
    /// The operations its transaction holds: the ranged deletes (the messages, their priority
    /// index entries) and the queue record, a ranged
    /// delete and an offset put per work group behind, a ranged delete per ordered group
    /// behind, a purge's mark, and the rewrite of a packed run the cut goes through (counted
    /// whether or not there is one). [`split`](Self::split) makes it fit etcd's limit.
    pub fn operations(&self) -> usize {
        // The last: a packed run the cut goes through, rewritten (`EtcdStore::trim`).
        4 + usize::from(self.purge)
            + self.behind.iter().map(|g| if g.mode == GroupMode::WorkQueue { 2 } else { 1 }).sum::<usize>()
    }

    /// Makes the trim fit one transaction: returns the work groups to move past the cut first
    /// ([`EtcdStore::move_past_cut`], a transaction per [`GROUPS_PER_MOVE`]) and the ordered
    /// groups whose marks go after it ([`EtcdStore::delete_marks`]); the plan keeps the rest.
    ///
    /// Work groups go first because moving one is what the trim itself does to it (a claim
    /// below its offset is refused, so nothing is claimed again while the messages remain);
    /// ordered groups' marks go last because below the new first sequence they mean nothing,
    /// while deleting them earlier could deliver again what their owner acknowledged.
    pub fn split(&mut self) -> (Vec<TrimGroup>, Vec<TrimGroup>) {
        let (mut work, mut ordered): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.behind).into_iter().partition(|g| g.mode == GroupMode::WorkQueue);
        // What the trim itself takes: `operations()` without the groups.
        let room = super::MAX_TXN_OPS - 4 - usize::from(self.purge);
        let ahead = work.split_off(work.len().min(room / 2));
        let after = ordered.split_off(ordered.len().min(room - 2 * work.len()));
        self.behind = work;
        self.behind.append(&mut ordered);
        (ahead, after)
    }
}

impl super::EtcdLoaded {
    /// The groups of `queue` as a trim plans with them: offsets and their revisions as loaded.
    pub fn trim_groups(&self, queue: &str) -> Vec<TrimGroup> {
        self.groups
            .iter()
            .zip(&self.group_revs)
            .filter(|((_, q, _), _)| q == queue)
            .map(|((g, _, o), rev)| TrimGroup {
                group: g.clone(),
                mode: o.mode,
                committed: o.committed,
                rev: *rev,
            })
            .collect()
    }
}

/// Work groups one [`EtcdStore::move_past_cut`] moves: two operations and one compare each.
pub(crate) const GROUPS_PER_MOVE: usize = 60;

impl EtcdStore {
    /// The queue record of `name` and its `mod_revision`, if it exists.
    pub async fn queue_record(&self, name: &str) -> Result<Option<(QueueMeta, i64)>, StorageError> {
        let got = self.kv().get(self.queue_key(name), None).await?;
        got.kvs()
            .first()
            .map(|kv| Ok((records::decode_queue(kv.key(), kv.value()).map_err(corrupt)?, kv.mod_revision())))
            .transpose()
    }

    /// Replaces `name`'s queue record if its `mod_revision` is still `expected`.
    pub async fn put_queue_record(
        &self,
        name: &str,
        meta: &QueueMeta,
        expected: i64,
    ) -> Result<bool, StorageError> {
        let key = self.queue_key(name);
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, expected)])
            .and_then([TxnOp::put(key, records::encode_queue(meta).to_vec(), None)]);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// Carries out `plan` in one transaction (the messages deleted with their priority index
    /// entries); `false`: something it was computed from changed,
    /// and nothing was written.
    pub async fn trim(&self, plan: &TrimPlan) -> Result<bool, StorageError> {
        let qid = plan.meta.id;
        let qkey = self.queue_key(&plan.queue);
        let mut cmps = self.plan_compares(plan);
        let mut ops = vec![
            TxnOp::delete(
                self.message_key(qid, 0),
                Some(DeleteOptions::new().with_range(self.message_key(qid, plan.to.saturating_add(1)))),
            ),
            TxnOp::put(qkey, records::encode_queue(&plan.meta).to_vec(), None),
            self.delete_priorities(qid, 0, plan.to),
        ];
        if plan.purge {
            ops.push(TxnOp::put(self.purge_key(qid), plan.to.to_be_bytes().to_vec(), None));
        }
        // The range deletes entries keyed through `to`; a packed run the cut goes through is
        // keyed past it, and keeps only its messages after `to` (compared as read: only a
        // trim or a purge rewrites a stored run).
        if let Some((key, rest, rev)) = self.run_across(qid, plan.to).await? {
            cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
            ops.push(TxnOp::put(key, rest, None));
        }
        self.push_groups(plan, &plan.behind, &mut cmps, &mut ops);
        debug_assert!(ops.len() <= plan.operations());
        if ops.len() > super::MAX_TXN_OPS || cmps.len() > super::MAX_TXN_OPS {
            return Err(StorageError::new(format!(
                "trimming queue {} with {} groups behind its cut needs {} operations, over etcd's {} per transaction",
                plan.queue,
                plan.behind.len(),
                ops.len(),
                super::MAX_TXN_OPS
            )));
        }
        // Refused, the records this trim writes are read back: an earlier try whose answer was
        // lost (a large trim outlasts the request timeout) may have applied it, and the retry's
        // compare then fails on that very write. Found as this plan writes them, the trim is
        // done (by that try, or by another process cutting at the same place: either way the
        // messages through `to` are gone and the queue record says so). Reported refused, a
        // purge counted 0 messages deleted.
        let mut check = vec![TxnOp::get(self.queue_key(&plan.queue), None)];
        if plan.purge {
            check.push(TxnOp::get(self.purge_key(qid), None));
        }
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops).or_else(check)).await?;
        crate::faults::check("rockq-etcd-trim-answer")?;
        if resp.succeeded() {
            return Ok(true);
        }
        let values = super::values(&resp);
        let queue = records::encode_queue(&plan.meta);
        let landed = values.first().is_some_and(|v| v.as_deref() == Some(&queue[..]))
            && (!plan.purge
                || values.get(1).is_some_and(|v| v.as_deref() == Some(&plan.to.to_be_bytes()[..])));
        Ok(landed)
    }

    /// The packed run of `qid` holding both `to` and `to + 1`, if there is one: its key, what
    /// it holds after `to` (packed again, or one envelope) and its `mod_revision`.
    async fn run_across(&self, qid: u32, to: u64) -> Result<Option<(Vec<u8>, Vec<u8>, i64)>, StorageError> {
        if !self.packs() {
            return Ok(None);
        }
        let (key, opts) = self.holding_get(qid, to.saturating_add(1));
        let got = self.kv().get(key, opts).await?;
        let Some(kv) = got.kvs().first() else { return Ok(None) };
        let held = self.stored_messages(kv)?;
        if held.first().is_none_or(|(first, _)| *first > to) {
            return Ok(None);
        }
        let rest: Vec<&[u8]> = held.iter().filter(|(seq, _)| *seq > to).map(|(_, env)| *env).collect();
        if rest.is_empty() {
            return Ok(None);
        }
        Ok(Some((kv.key().to_vec(), super::segment::encode(&rest), kv.mod_revision())))
    }

    /// Moves the work groups `groups` of `plan` past its cut before the trim (see
    /// [`TrimPlan::split`]), comparing what the plan was computed from; `false`: something
    /// changed, and nothing was written.
    pub async fn move_past_cut(&self, plan: &TrimPlan, groups: &[TrimGroup]) -> Result<bool, StorageError> {
        debug_assert!(
            groups.len() <= GROUPS_PER_MOVE && groups.iter().all(|g| g.mode == GroupMode::WorkQueue)
        );
        let mut cmps = self.plan_compares(plan);
        let mut ops = Vec::with_capacity(2 * groups.len());
        self.push_groups(plan, groups, &mut cmps, &mut ops);
        Ok(self.kv().txn(Txn::new().when(cmps).and_then(ops)).await?.succeeded())
    }

    /// Deletes the marks up to `to` of the ordered groups `groups` of `queue`, after a trim
    /// deleted the messages they were about (see [`TrimPlan::split`]).
    pub async fn delete_marks(&self, queue: &str, groups: &[TrimGroup], to: u64) -> Result<(), StorageError> {
        for chunk in groups.chunks(super::MAX_TXN_OPS) {
            let ops: Vec<TxnOp> =
                chunk.iter().map(|g| upto(&self.mark_prefix(&g.group, queue), to)).collect();
            self.kv().txn(Txn::new().and_then(ops)).await?;
        }
        Ok(())
    }

    /// What every transaction of a trim compares: the queue record as the cut was computed
    /// from it, and no offset record created since the plan was read (a new `Earliest` group
    /// keeps its messages).
    fn plan_compares(&self, plan: &TrimPlan) -> Vec<Compare> {
        vec![
            Compare::mod_revision(self.queue_key(&plan.queue), CompareOp::Equal, plan.queue_rev),
            Compare::create_revision(self.key(b"o/", b""), CompareOp::Less, plan.read_at + 1).with_prefix(),
        ]
    }

    /// Adds what a trim does to `groups`: a work group's claim records up to the cut go and its
    /// offset moves to it (compared unchanged since the plan); an ordered group's offset is
    /// its owner's (the subscription skips to the new first sequence, as embedded), and only
    /// its marks up to the cut go.
    fn push_groups(
        &self,
        plan: &TrimPlan,
        groups: &[TrimGroup],
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) {
        for g in groups {
            match g.mode {
                GroupMode::WorkQueue => {
                    let okey = self.offset_key(&g.group, &plan.queue);
                    cmps.push(Compare::mod_revision(okey.clone(), CompareOp::Equal, g.rev));
                    ops.push(upto(&self.claims_prefix(&g.group, &plan.queue), plan.to));
                    let moved = GroupOffset { mode: GroupMode::WorkQueue, committed: plan.to };
                    ops.push(TxnOp::put(okey, records::encode_offset(&moved).to_vec(), None));
                }
                GroupMode::Ordered => ops.push(upto(&self.mark_prefix(&g.group, &plan.queue), plan.to)),
            }
        }
    }

    /// The last of messages `first..=last` of queue `qid` enqueued before `cutoff_micros`,
    /// scanning from `first` until a message is not older than that (at most `max_scan`).
    pub async fn last_enqueued_before(
        &self,
        qid: u32,
        (first, last): (u64, u64),
        cutoff_micros: u64,
        max_scan: u64,
    ) -> Result<Option<u64>, StorageError> {
        // Pages of about 1 MiB of values (far below the client's 4 MiB answer limit): a read
        // bounded by bytes, as a subscriber's (larger messages further on are asked for in
        // fewer entries, so a pass never fails at the same place every time).
        const PAGE_BYTES: usize = 1 << 20;
        let end = last.min(first.saturating_add(max_scan.saturating_sub(1)));
        let mut found = None;
        let mut from = first;
        while from <= end {
            let page = self.read_range(qid, from, end, PAGE_BYTES).await?;
            let Some(&(next, _)) = page.last() else { break };
            for (seq, env) in &page {
                let env = decode_envelope(qid, *seq, env).map_err(corrupt)?;
                if env.enqueued_at_micros >= cutoff_micros {
                    return Ok(found);
                }
                found = Some(*seq);
            }
            from = next + 1;
        }
        Ok(found)
    }

    /// Compacts etcd's MVCC history up to `revision` (what deleted and overwritten keys left
    /// behind). Compacting to a revision already compacted is not an error here.
    pub async fn compact(&self, revision: i64) -> Result<(), StorageError> {
        match self.kv().compact(revision).await {
            Err(e) if e.to_string().contains("compacted") => Ok(()),
            done => done,
        }
    }

    /// A stream of queue-record writes and deletions and tail moves after `revision`, over
    /// every queue of the namespace. Ends (with `Err`) when the watch breaks or its start was
    /// compacted: the caller re-reads and watches again.
    ///
    /// Two etcd watches: the writes, and the deletions of queue records with the values they
    /// had (a deleted record names its queue's id). Kept apart because a watch that asks for
    /// previous values makes etcd read one for every event, and a tail moves with every
    /// append: asked on the writes' watch, that cost ~10 % of produce throughput. The two
    /// streams are not ordered with each other; what they feed does not depend on it (a queue
    /// is forgotten by its id, and a record of a higher id replaces a lower one).
    pub async fn watch_namespace(
        &self,
        revision: i64,
    ) -> Result<impl futures::Stream<Item = Result<Vec<NamespaceEvent>, StorageError>> + use<>, StorageError>
    {
        // `q/` (queue records) up to and including `t/` (tails): one watch for those and the
        // purge marks (`s/`), delayed messages' due-index entries (`sd/`), flow change records
        // (`sf/`) and priority index entries (`sp/`) between them.
        // What else lies between (`r/`, redrive cursors) is skipped.
        let (qprefix, tprefix) = (self.key(b"q/", b""), self.key(b"t/", b""));
        let sprefix = self.key(b"s/", b"");
        let dprefix = self.key(b"sd/", b"");
        let pprefix = self.key(b"sp/", b"");
        let fprefix = self.change_prefix();
        let opts = WatchOptions::new()
            .with_range(self.key(b"t0", b""))
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoDelete]);
        let (key, q) = (qprefix.clone(), qprefix.clone());
        let kprefix = self.keyspace_prefix();
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Put if kv.key().starts_with(&kprefix) => {
                let (name, id) = super::kv::keyspace_record(&kprefix, kv.key(), kv.value())?;
                Ok(Some(NamespaceEvent::Keyspace { name, id }))
            }
            WatchedKind::Put if kv.key().starts_with(&fprefix) => Ok(Some(NamespaceEvent::FlowChange)),
            WatchedKind::Put if kv.key().starts_with(&pprefix) => {
                let (qid, seq, priority) =
                    super::decode_priority(&kv.key()[pprefix.len()..], kv.key(), kv.value())?;
                Ok(Some(NamespaceEvent::Priority { qid, seq, priority }))
            }
            WatchedKind::Put => namespace_event(&q, &sprefix, &tprefix, &dprefix, kv),
            WatchedKind::Delete { .. } => Ok(None),
        };
        let writes = self.watch_events(key, opts, decode).await?;
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoPut])
            .with_prev_key();
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Delete { prev: Some(prev) } => {
                let name = kv.key().get(qprefix.len()..).unwrap_or_default();
                let name = std::str::from_utf8(name)
                    .map_err(|_| corrupt(CorruptionError::new("queue", kv.key(), "name is not UTF-8")))?;
                let meta = records::decode_queue(kv.key(), &prev).map_err(corrupt)?;
                Ok(Some(NamespaceEvent::QueueGone { name: name.to_owned(), id: meta.id }))
            }
            // A deletion without its value was compacted away: re-read (its id is unknown).
            WatchedKind::Delete { prev: None } => {
                Err(StorageError::new("etcd watch: a queue record's deletion came without its value"))
            }
            WatchedKind::Put => Ok(None),
        };
        let deletions = self.watch_events(self.key(b"q/", b""), opts, decode).await?;
        // Either ending ends both: the caller re-reads, and no deletion is missed while the
        // other goes on.
        let end = || futures::stream::once(async { Err(StorageError::new("etcd watch ended")) });
        Ok(futures::stream::select(writes.chain(end()), deletions.chain(end())))
    }
}

/// A watched key as an event (`None`: not a queue record or a tail).
fn namespace_event(
    qprefix: &[u8],
    sprefix: &[u8],
    tprefix: &[u8],
    dprefix: &[u8],
    kv: &etcd_client::KeyValue,
) -> Result<Option<NamespaceEvent>, StorageError> {
    let key = kv.key();
    // A delayed message's due-index entry (`delayed.rs`): `<due u64><qid u32><id u64>`.
    if let Some(rest) = key.strip_prefix(dprefix) {
        let Some(due) = rest.first_chunk::<8>() else { return Ok(None) };
        return Ok(Some(NamespaceEvent::Due { due: u64::from_be_bytes(*due) }));
    }
    if let Some(rest) = key.strip_prefix(sprefix) {
        let Ok(qid) = <[u8; 4]>::try_from(rest) else { return Ok(None) };
        let through = decode_purge(key, kv.value())?;
        return Ok(Some(NamespaceEvent::Purged { qid: u32::from_be_bytes(qid), through }));
    }
    if let Some(rest) = key.strip_prefix(tprefix) {
        let Ok(qid) = <[u8; 4]>::try_from(rest) else { return Ok(None) };
        let (last, _) = decode_tail(key, kv.value())?;
        return Ok(Some(NamespaceEvent::Tail { qid: u32::from_be_bytes(qid), last }));
    }
    if let Some(rest) = key.strip_prefix(qprefix) {
        let name = std::str::from_utf8(rest)
            .map_err(|_| corrupt(CorruptionError::new("queue", key, "name is not UTF-8")))?
            .to_owned();
        let meta = records::decode_queue(key, kv.value()).map_err(corrupt)?;
        return Ok(Some(NamespaceEvent::Queue { name, meta }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(work: usize, ordered: usize, purge: bool) -> TrimPlan {
        let group = |i: usize, mode| TrimGroup { group: format!("g{i}"), mode, committed: 0, rev: 1 };
        let behind = (0..work)
            .map(|i| group(i, GroupMode::WorkQueue))
            .chain((work..work + ordered).map(|i| group(i, GroupMode::Ordered)))
            .collect();
        let meta = QueueMeta {
            id: 1,
            first_seq: 11,
            retention: crate::retention::Retention::MaxLen(5),
            dedup_window: crate::model::DEFAULT_DEDUP_WINDOW,
        };
        TrimPlan { queue: "q".into(), meta, queue_rev: 1, to: 10, behind, read_at: 1, purge }
    }

    #[test]
    fn a_split_plan_fits_one_transaction_and_loses_no_group() {
        let cases = [
            (0, 0),
            (10, 10),
            (62, 0),
            (63, 0),
            (64, 0),
            (0, 124),
            (0, 125),
            (0, 126),
            (0, 127),
            (200, 300),
            (62, 1),
            (63, 1),
        ];
        for ((work, ordered), purge) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let mut p = plan(work, ordered, purge);
            let (ahead, after) = p.split();
            assert!(
                p.operations() <= crate::store::etcd::MAX_TXN_OPS,
                "{work}/{ordered}: {}",
                p.operations()
            );
            assert!(ahead.iter().all(|g| g.mode == GroupMode::WorkQueue));
            assert!(after.iter().all(|g| g.mode == GroupMode::Ordered));
            let mut names: Vec<_> =
                p.behind.iter().chain(&ahead).chain(&after).map(|g| g.group.clone()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), work + ordered, "{work}/{ordered}: every group once");
            if 2 * work + ordered + usize::from(purge) <= 124 {
                assert!(ahead.is_empty() && after.is_empty(), "{work}/{ordered}: fits, nothing split");
            }
        }
    }
}
