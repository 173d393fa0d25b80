//! Delayed messages in etcd (`engine/etcd/delayed.rs` drives them):
//!
//! | key | value |
//! | --- | --- |
//! | `N x/<qid u32><id u64>` | the delayed message: its due time (`u64` µs) and envelope |
//! | `N sd/<due u64><qid u32><id u64>` | the due index, empty: what the firing reads, in due order |
//! | `N y/<nonce u64>` | a call's marker (a submit, a cancel, a schedule's, a group's or a flow's deletion), empty, under an expiring lease (in-doubt writes) |
//! | `N meta/scheduled-id` | the next schedule id not handed out, `u64` |
//!
//! Both records of a message are written and deleted together, in one transaction. The due
//! index lies inside the namespace watch's range (`q/` to `t/`), so every process learns a new
//! earliest due time without polling; the records (envelopes) lie outside it, so the watch does
//! not carry them to every process.
//!
//! **Firing** is an append (`EtcdStore::append` with [`Along::Fired`]): the messages put at
//! the tail, the two records of each deleted, compared with the revision of each `x/` record
//! as read. Two processes firing the same message cannot both succeed: the second's compare
//! fails (the record is gone), and so does its tail's. A cancel or a reschedule compares the
//! same revision, so a firing and a cancel of one message exclude each other.
//!
//! **A submit** of delayed messages writes their records with the call's appended messages (the
//! same append transaction) or, if nothing is appended now, in a transaction of its own that
//! also puts the marker `y/<nonce>`: its answer lost, the marker says whether it was applied
//! (its messages may already have fired, so their records cannot tell). A cancel puts one
//! likewise ([`Marked`]): retried after a lost answer, it finds the record gone, and only the
//! marker tells its own cancel from a firing's or another process's.

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::{Along, DedupWrite, DelayedPut, EtcdStore, corrupt};
use crate::error::{CorruptionError, StorageError};

/// A call whose transaction also puts the marker `y/<nonce>` under an expiring `lease`: its
/// answer lost, and the records it compared found changed on the retry, the marker says whether
/// the change was this call's own (a cancel or a delete must not report "not there" for what it
/// removed itself).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marked {
    pub nonce: u64,
    pub lease: i64,
}

/// Schedule ids one process takes from the counter at a time.
const ID_BLOCK: u64 = 256;

/// A delayed message as stored: its queue, id, due time, envelope and record's revision.
#[derive(Debug, Clone)]
pub(crate) struct DelayedRecord {
    pub qid: u32,
    pub id: u64,
    pub due: u64,
    pub env: Vec<u8>,
    pub rev: i64,
}

/// A delayed message's record that does not decode: what fired it would have to guess.
#[derive(Debug)]
pub(crate) struct Undecodable {
    /// The record's revision, to compare its due entry's removal with.
    pub rev: i64,
    pub error: StorageError,
}

pub(super) fn encode_record(due: u64, env: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + env.len());
    v.extend_from_slice(&due.to_be_bytes());
    v.extend_from_slice(env);
    v
}

pub(super) fn decode_record(key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>), StorageError> {
    match v.split_first_chunk::<8>() {
        Some((due, env)) => Ok((u64::from_be_bytes(*due), env.to_vec())),
        None => Err(corrupt(CorruptionError::new("delayed message", key, "shorter than its due time"))),
    }
}

impl EtcdStore {
    pub(super) fn delayed_key(&self, qid: u32, id: u64) -> Vec<u8> {
        let mut rest = qid.to_be_bytes().to_vec();
        rest.extend_from_slice(&id.to_be_bytes());
        self.key(b"x/", &rest)
    }

    pub(super) fn due_key(&self, due: u64, qid: u32, id: u64) -> Vec<u8> {
        let mut rest = due.to_be_bytes().to_vec();
        rest.extend_from_slice(&qid.to_be_bytes());
        rest.extend_from_slice(&id.to_be_bytes());
        self.key(b"sd/", &rest)
    }

    pub(super) fn marker_key(&self, nonce: u64) -> Vec<u8> {
        self.key(b"y/", &nonce.to_be_bytes())
    }

    /// `(due, qid, id)` of a due-index key (`None`: not one).
    pub(super) fn parse_due_key(&self, key: &[u8]) -> Option<(u64, u32, u64)> {
        let rest = key.strip_prefix(self.key(b"sd/", b"").as_slice())?;
        let rest: &[u8; 20] = rest.try_into().ok()?;
        let due = u64::from_be_bytes(rest[..8].try_into().ok()?);
        let qid = u32::from_be_bytes(rest[8..12].try_into().ok()?);
        let id = u64::from_be_bytes(rest[12..].try_into().ok()?);
        Some((due, qid, id))
    }

    /// A block of fresh schedule ids, `first..first + ID_BLOCK`: taken from the namespace's
    /// counter by a compare-and-set, so no two processes (and no restart) hand out one twice.
    pub async fn take_scheduled_ids(&self) -> Result<(u64, u64), StorageError> {
        let first = self.take_ids(crate::store::keys::SCHEDULED_ID_KEY, ID_BLOCK, "schedule id").await?;
        Ok((first, first + ID_BLOCK))
    }

    /// The first of `count` fresh ids from the namespace's counter `meta/<name>` (`what`
    /// names it in errors), taken by a compare-and-set: no two processes (and no restart)
    /// hand out one twice. A missing counter starts at 1.
    pub(super) async fn take_ids(&self, name: &[u8], count: u64, what: &str) -> Result<u64, StorageError> {
        let kv = self.kv();
        let key = self.key(b"meta/", name);
        loop {
            let got = kv.get(key.clone(), None).await?;
            let (first, cmp) = match got.kvs().first() {
                Some(k) => {
                    let v: [u8; 8] = k.value().try_into().map_err(|_| {
                        corrupt(CorruptionError::new("id counter", k.key(), format!("{what}s: not 8 bytes")))
                    })?;
                    (
                        u64::from_be_bytes(v),
                        Compare::mod_revision(key.clone(), CompareOp::Equal, k.mod_revision()),
                    )
                }
                None => (1, Compare::version(key.clone(), CompareOp::Equal, 0)),
            };
            let end = first.checked_add(count).ok_or_else(|| StorageError::new(format!("no {what} left")))?;
            let txn =
                Txn::new().when([cmp]).and_then([TxnOp::put(key.clone(), end.to_be_bytes().to_vec(), None)]);
            if kv.txn(txn).await?.succeeded() {
                return Ok(first);
            }
        }
    }

    /// Adds what `along` carries to an append's transaction for queue `qid` (`last`: the
    /// append's new tail).
    pub(super) fn push_along(
        &self,
        qid: u32,
        along: Along<'_>,
        last: u64,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) {
        match along {
            Along::Nothing => {}
            Along::Schedule(w) => {
                let record = crate::model::ScheduleRecord { last_seq: last, ..w.record.clone() };
                self.push_schedule(&super::ScheduleWrite { record: &record, ..w.clone() }, false, cmps, ops);
            }
            Along::Delayed(puts) => self.push_delayed(qid, puts, ops),
            Along::Fired(fired) => {
                for f in fired {
                    let key = self.delayed_key(qid, f.id);
                    cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, f.rev));
                    ops.push(TxnOp::delete(key, None));
                    ops.push(TxnOp::delete(self.due_key(f.due, qid, f.id), None));
                }
            }
        }
    }

    fn push_delayed(&self, qid: u32, puts: &[DelayedPut<'_>], ops: &mut Vec<TxnOp>) {
        for p in puts {
            ops.push(TxnOp::put(self.delayed_key(qid, p.id), encode_record(p.due, p.env), None));
            ops.push(TxnOp::put(self.due_key(p.due, qid, p.id), Vec::new(), None));
        }
    }

    /// A submit that appends nothing now: its delayed messages' records and the idempotency
    /// keys' records (compared with the revisions they were read at) and its marker
    /// (`marked`), in one transaction. `false`: a key was recorded
    /// meanwhile, nothing written.
    pub async fn put_delayed(
        &self,
        qid: u32,
        puts: &[DelayedPut<'_>],
        dedup: Option<(&[DedupWrite], i64)>,
        marked: Marked,
    ) -> Result<bool, StorageError> {
        // Fenced by its own marker: a resend after a lost answer cannot write the records a
        // second time (after the first try's messages fired or were cancelled), should the
        // first try land late.
        let mut cmps = vec![Compare::version(self.marker_key(marked.nonce), CompareOp::Equal, 0)];
        let mut ops = Vec::with_capacity(2 * puts.len() + 1);
        self.push_delayed(qid, puts, &mut ops);
        self.push_marker(Some(marked), &mut ops);
        if let Some((records, lease)) = dedup {
            // Every record of this call names a delayed message (`scheduled`): `first` is unused.
            self.push_dedup(qid, 0, records, lease, &mut cmps, &mut ops);
        }
        crate::faults::check("rockq-etcd-delay-request")?;
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops)).await?;
        crate::faults::check("rockq-etcd-delay-answer")?;
        // Refused: a key recorded meanwhile, or this very call applied before (its marker).
        Ok(resp.succeeded() || self.marker_exists(marked.nonce).await?)
    }

    /// Whether the call named `nonce` was applied (its marker is there).
    pub async fn marker_exists(&self, nonce: u64) -> Result<bool, StorageError> {
        let opts = GetOptions::new().with_count_only();
        Ok(self.kv().get(self.marker_key(nonce), Some(opts)).await?.count() > 0)
    }

    /// The revision the call named `nonce` was applied at, if it was (its marker's).
    pub async fn marker_revision(&self, nonce: u64) -> Result<Option<i64>, StorageError> {
        let got = self.kv().get(self.marker_key(nonce), None).await?;
        Ok(got.kvs().first().map(|kv| kv.mod_revision()))
    }

    /// Delayed message `id` of queue `qid`, if it is scheduled.
    pub async fn delayed(&self, qid: u32, id: u64) -> Result<Option<DelayedRecord>, StorageError> {
        let got = self.kv().get(self.delayed_key(qid, id), None).await?;
        let Some(kv) = got.kvs().first() else { return Ok(None) };
        let (due, env) = decode_record(kv.key(), kv.value())?;
        Ok(Some(DelayedRecord { qid, id, due, env, rev: kv.mod_revision() }))
    }

    /// Takes delayed message `r` out of the schedule if its record is still as read. `false`:
    /// it changed meanwhile (fired, cancelled or moved elsewhere), nothing written. With
    /// `marked` (a [`Marked`] call), the call's marker goes in the same transaction.
    pub async fn cancel_delayed(
        &self,
        r: &DelayedRecord,
        marked: Option<Marked>,
    ) -> Result<bool, StorageError> {
        let key = self.delayed_key(r.qid, r.id);
        let mut ops =
            vec![TxnOp::delete(key.clone(), None), TxnOp::delete(self.due_key(r.due, r.qid, r.id), None)];
        self.push_marker(marked, &mut ops);
        let txn = Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, r.rev)]).and_then(ops);
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-cancel-answer")?;
        Ok(resp.succeeded())
    }

    /// The put of a [`Marked`] call's marker, if any.
    pub(super) fn push_marker(&self, marked: Option<Marked>, ops: &mut Vec<TxnOp>) {
        if let Some(m) = marked {
            ops.push(TxnOp::put(
                self.marker_key(m.nonce),
                Vec::new(),
                Some(PutOptions::new().with_lease(m.lease)),
            ));
        }
    }

    /// Moves delayed message `r` to `due` if its record is still as read (`false`: it changed
    /// meanwhile, nothing written).
    pub async fn move_delayed(&self, r: &DelayedRecord, due: u64) -> Result<bool, StorageError> {
        if due == r.due {
            // Where it is already (etcd refuses a transaction deleting and putting one key).
            return Ok(true);
        }
        let key = self.delayed_key(r.qid, r.id);
        let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, r.rev)]).and_then([
            TxnOp::delete(self.due_key(r.due, r.qid, r.id), None),
            TxnOp::put(self.due_key(due, r.qid, r.id), Vec::new(), None),
            TxnOp::put(key, encode_record(due, &r.env), None),
        ]);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// Up to `limit` entries of the due index due at or before `now`, in due order:
    /// `(due, qid, id)`.
    pub async fn due_entries(&self, now: u64, limit: usize) -> Result<Vec<(u64, u32, u64)>, StorageError> {
        let start = self.key(b"sd/", b"");
        let end = self.key(b"sd/", &now.saturating_add(1).to_be_bytes());
        let opts = GetOptions::new().with_range(end).with_keys_only().with_limit(limit as i64);
        let got = self.kv().get(start, Some(opts)).await?;
        Ok(got.kvs().iter().filter_map(|kv| self.parse_due_key(kv.key())).collect())
    }

    /// Deletes due-index entry `(due, qid, id)`, found stale (its record gone: `rev` 0, or due
    /// at another time), if the record is still as read — else it changed meanwhile and the
    /// entry may be live again: left for the next read.
    pub async fn drop_due_entry(
        &self,
        (due, qid, id): (u64, u32, u64),
        rev: i64,
    ) -> Result<(), StorageError> {
        let cmp = Compare::mod_revision(self.delayed_key(qid, id), CompareOp::Equal, rev);
        let txn = Txn::new().when([cmp]).and_then([TxnOp::delete(self.due_key(due, qid, id), None)]);
        self.kv().txn(txn).await.map(|_| ())
    }

    /// The earliest due time in the namespace, if anything is scheduled.
    pub async fn first_due(&self) -> Result<Option<u64>, StorageError> {
        let start = self.key(b"sd/", b"");
        let end = crate::store::prefix_end(&start).unwrap_or_default();
        let opts = GetOptions::new().with_range(end).with_keys_only().with_limit(1);
        let got = self.kv().get(start, Some(opts)).await?;
        Ok(got.kvs().first().and_then(|kv| self.parse_due_key(kv.key())).map(|(due, _, _)| due))
    }

    /// The records of `entries` (`(qid, id)`), in order (`None`: gone meanwhile; an error: a
    /// record that does not decode, one record's problem, not the read's).
    pub async fn delayed_records(
        &self,
        entries: &[(u32, u64)],
    ) -> Result<Vec<Option<Result<DelayedRecord, Undecodable>>>, StorageError> {
        let mut out = Vec::with_capacity(entries.len());
        // As many at a time as the client's answer limit lets through (records of up to 1 MiB).
        let mut rest = entries;
        let mut per = super::MAX_TXN_OPS;
        while !rest.is_empty() {
            let chunk = &rest[..per.min(rest.len())];
            let gets: Vec<TxnOp> =
                chunk.iter().map(|&(q, id)| TxnOp::get(self.delayed_key(q, id), None)).collect();
            let Some(resp) = self.kv().txn_bounded(Txn::new().and_then(gets)).await? else {
                per = (chunk.len() / 4).max(1);
                continue;
            };
            rest = &rest[chunk.len()..];
            for (kv, &(qid, id)) in super::answers(&resp).zip(chunk) {
                out.push(kv.map(|kv| {
                    let rev = kv.mod_revision();
                    match decode_record(kv.key(), kv.value()) {
                        Ok((due, env)) => Ok(DelayedRecord { qid, id, due, env, rev }),
                        Err(error) => Err(Undecodable { rev, error }),
                    }
                }));
            }
        }
        Ok(out)
    }

    /// Up to `limit` delayed messages of queue `qid` (every queue: `None`), in queue then id
    /// order, a page at a time.
    pub async fn list_delayed(
        &self,
        qid: Option<u32>,
        limit: usize,
    ) -> Result<Vec<DelayedRecord>, StorageError> {
        // Every queue: the whole `x/` range (a queue: its id's).
        let prefix = self.key(b"x/", qid.map(u32::to_be_bytes).as_ref().map_or(&[][..], |q| &q[..]));
        let end = crate::store::prefix_end(&prefix).unwrap_or_default();
        let base = self.key(b"x/", b"").len();
        let mut start = prefix;
        let mut out = Vec::new();
        let mut page = 256;
        while out.len() < limit {
            let n = (limit - out.len()).min(page) as i64;
            let opts = GetOptions::new().with_range(end.clone()).with_limit(n);
            // Over the client's answer limit (large messages): a quarter as many.
            let Some(got) = self.kv().get_bounded(start.clone(), Some(opts)).await? else {
                page = (page / 4).max(1);
                continue;
            };
            for kv in got.kvs() {
                let bad =
                    || corrupt(CorruptionError::new("delayed message", kv.key(), "expected <queue><id>"));
                let rest: &[u8; 12] = kv.key().get(base..).and_then(|r| r.try_into().ok()).ok_or_else(bad)?;
                let (q, id) = rest.split_at(4);
                let (due, env) = decode_record(kv.key(), kv.value())?;
                out.push(DelayedRecord {
                    qid: u32::from_be_bytes(q.try_into().map_err(|_| bad())?),
                    id: u64::from_be_bytes(id.try_into().map_err(|_| bad())?),
                    due,
                    env,
                    rev: kv.mod_revision(),
                });
            }
            match got.kvs().last() {
                Some(kv) if got.more() => {
                    start = kv.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(out)
    }

    /// Per queue: how many delayed messages it has and the earliest due time (the due index
    /// read keys only, a page at a time).
    pub async fn delayed_counts(&self) -> Result<HashMap<u32, (u64, u64)>, StorageError> {
        let mut start = self.key(b"sd/", b"");
        let end = crate::store::prefix_end(&start).unwrap_or_default();
        let mut out: HashMap<u32, (u64, u64)> = HashMap::new();
        loop {
            let opts = GetOptions::new().with_range(end.clone()).with_keys_only().with_limit(4096);
            let got = self.kv().get(start.clone(), Some(opts)).await?;
            for (due, qid, _) in got.kvs().iter().filter_map(|kv| self.parse_due_key(kv.key())) {
                let e = out.entry(qid).or_insert((0, due));
                e.0 += 1;
                e.1 = e.1.min(due);
            }
            match got.kvs().last() {
                Some(kv) if got.more() => {
                    start = kv.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(out),
            }
        }
    }
}
