//! The writer's half of keyspaces and transactions.
//!
//! A transaction is one request, applied within the round's one batch in two steps:
//!
//! 1. **Check everything**, writing nothing: the groups and queues it names still exist, each
//!    job was claimed in the group's current reset epoch and is above its offset (its lease was
//!    fenced by the caller, who moved it to settling: nobody else can settle it now), each
//!    ordered delivery is above its group's offset, every key condition holds — against this
//!    round's own writes first, then the store — and every idempotency key is looked up.
//! 2. **Apply everything**: key writes under one new revision, sends (appended, delayed or
//!    found duplicates), job acks (finished like any ack: the offset moves, claims go) and
//!    ordered acks (counted acknowledged in their subscription's window as the batch is built,
//!    so the round's offset commit passes them; an `Acked` mark keeps one that an earlier
//!    delivery still holds the offset below).
//!
//! A refused transaction wrote nothing: its jobs are leased to their holders again and its
//! ordered deliveries handed back. Either way the reply comes once the round is durable (or
//! at once for a refusal), so a committed transaction is as durable as the broker's mode.

use std::sync::Arc;

use super::round::Round;
use super::{schedule, work};
use crate::engine::registry::KeyspaceState;
use crate::engine::request::{KvRequest, KvWrite, Reply, TxApplied, TxDelivery, TxRequest, give_back};
use crate::error::Error;
use crate::events::Event;
use crate::model::OrderedMark;
use crate::stats::OutcomeKind;
use crate::telemetry;

pub(super) fn apply_kv(r: &mut Round<'_>, req: KvRequest) {
    match req {
        KvRequest::Create { name, reply } => create_keyspace(r, name, reply),
    }
}

fn create_keyspace(r: &mut Round<'_>, name: String, reply: Reply<Arc<KeyspaceState>, Error>) {
    let existing = r.engine.registry.keyspace(&name).or_else(|| r.written.keyspaces.get(&name).cloned());
    let state = match existing {
        Some(k) => k,
        None => {
            let id = r.written.next_keyspace_id;
            if id == u32::MAX {
                let _ = reply.send(Err(Error::Failed(crate::error::FailedError::internal(
                    "keyspace ids are used up",
                ))));
                return;
            }
            r.written.next_keyspace_id += 1;
            let state = KeyspaceState::new(id, &name, 0);
            r.batch.put_keyspace(&name, id, 0);
            r.written.keyspaces.insert(name, state.clone());
            let (engine, created) = (r.engine.clone(), state.clone());
            r.on_done(move |res| {
                if res.is_ok() {
                    tracing::debug!(keyspace = %created.name, id = created.id, "rockq: keyspace created");
                    engine.registry.keyspaces.insert(created.name.clone(), created);
                }
            });
            state
        }
    };
    // Answered after the creating round's completion (this round's, or an earlier one's: rounds
    // complete in order), so the keyspace is registered by then.
    r.on_done(move |res| drop(reply.send(res.map(|()| state).map_err(|e| Error::Storage(e.clone())))));
}

pub(super) fn apply(r: &mut Round<'_>, tx: TxRequest) {
    let now = r.stamp();
    let found = match check(r, &tx, now) {
        Ok(found) => found,
        Err(e) => {
            let TxRequest { jobs, deliveries, reply, .. } = tx;
            give_back(jobs, deliveries, e.is_conflict());
            let _ = reply.send(Err(e));
            return;
        }
    };
    let TxRequest { writes, sends, mut jobs, deliveries, reply } = tx;
    let Checked { revisions, originals } = found;

    // Keys: one new revision for all of the transaction's writes.
    let revision = writes.iter().any(|w| !w.condition_only).then(|| {
        r.written.kv_revision += 1;
        r.batch.put_kv_revision(r.written.kv_revision);
        r.written.kv_revision
    });
    for (w, before) in writes.into_iter().zip(revisions) {
        let (Some(rev), false) = (revision, w.condition_only) else { continue };
        write_key(r, w, before, rev);
    }

    // Sends, in order (a key seen earlier in the transaction counts as a duplicate).
    let mut sent = Vec::with_capacity(sends.len());
    for (s, original) in sends.into_iter().zip(originals) {
        let queue = s.queue.clone();
        // `None` cannot happen: `check` found the queue known to the writer.
        if let Some((one, _)) = schedule::put_submissions(r, &queue, vec![s.msg], vec![original], now) {
            sent.extend(one);
        }
    }

    for j in &mut jobs {
        if work::finish_seq(r, &j.group, j.seq) {
            let (kind, attempt, result) = (OutcomeKind::Acked, j.attempt, j.result.take());
            work::keep_outcome(r, &j.group, j.seq, work::Finish { kind, attempt, result });
        }
    }
    for d in &deliveries {
        ack_delivery(r, d);
    }

    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            for j in &jobs {
                let (queue, group) = (j.group.queue.name.clone(), j.group.name.clone());
                telemetry::group_counter(telemetry::ACKED, &queue, &group, 1);
                let (seq, attempt) = (j.seq, j.attempt);
                engine.emit(|| Event::Acked { queue, group, seq, attempt });
            }
        }
        // Ordered deliveries are dropped here, off the writer (their messages' buffers).
        drop(deliveries);
        let _ = reply.send(res.map(|()| TxApplied { revision, sent }).map_err(|e| Error::Storage(e.clone())));
    });
}

/// What the checks read, for the apply step: each write's key revision before it (`None`:
/// absent), and each send's original if its idempotency key is a duplicate.
struct Checked {
    revisions: Vec<Option<u64>>,
    originals: Vec<Option<crate::sent::Original>>,
}

/// Step 1: everything that could refuse the transaction, before anything is written.
fn check(r: &Round<'_>, tx: &TxRequest, now: u64) -> Result<Checked, Error> {
    for j in &tx.jobs {
        let g = &j.group;
        if g.is_deleted() {
            return Err(Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() });
        }
        // Claimed before a reset (which forgot the claim), or moved past by a purge or trim.
        if j.epoch != g.epoch() || j.seq <= g.progress().offset {
            return Err(g.lease_lost(j.seq, j.attempt));
        }
    }
    for d in &tx.deliveries {
        let g = &d.group;
        if g.is_deleted() {
            return Err(Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() });
        }
        if d.msg.seq <= g.acked.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::LeaseLost {
                queue: g.queue.name.to_string(),
                group: g.name.to_string(),
                seq: d.msg.seq,
                attempt: 0,
            });
        }
    }
    for s in &tx.sends {
        if s.queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: s.queue.name.to_string() });
        }
        // A handle exists only once the writer knows its queue; checked here so that the apply
        // step cannot fail halfway.
        if !r.written.next_seq.contains_key(&s.queue.id) {
            return Err(Error::Failed(crate::error::FailedError::internal(
                "send to a queue unknown to the writer",
            )));
        }
    }
    let mut revisions = Vec::with_capacity(tx.writes.len());
    for w in &tx.writes {
        let found = current_revision(r, &w.keyspace, &w.key)?;
        if let Some(expect) = w.expect
            && !expect.holds(found)
        {
            return Err(Error::Conflict {
                keyspace: w.keyspace.name.to_string(),
                key: w.key.clone(),
                expected: expect,
                found,
            });
        }
        revisions.push(found);
    }
    let mut originals = Vec::with_capacity(tx.sends.len());
    for s in &tx.sends {
        let one = schedule::lookup_originals(r, &s.queue, std::slice::from_ref(&s.msg), now)
            .map_err(Error::from)?;
        originals.extend(one);
    }
    Ok(Checked { revisions, originals })
}

/// The revision `key` of `keyspace` has as of this point of the round.
fn current_revision(r: &Round<'_>, keyspace: &KeyspaceState, key: &[u8]) -> Result<Option<u64>, Error> {
    if let Some(written) = r.jobs.kv.get(&keyspace.id).and_then(|keys| keys.get(key)) {
        return Ok(*written);
    }
    r.batch.kv_revision(keyspace.id, key).map_err(Error::from)
}

/// Writes (or deletes) one key under `revision`, keeping the keyspace's key count.
fn write_key(r: &mut Round<'_>, w: KvWrite, before: Option<u64>, revision: u64) {
    let KvWrite { keyspace, key, value, .. } = w;
    // An earlier write of this transaction to the same key changed what is there now.
    let written = r.jobs.kv.entry(keyspace.id).or_default();
    let before = written.get(key.as_slice()).copied().unwrap_or(before);
    let keys = keyspace.keys();
    let after = match &value {
        Some(v) => {
            r.batch.put_kv(keyspace.id, &key, revision, v);
            written.insert(key, Some(revision));
            if before.is_none() { keys + 1 } else { keys }
        }
        None => {
            r.batch.delete_kv(keyspace.id, &key);
            written.insert(key, None);
            if before.is_some() { keys.saturating_sub(1) } else { keys }
        }
    };
    if after != keys {
        keyspace.set_keys(after);
        r.batch.put_keyspace(&keyspace.name, keyspace.id, after);
    }
}

/// An ordered delivery acknowledged by the transaction (see the module's docs).
fn ack_delivery(r: &mut Round<'_>, d: &TxDelivery) {
    let (g, seq) = (&d.group, d.msg.seq);
    r.batch.put_mark(&g.keys, seq, &OrderedMark::Acked);
    // The round's offset commit deletes the mark if it passes it (in this same batch); the
    // commit loop runs after the requests, so a queued comeback would overwrite the mark
    // (review finding): dropped.
    let dropped = g.records().acked_by_transaction(seq);
    drop(dropped);
    // Counted acknowledged now: the group is dirty, and the commit loop after the requests
    // writes its offset in this batch.
    d.sub.ack(seq);
}
