//! The admin reads, over the store alone: what is on disk is the truth for every figure here
//! (claims are written before a job is handed out, offsets before a commit is reported), so
//! a live broker and a read-only [`Inspector`](crate::Inspector) compute them the same way.
//!
//! Everything here is blocking: callers run it on the blocking pool.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rocksdb::{DB, Direction, IteratorMode};

use super::types::{GroupMode, GroupStats, PendingClaim, PendingState, QueueStats, Stats, StoredMessage};
use crate::error::{CorruptionError, InspectError, OpenError, StorageError};
use crate::store::records::{self, ClaimState, QueueRecord};
use crate::store::{self, Cfs, RawMessage, ReadOutcome, Store, bounded, envelope, keys};

fn from_open(e: OpenError) -> InspectError {
    match e {
        OpenError::Corrupt(c) => InspectError::Corrupt(c),
        OpenError::Storage(s) => InspectError::Storage(s),
        other => InspectError::Corrupt(CorruptionError::new("registry", b"", other.to_string())),
    }
}

fn micros_to_time(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

/// Age of the message `seq` at `now_micros`, `None` if it is not stored.
fn age_of(
    db: &DB,
    cfs: &Cfs<'_>,
    queue_id: u32,
    seq: u64,
    now_micros: u64,
) -> Result<Option<Duration>, StorageError> {
    let v = store::get_envelope(db, cfs.messages, queue_id, seq)?;
    Ok(v.as_deref()
        .and_then(envelope::enqueued_micros)
        .map(|ts| Duration::from_micros(now_micros.saturating_sub(ts))))
}

/// A live broker's in-memory leases, by group and queue: sequence → (attempt, deadline in
/// wall-clock µs). Empty for a read-only [`Inspector`](crate::Inspector).
pub(crate) type LiveLeases = HashMap<(String, String), HashMap<u64, (u32, u64)>>;

/// The lease deadline of claim `c` on `seq`: the live one if this process holds that very
/// attempt (it may have been extended since the record was written), else the record's.
fn deadline_of(live: Option<&HashMap<u64, (u32, u64)>>, seq: u64, c: &records::ClaimRecord) -> u64 {
    match live.and_then(|l| l.get(&seq)) {
        Some(&(attempt, deadline)) if attempt == c.attempt => deadline,
        _ => c.deadline_micros,
    }
}

/// Dead letters not yet redriven out of the queue `dlq`.
fn dlq_depth(db: &DB, cfs: &Cfs<'_>, q: &store::LoadedQueue) -> Result<u64, InspectError> {
    let key = keys::redrive_key(&q.name);
    let cursor = match db.get_cf(cfs.meta, &key).map_err(StorageError)? {
        Some(v) => records::decode_cursor(&key, &v)?,
        None => 0,
    };
    Ok(q.last_seq.saturating_sub(cursor.max(q.record.first_seq - 1)))
}

/// Every queue and group. `now_micros` is the broker clock's wall time.
pub(crate) fn stats(store: &Store, now_micros: u64, live: &LiveLeases) -> Result<Stats, InspectError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else { return Err(InspectError::Shutdown) };
    let loaded = store::load(db, &store.path, false).map_err(from_open)?;

    let mut queues = Vec::with_capacity(loaded.queues.len());
    for q in &loaded.queues {
        let (first, last) = (q.record.first_seq, q.last_seq);
        let lo = keys::message_key(q.record.id, 0);
        let hi = keys::queue_upper_bound(q.record.id);
        let bytes = db.get_approximate_sizes_cf(cfs.messages, &[rocksdb::Range::new(&lo, &hi)]);
        let oldest_age = if last >= first { age_of(db, &cfs, q.record.id, first, now_micros)? } else { None };
        queues.push(QueueStats {
            name: q.name.clone(),
            first_seq: first,
            last_seq: last,
            len: (last + 1).saturating_sub(first),
            bytes_on_disk: bytes.first().copied().unwrap_or(0),
            retention: q.record.retention,
            oldest_age,
        });
    }
    queues.sort_by(|a, b| a.name.cmp(&b.name));

    let by_name: HashMap<&str, &store::LoadedQueue> =
        loaded.queues.iter().map(|q| (q.name.as_str(), q)).collect();
    let mut claims: HashMap<(&str, &str), Vec<&store::LoadedClaim>> = HashMap::new();
    for c in &loaded.claims {
        claims.entry((c.group.as_str(), c.queue.as_str())).or_default().push(c);
    }
    let settings: HashMap<(&str, &str), &records::GroupSettings> =
        loaded.settings.iter().map(|s| ((s.group.as_str(), s.queue.as_str()), &s.settings)).collect();

    let mut groups = Vec::with_capacity(loaded.groups.len());
    for g in &loaded.groups {
        let Some(q) = by_name.get(g.queue.as_str()) else { continue };
        let (first, last) = (q.record.first_seq, q.last_seq);
        let setting = settings.get(&(g.group.as_str(), g.queue.as_str()));
        // Sequences finished above the offset, and claim counts (work-queue groups only).
        let mut done = BTreeSet::new();
        let (mut in_flight, mut waiting_retry) = (0u64, 0u64);
        let live = live.get(&(g.group.clone(), g.queue.clone()));
        for c in claims.get(&(g.group.as_str(), g.queue.as_str())).into_iter().flatten() {
            if c.seq <= g.committed || c.seq < first {
                continue; // left behind by a trim; ignored at open too
            }
            match c.record.state {
                ClaimState::Done => {
                    done.insert(c.seq);
                }
                ClaimState::Leased if deadline_of(live, c.seq, &c.record) > now_micros => in_flight += 1,
                ClaimState::Leased => {}
                ClaimState::Waiting => waiting_retry += 1,
            }
        }
        let start = (g.committed + 1).max(first);
        let lag = (last + 1).saturating_sub(start).saturating_sub(done.len() as u64);
        let oldest = (start..=last).find(|s| !done.contains(s));
        let oldest_unacked_age = match oldest {
            Some(seq) => age_of(db, &cfs, q.record.id, seq, now_micros)?,
            None => None,
        };
        let (mode, dead_letter_queue, dlq_depth) = if g.shared {
            let name = match setting.map(|s| s.dead_letter_queue.as_str()) {
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => format!("{}.dlq", g.queue),
            };
            let depth = match by_name.get(name.as_str()) {
                Some(d) => dlq_depth(db, &cfs, d)?,
                None => 0,
            };
            (GroupMode::WorkQueue, Some(name), depth)
        } else {
            (GroupMode::Ordered, None, 0)
        };
        groups.push(GroupStats {
            group: g.group.clone(),
            queue: g.queue.clone(),
            mode,
            committed: g.committed,
            lag,
            oldest_unacked_age,
            in_flight,
            waiting_retry,
            dead_letter_queue,
            dlq_depth,
            paused: setting.is_some_and(|s| s.paused),
        });
    }
    groups.sort_by(|a, b| (&a.queue, &a.group).cmp(&(&b.queue, &b.group)));
    Ok(Stats { queues, groups, bytes_on_disk: store::db_bytes(db, &cfs) })
}

/// The group's mode and committed offset, or `NoSuchGroup`.
fn group_record(
    db: &DB,
    cfs: &Cfs<'_>,
    group: &str,
    queue: &str,
) -> Result<records::OffsetRecord, InspectError> {
    let key = keys::offset_key(group, queue);
    match db.get_cf(cfs.offsets, &key).map_err(StorageError)? {
        Some(v) => Ok(records::decode_offset(&key, &v)?),
        None => Err(InspectError::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() }),
    }
}

/// The claimed, unfinished messages of a work-queue group (empty for an ordered group).
pub(crate) fn pending(
    store: &Store,
    group: &str,
    queue: &str,
    now_micros: u64,
    live: &LiveLeases,
) -> Result<Vec<PendingClaim>, InspectError> {
    crate::name::validate(crate::error::NameKind::Group, group)?;
    crate::name::validate(crate::error::NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else { return Err(InspectError::Shutdown) };
    let rec = group_record(db, &cfs, group, queue)?;
    if !rec.shared {
        return Ok(Vec::new());
    }
    let prefix = keys::claim_prefix(group, queue);
    let lo = keys::claim_key(&prefix, rec.committed.saturating_add(1));
    let hi = keys::claim_key(&prefix, u64::MAX);
    let live = live.get(&(group.to_owned(), queue.to_owned()));
    let mut out = Vec::new();
    let iter =
        db.iterator_cf_opt(cfs.claims, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward));
    for item in iter {
        let (k, v) = item.map_err(StorageError)?;
        let (_, _, seq) = keys::parse_claim_key(&k)?;
        let c = records::ClaimRecord::decode(&k, &v)?;
        let (state, lease_deadline, retry_at) = match c.state {
            ClaimState::Done => continue,
            ClaimState::Leased => {
                let deadline = deadline_of(live, seq, &c);
                let state = if deadline > now_micros { PendingState::Leased } else { PendingState::Expired };
                (state, Some(micros_to_time(deadline)), None)
            }
            ClaimState::Waiting => (PendingState::Waiting, None, Some(micros_to_time(c.not_before_micros))),
        };
        out.push(PendingClaim {
            seq,
            state,
            attempt: c.attempt,
            holder: (!c.holder.is_empty() && state != PendingState::Waiting).then(|| c.holder.to_string()),
            lease_deadline,
            retry_at,
            last_error: (!c.last_error.is_empty()).then_some(c.last_error),
        });
    }
    Ok(out)
}

/// The queue's record and last sequence.
fn queue_bounds(store: &Store, queue: &str) -> Result<(QueueRecord, u64), InspectError> {
    crate::name::validate(crate::error::NameKind::Queue, queue)?;
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else { return Err(InspectError::Shutdown) };
    let key = keys::queue_key(queue);
    let Some(v) = db.get_cf(cfs.meta, &key).map_err(StorageError)? else {
        return Err(InspectError::NoSuchQueue(queue.to_owned()));
    };
    let rec = QueueRecord::decode(&key, &v)?;
    let last = store::last_sequence(db, cfs.messages, &rec).map_err(from_open)?;
    Ok((rec, last))
}

fn read(store: &Store, queue: &str, id: u32, from: u64, to: u64) -> Result<Vec<RawMessage>, InspectError> {
    if from > to {
        return Ok(Vec::new());
    }
    match store::read_range(store, queue, id, from, to, 64 << 20) {
        Ok(ReadOutcome::Messages(m)) => Ok(m),
        Ok(ReadOutcome::Closed) => Err(InspectError::Shutdown),
        Err(crate::error::ReceiveError::Corrupt(c)) => Err(InspectError::Corrupt(c)),
        Err(crate::error::ReceiveError::Storage(s)) => Err(InspectError::Storage(s)),
        // Trimmed under us: show what is left.
        Err(crate::error::ReceiveError::Gap { .. }) => Ok(Vec::new()),
        Err(e) => Err(InspectError::Corrupt(CorruptionError::new("message", b"", e.to_string()))),
    }
}

/// Up to `limit` messages of `queue` from `from` (default: the first live one).
pub(crate) fn peek(
    store: &Store,
    queue: &str,
    from: Option<u64>,
    limit: usize,
) -> Result<Vec<StoredMessage>, InspectError> {
    let (rec, last) = queue_bounds(store, queue)?;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let from = from.unwrap_or(0).max(rec.first_seq);
    let to = last.min(from.saturating_add(limit as u64 - 1));
    Ok(read(store, queue, rec.id, from, to)?
        .into_iter()
        .map(|m| StoredMessage {
            seq: m.seq,
            enqueued_at: micros_to_time(m.enqueued_at_micros),
            headers: m.headers,
            payload: m.payload,
        })
        .collect())
}

/// Up to `limit` dead letters of `dlq` not yet redriven.
pub(crate) fn dead_letters(
    store: &Store,
    dlq: &str,
    limit: usize,
) -> Result<Vec<crate::DeadLetter>, InspectError> {
    let (rec, last) = queue_bounds(store, dlq)?;
    let cursor = match store::read_cursor(store, dlq) {
        Ok(c) => c.unwrap_or(0),
        Err(crate::error::RedriveError::Receive(crate::error::ReceiveError::Corrupt(c))) => {
            return Err(InspectError::Corrupt(c));
        }
        Err(crate::error::RedriveError::Storage(s)) => return Err(InspectError::Storage(s)),
        Err(_) => return Err(InspectError::Shutdown),
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let from = (cursor + 1).max(rec.first_seq);
    let to = last.min(from.saturating_add(limit as u64 - 1));
    Ok(read(store, dlq, rec.id, from, to)?.into_iter().map(crate::DeadLetter::from_raw).collect())
}
