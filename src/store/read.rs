//! The consumer read path: one bounded iterator per batch.

use bytes::Bytes;

use super::db::bounded;
use super::db::{ReadError, Store, storage};
use super::{envelope, keys};
use crate::error::{Error, StorageError};

/// A message as read from storage.
#[derive(Debug, Clone)]
pub(crate) struct RawMessage {
    pub seq: u64,
    pub enqueued_at_micros: u64,
    pub priority: u8,
    pub key: Option<String>,
    pub idempotency_key: Option<String>,
    pub headers: Vec<(String, Bytes)>,
    pub payload: Bytes,
}

impl RawMessage {
    /// Message `seq` as decoded from its envelope.
    pub fn new(seq: u64, env: envelope::Envelope) -> Self {
        RawMessage {
            seq,
            enqueued_at_micros: env.enqueued_at_micros,
            priority: env.priority,
            key: env.key,
            idempotency_key: env.idempotency_key,
            headers: env.headers,
            payload: env.payload,
        }
    }

    /// Its envelope again (a dead letter copies it).
    pub fn envelope(&self) -> envelope::Envelope {
        envelope::Envelope {
            enqueued_at_micros: self.enqueued_at_micros,
            priority: self.priority,
            key: self.key.clone(),
            idempotency_key: self.idempotency_key.clone(),
            headers: self.headers.clone(),
            payload: self.payload.clone(),
        }
    }
}

/// Outcome of a batch read when the store has been closed under it.
pub(crate) enum ReadOutcome {
    Messages(Vec<RawMessage>),
    Closed,
}

/// Reads messages `from..=to` of a queue, stopping early once `max_bytes` of values were read
/// (at least one message is always returned).
///
/// The iterator is bounded to exactly `[<q,from>, <q,to+1>)`: it never walks deleted entries
/// below the first live sequence nor past the last published one. It is not a tailing
/// iterator: a fresh iterator per batch sees everything the writer published, and the
/// contiguity check below catches any missing key (RocksDB issue 14677 is about tailing
/// iterators skipping keys; we do not depend on one). Blocking.
pub(crate) fn read_range(
    store: &Store,
    queue_name: &str,
    queue_id: u32,
    from: u64,
    to: u64,
    max_bytes: usize,
) -> Result<ReadOutcome, Error> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Ok(ReadOutcome::Closed);
    };
    crate::faults::check("rockq-read")?;
    let lo = keys::message_key(queue_id, from).to_vec();
    let hi = keys::message_upper_bound(queue_id, to);
    let mut it = db.raw_iterator_cf_opt(cfs.messages, bounded(lo.clone(), hi));
    it.seek(&lo);
    let want = usize::try_from(to - from + 1).unwrap_or(usize::MAX);
    // Values are copied into one buffer and decoded afterwards as slices of it: one allocation
    // per batch instead of one per payload. (A batch's buffer lives while any of its
    // deliveries does; batches are bounded by `max_bytes`.)
    let mut buf: Vec<u8> = Vec::new();
    let mut ends: Vec<usize> = Vec::with_capacity(want.min(4096));
    let mut bad: Option<Error> = None;
    let mut expected = from;
    while ends.len() < want && buf.len() < max_bytes {
        let Some((k, v)) = it.item() else { break };
        if let Err(e) = check_key(queue_name, expected, k) {
            bad = Some(e);
            break;
        }
        buf.extend_from_slice(v);
        ends.push(buf.len());
        expected += 1;
        it.next();
    }
    it.status().map_err(storage)?;
    drop(it);
    drop(guard);
    let buf = Bytes::from(buf);
    let mut out = Vec::with_capacity(ends.len());
    let mut start = 0;
    for (seq, end) in (from..).zip(ends) {
        let key = keys::message_key(queue_id, seq);
        match envelope::decode_shared(&key, &buf.slice(start..end)) {
            Ok(env) => out.push(RawMessage::new(seq, env)),
            // Hand out the good prefix first; the next read starts at the bad record and
            // reports it.
            Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
            Err(e) => return Err(e.into()),
        }
        start = end;
    }
    match bad {
        // The good prefix first, as above.
        Some(_) if !out.is_empty() => Ok(ReadOutcome::Messages(out)),
        Some(e) => Err(e),
        // The writer published `to` before we were asked to read it, so an empty read means
        // the key is missing.
        None if out.is_empty() => {
            Err(Error::Gap { queue: queue_name.to_owned(), expected: from, found: None })
        }
        None => Ok(ReadOutcome::Messages(out)),
    }
}

/// The key of the next message must be `<queue, expected>`: anything else is a gap.
fn check_key(queue_name: &str, expected: u64, k: &[u8]) -> Result<(), Error> {
    let (_, seq) = keys::decode_message_key(k)?;
    if seq != expected {
        return Err(Error::Gap { queue: queue_name.to_owned(), expected, found: Some(seq) });
    }
    Ok(())
}

fn decode_one(queue_name: &str, expected: u64, k: &[u8], v: &[u8]) -> Result<RawMessage, Error> {
    check_key(queue_name, expected, k)?;
    Ok(RawMessage::new(expected, envelope::decode(k, v)?))
}

/// Reads the messages at `seqs` (sorted ascending) with one batched multi-get: the work-queue
/// read path, whose claimed sequences need not be contiguous. A missing sequence is an error:
/// the caller only asks for sequences the writer published. Blocking.
pub(crate) fn read_seqs(
    store: &Store,
    queue_name: &str,
    queue_id: u32,
    seqs: &[u64],
) -> Result<ReadOutcome, Error> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Ok(ReadOutcome::Closed);
    };
    let keys: Vec<[u8; keys::MESSAGE_KEY_LEN]> =
        seqs.iter().map(|&s| keys::message_key(queue_id, s)).collect();
    let values = db.batched_multi_get_cf(cfs.messages, keys.iter().map(|k| k.as_slice()), true);
    let mut out = Vec::with_capacity(seqs.len());
    for ((&seq, k), v) in seqs.iter().zip(&keys).zip(values) {
        let Some(v) = v.map_err(storage)? else {
            return Err(Error::Gap { queue: queue_name.to_owned(), expected: seq, found: None });
        };
        out.push(decode_one(queue_name, seq, k, &v)?);
    }
    Ok(ReadOutcome::Messages(out))
}

/// The newest enqueue stamp among the last stored message of each of `queues` (id, last
/// sequence); 0 if there is none. Blocking; read once by the writer at open, so that stamps
/// never go back across a restart even if the wall clock stepped back meanwhile. A queue whose
/// last message fails to read or decode is skipped: this is a floor, not a check.
pub(crate) fn newest_stamp(store: &Store, queues: impl IntoIterator<Item = (u32, u64)>) -> u64 {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else { return 0 };
    queues
        .into_iter()
        .filter(|&(_, last)| last > 0)
        .filter_map(|(id, last)| db.get_cf(cfs.messages, keys::message_key(id, last)).ok().flatten())
        .filter_map(|v| super::envelope::enqueued_micros(&v))
        .max()
        .unwrap_or(0)
}

/// The redrive cursor of dead-letter queue `dlq` (`None`: never redriven). Blocking.
pub(crate) fn read_cursor(store: &Store, dlq: &str) -> Result<Option<u64>, crate::error::Error> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(crate::error::Error::Shutdown);
    };
    let key = keys::redrive_key(dlq);
    match db.get_cf(cfs.meta, &key).map_err(storage)? {
        Some(v) => Ok(Some(super::records::decode_cursor(&key, &v).map_err(Error::from)?)),
        None => Ok(None),
    }
}

/// The dead letters of `dlq` settled on their own above its cursor (see `keys::letter_key`).
pub(crate) fn letter_marks_in(
    db: &rocksdb::DB,
    meta: &rocksdb::ColumnFamily,
    dlq: &str,
) -> Result<std::collections::BTreeSet<u64>, ReadError> {
    let (lo, hi) = keys::letter_range(dlq);
    let mut out = std::collections::BTreeSet::new();
    for item in super::db::scan(db, meta, lo, hi) {
        let (k, _) = item.map_err(storage)?;
        out.insert(keys::letter_seq(&k)?);
    }
    Ok(out)
}

/// The letter marks of `dlq` (see `keys::letter_key`). Blocking.
pub(crate) fn read_letter_marks(store: &Store, dlq: &str) -> Result<std::collections::BTreeSet<u64>, Error> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(Error::Shutdown);
    };
    letter_marks_in(db, cfs.meta, dlq).map_err(Error::from)
}

/// The last sequence in `from..=to` of a queue whose envelope was enqueued at or before
/// `cutoff_micros`, scanning at most `max` messages from `from` (one bounded iterator; only the
/// fixed envelope header is decoded). `None` if the first one is newer. Blocking.
pub(crate) fn last_enqueued_before(
    store: &Store,
    queue_id: u32,
    from: u64,
    to: u64,
    cutoff_micros: u64,
    max: usize,
) -> Result<Option<u64>, StorageError> {
    scan_timestamps(store, queue_id, from, to, max, |_, ts| ts <= cutoff_micros).map(|(last, _)| last)
}

/// The first sequence in `from..=to` enqueued at or after `at_micros` (`None`: all are older).
/// Blocking.
pub(crate) fn first_enqueued_at(
    store: &Store,
    queue_id: u32,
    from: u64,
    to: u64,
    at_micros: u64,
) -> Result<Option<u64>, StorageError> {
    scan_timestamps(store, queue_id, from, to, usize::MAX, |_, ts| ts < at_micros).map(|(_, stop)| stop)
}

/// Walks `from..=to` while `keep_going(seq, enqueued_micros)` holds. Returns the last sequence it
/// held for and the first one it did not.
fn scan_timestamps(
    store: &Store,
    queue_id: u32,
    from: u64,
    to: u64,
    max: usize,
    mut keep_going: impl FnMut(u64, u64) -> bool,
) -> Result<(Option<u64>, Option<u64>), StorageError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Ok((None, None));
    };
    let lo = keys::message_key(queue_id, from).to_vec();
    let hi = keys::message_upper_bound(queue_id, to);
    let mut it = db.raw_iterator_cf_opt(cfs.messages, bounded(lo.clone(), hi));
    it.seek(&lo);
    let mut last = None;
    let mut seen = 0;
    while let Some((k, v)) = it.item() {
        if seen >= max {
            break;
        }
        seen += 1;
        let Ok((_, seq)) = keys::decode_message_key(k) else { break };
        let Some(ts) = envelope::enqueued_micros(v) else { break };
        if !keep_going(seq, ts) {
            return Ok((last, Some(seq)));
        }
        last = Some(seq);
        it.next();
    }
    it.status().map_err(storage)?;
    Ok((last, None))
}
