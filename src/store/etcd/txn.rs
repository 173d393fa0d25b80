//! One etcd transaction for a rockq `Transaction`: keyspace writes and conditions
//! (`kv.rs`), work-group acks (claim records compared with the revisions their holders
//! claimed them at, as `work.rs` writes them) and appends (compared with each queue's tail),
//! all applied or none — the exactly-once pipeline across processes: a job's ack, the state
//! it changed and the messages it sent land together or not at all. A send's idempotency key
//! is recorded in the same transaction (compared with the record's revision as read, as an
//! append records it: `dedup.rs`), and a delayed send's records are written in it
//! (`delayed.rs`). An ordered delivery's ack is an `Acked` mark, put while the group's owner
//! key still names this process (as its offset commits are compared: `commit_ordered`); the
//! owner's next offset commit passes it and deletes the mark.
//!
//! In doubt (no answer), the caller sends the same transaction again with the same `nonce`:
//! it also puts the marker `y/<nonce>` (under an expiring lease) and requires it absent, so a
//! second try after a first that was applied is refused and reports the first as applied —
//! never as a conflict with its own writes, never applied twice.

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::kv::{KvOp, encode_entry};
use super::work::{ClaimsTxn, FoundClaims};
use super::{
    Along, DeadLetterAppend, DedupWrite, DelayedPut, EtcdStore, MAX_TXN_BYTES, MAX_TXN_OPS, decode_tail,
    records,
};
use crate::error::StorageError;
use crate::model::OrderedMark;

/// What one transaction holds.
#[derive(Clone, Copy)]
pub(crate) struct TxnParts<'a> {
    pub kv: &'a [KvOp],
    /// Per work group: its jobs' `Done` records (with outcome records).
    pub claims: &'a [ClaimsTxn<'a>],
    /// Per queue: the messages it appends.
    pub appends: &'a [DeadLetterAppend],
    /// Per queue: what it writes besides appended messages (keys' records, delayed messages).
    pub extras: &'a [QueueExtras<'a>],
    /// Per ordered group: the deliveries it acks.
    pub ordered: &'a [OrderedAcksTxn<'a>],
}

/// An ordered group's deliveries a transaction acks, as the group's owner `owner`.
#[derive(Clone, Copy)]
pub(crate) struct OrderedAcksTxn<'a> {
    pub group: &'a str,
    pub queue: &'a str,
    pub owner: &'a [u8],
    pub seqs: &'a [u64],
}

/// What a transaction writes to one queue besides the messages it appends now.
#[derive(Clone, Copy)]
pub(crate) struct QueueExtras<'a> {
    pub qid: u32,
    /// The sequence the queue's messages appended by this transaction start at (the records
    /// of their keys name it; unused when none is appended).
    pub first: u64,
    /// The idempotency keys' records and the lease they go under.
    pub dedup: Option<(&'a [DedupWrite], i64)>,
    /// Delayed messages' records.
    pub delayed: &'a [DelayedPut<'a>],
}

/// How a transaction ended.
#[derive(Debug)]
pub(crate) enum TxnOutcome {
    /// Applied at `revision`; `added` is how many keys each keyspace it wrote gained (negative:
    /// lost), `None` when an earlier try of this same call was applied (its answer lost: found
    /// by its marker).
    Applied { revision: i64, added: Option<Vec<(u32, i64)>> },
    /// Nothing written: what it compared, as it is now.
    Refused(Refusal),
    /// More than one etcd transaction holds (operations, compares or bytes): not sent.
    TooLarge,
}

/// What a refused transaction found.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The first keyspace condition that did not hold: its op's index and the key's revision
    /// (`None`: absent).
    pub conflict: Option<(usize, Option<u64>)>,
    /// Per [`TxnParts::claims`]: the group's offset and each record as it is now (`None`: the
    /// group has no offset record: deleted).
    pub claims: Vec<Option<FoundClaims>>,
    /// Per [`TxnParts::appends`]: the queue's tail now (`None`: no tail record).
    pub tails: Vec<Option<(u64, u64)>>,
    /// Per [`TxnParts::ordered`]: whether its owner key still names the owner (`false`: another
    /// process's, or none: the lease lapsed).
    pub owners: Vec<bool>,
}

impl KvOp {
    /// The compare standing for `expect` on the key `key`.
    fn compare(key: Vec<u8>, expect: crate::entry::Expect) -> Compare {
        use crate::entry::Expect;
        match expect {
            Expect::Absent => Compare::version(key, CompareOp::Equal, 0),
            Expect::Present => Compare::version(key, CompareOp::Greater, 0),
            // A revision etcd cannot have is one no key has (a missing key compares as 0).
            Expect::Revision(r) => {
                Compare::mod_revision(key, CompareOp::Equal, i64::try_from(r).unwrap_or(-1))
            }
        }
    }
}

impl EtcdStore {
    /// Closes the transaction named `nonce` against late tries: puts its marker unless it is
    /// there. `Some(revision)`: it was (a try was applied, at that revision); `None`: put now,
    /// so no try sent before can apply any more (each requires the marker absent).
    pub async fn close_marker(&self, nonce: u64, marker_lease: i64) -> Result<Option<i64>, StorageError> {
        let marker = self.marker_key(nonce);
        let txn = Txn::new()
            .when([Compare::version(marker.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                marker.clone(),
                Vec::new(),
                Some(PutOptions::new().with_lease(marker_lease)),
            )])
            .or_else([TxnOp::get(marker, Some(GetOptions::new().with_keys_only()))]);
        let resp = self.kv().txn(txn).await?;
        if resp.succeeded() {
            return Ok(None);
        }
        Ok(super::answers(&resp).next().flatten().map(|m| m.mod_revision()))
    }

    /// Applies `parts` as one etcd transaction (see the module's docs): every keyspace
    /// condition, claim revision, group offset, tail, idempotency key's record and ordered
    /// group's owner key compared, then every write (the last write of a key wins, as when the
    /// embedded writer applies them in order). A refusal reads back all of them but the keys'
    /// records: a refusal nothing read explains is a record that changed.
    pub async fn transaction(
        &self,
        parts: TxnParts<'_>,
        nonce: u64,
        marker_lease: i64,
    ) -> Result<TxnOutcome, StorageError> {
        let marker = self.marker_key(nonce);
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let mut cmps = vec![Compare::version(marker.clone(), CompareOp::Equal, 0)];
        // On a refusal: the compared keyspace keys, the marker, then the claims', the tails'
        // and the owner keys.
        let mut gets = Vec::new();
        let mut checks = Vec::new();
        // The request's size, every key counted each time it appears (a compare, a get, a
        // write), with room for each item's framing: etcd refuses a request over
        // `--max-request-bytes` (1.5 MiB by default) whatever its operation count.
        const FRAMING: usize = 32;
        let mut bytes = 2 * (marker.len() + FRAMING);
        for (i, op) in parts.kv.iter().enumerate() {
            if let Some(expect) = op.expect {
                let key = self.entry_key(op.keyspace, &op.key);
                bytes += 2 * (key.len() + FRAMING);
                cmps.push(KvOp::compare(key.clone(), expect));
                gets.push(TxnOp::get(key, keys_only()));
                checks.push(i);
            }
        }
        gets.push(TxnOp::get(marker.clone(), keys_only()));
        // The last write of each key, in the order of first appearance.
        let mut last: Vec<&KvOp> = Vec::new();
        for op in parts.kv.iter().filter(|o| !o.condition_only) {
            match last.iter_mut().find(|w| w.keyspace == op.keyspace && w.key == op.key) {
                Some(w) => *w = op,
                None => last.push(op),
            }
        }
        let mut ops: Vec<TxnOp> = last
            .iter()
            .map(|w| {
                let key = self.entry_key(w.keyspace, &w.key);
                bytes += key.len() + FRAMING + w.value.as_ref().map_or(0, Vec::len);
                match &w.value {
                    Some(v) => TxnOp::put(key, encode_entry(v), Some(PutOptions::new().with_prev_key())),
                    None => TxnOp::delete(key, Some(DeleteOptions::new().with_prev_key())),
                }
            })
            .collect();
        for c in parts.claims {
            self.push_claims(*c, &mut cmps, &mut ops, &mut gets);
            // Per group: the offset key twice compared, once read; per job: its claim key
            // compared, written and read, its outcome record and progress key written.
            let (offset, claim) =
                (self.offset_key(c.group, c.queue).len(), self.claims_prefix(c.group, c.queue).len() + 8);
            bytes += 3 * (offset + FRAMING);
            for w in c.writes {
                let outcome =
                    w.outcome.as_ref().map_or(0, |o| claim + 64 + o.result.as_ref().map_or(0, |r| r.len()));
                // A flow step's change record: its key and value.
                let change = w.flow.as_ref().map_or(0, |f| 64 + FRAMING + f.change.encode().len());
                bytes += 3 * (claim + FRAMING) + 64 + outcome + 2 * (claim + FRAMING) + change;
                // A job held in a range record: that record compared and read too.
                if w.run.is_some() {
                    bytes += 2 * (claim + 1 + FRAMING);
                }
            }
        }
        for a in parts.appends {
            let tail = self.push_append(a, &mut cmps, &mut ops);
            // The tail compared, written and read, the reservation compared; each message.
            bytes += 4 * (tail.len() + 16 + FRAMING);
            bytes += a.envelopes.iter().map(|e| e.len() + tail.len() + 8 + FRAMING).sum::<usize>();
            gets.push(TxnOp::get(tail, None));
        }
        // A key's record that changed since it was read fails its compare: nothing of the
        // refusal names it (tails, claims and conditions are as expected), and the caller
        // reads the records again.
        for e in parts.extras {
            if let Some((records, lease)) = e.dedup {
                self.push_dedup(e.qid, e.first, records, lease, &mut cmps, &mut ops);
                // Each record compared and put (its value: a sequence and an expiry).
                bytes += records
                    .iter()
                    .map(|r| 2 * (self.dedup_key(e.qid, &r.key).len() + FRAMING) + 32)
                    .sum::<usize>();
            }
            self.push_along(e.qid, Along::Delayed(e.delayed), 0, &mut cmps, &mut ops);
            // Each: its record (the envelope and due time) and its due entry.
            bytes += e
                .delayed
                .iter()
                .map(|d| {
                    let keys = self.delayed_key(e.qid, d.id).len() + self.due_key(d.due, e.qid, d.id).len();
                    keys + 2 * FRAMING + d.env.len() + 8
                })
                .sum::<usize>();
        }
        for o in parts.ordered {
            let owner = self.owner_key(o.group, o.queue);
            // The owner key compared and read; each mark put.
            bytes += 2 * (owner.len() + FRAMING) + o.owner.len();
            cmps.push(Compare::value(owner.clone(), CompareOp::Equal, o.owner.to_vec()));
            for &seq in o.seqs {
                let key = self.mark_key(o.group, o.queue, seq);
                bytes += key.len() + FRAMING + 16;
                ops.push(TxnOp::put(key, records::encode_mark(&OrderedMark::Acked).to_vec(), None));
            }
            gets.push(TxnOp::get(owner, None));
        }
        ops.push(TxnOp::put(marker, Vec::new(), Some(PutOptions::new().with_lease(marker_lease))));
        if cmps.len() > MAX_TXN_OPS
            || ops.len() > MAX_TXN_OPS
            || gets.len() > MAX_TXN_OPS
            || bytes > MAX_TXN_BYTES
        {
            return Ok(TxnOutcome::TooLarge);
        }
        crate::faults::check("rockq-etcd-txn-request")?;
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops).or_else(gets)).await?;
        crate::faults::check("rockq-etcd-txn-answer")?;
        if resp.succeeded() {
            let revision = resp.header().map_or(0, |h| h.revision());
            let mut added: Vec<(u32, i64)> = Vec::new();
            for (w, r) in last.iter().zip(resp.op_responses()) {
                let delta = match r {
                    TxnOpResponse::Put(p) if p.prev_key().is_none() => 1,
                    TxnOpResponse::Delete(d) => -d.deleted(),
                    _ => 0,
                };
                match added.iter_mut().find(|(k, _)| *k == w.keyspace) {
                    Some((_, n)) => *n += delta,
                    None => added.push((w.keyspace, delta)),
                }
            }
            return Ok(TxnOutcome::Applied { revision, added: Some(added) });
        }
        // Each get's whole answer: a claim's stretches of range-held jobs are range reads.
        let mut whole = super::whole_answers(&resp);
        let first = |w: &mut dyn Iterator<Item = Vec<etcd_client::KeyValue>>| {
            w.next().and_then(|kvs| kvs.into_iter().next())
        };
        let mut conflict = None;
        for &i in &checks {
            let found = first(&mut whole).map(|e| e.mod_revision() as u64);
            if let (None, Some(expect)) = (conflict, parts.kv[i].expect)
                && !expect.holds(found)
            {
                conflict = Some((i, found));
            }
        }
        if let Some(m) = first(&mut whole) {
            return Ok(TxnOutcome::Applied { revision: m.mod_revision(), added: None });
        }
        let mut claims = Vec::with_capacity(parts.claims.len());
        for c in parts.claims {
            claims.push(self.refused_claims(c, &mut whole)?);
        }
        let mut answers = whole.map(|kvs| kvs.into_iter().next());
        let mut tails = Vec::with_capacity(parts.appends.len());
        for _ in parts.appends {
            tails.push(answers.next().flatten().map(|t| decode_tail(t.key(), t.value())).transpose()?);
        }
        let owners = parts
            .ordered
            .iter()
            .map(|o| answers.next().flatten().is_some_and(|k| k.value() == o.owner))
            .collect();
        Ok(TxnOutcome::Refused(Refusal { conflict, claims, tails, owners }))
    }
}
