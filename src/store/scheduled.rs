//! Delayed messages, recurring schedules and idempotency keys in the store: their records, the
//! writer's operations on them, and the reads behind firing, expiry and listings.
//!
//! The due index (`t<due><queue><id>`, `keys.rs`) holds every delayed message and every
//! recurring schedule's next firing, in due order across all queues: the writer finds what is
//! due with one bounded seek from the start, and the timer needs only the first key. So a
//! million pending messages cost nothing until they fall due.

// Decoders read untrusted bytes: no indexing that could panic (the fuzz targets check it too).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::collections::HashMap;
use std::time::Duration;

use rocksdb::{ColumnFamily, DB};

use super::batch::Batch;
use super::db::{ReadError, scan, storage};
use super::keys;
use crate::error::CorruptionError;
use crate::model::{DedupRecord, ScheduleRecord};
use crate::schedule::{Missed, Recurrence, RecurrenceKind};
use crate::sent::Original;

/// One entry of the due index, as the writer reads it.
#[derive(Debug)]
pub(crate) struct DueEntry {
    pub due: u64,
    pub queue_id: u32,
    pub id: u64,
    /// A delayed message's envelope, or a recurring schedule's name.
    pub value: Vec<u8>,
}

pub(crate) fn decode_u64(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    let arr: [u8; 8] = v.try_into().map_err(|_| CorruptionError::new("counter", key, "not 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

const DEDUP_V1: u8 = 1;

/// `version u8, kind u8 (0 appended, 1 scheduled), seq or id u64, expires u64`.
pub(crate) fn encode_dedup(r: &DedupRecord) -> [u8; 18] {
    let (kind, value) = match r.original {
        Original::Appended(s) => (0u8, s),
        Original::Scheduled(id) => (1, id),
    };
    let mut v = [0u8; 18];
    v[0] = DEDUP_V1;
    v[1] = kind;
    v[2..10].copy_from_slice(&value.to_be_bytes());
    v[10..].copy_from_slice(&r.expires_micros.to_be_bytes());
    v
}

pub(crate) fn decode_dedup(key: &[u8], v: &[u8]) -> Result<DedupRecord, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("dedup record", key, r);
    if v.len() != 18 || v.first() != Some(&DEDUP_V1) {
        return Err(bad("unknown version or wrong length"));
    }
    let u64_at = |i: usize| {
        v.get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| bad("truncated"))
    };
    let value = u64_at(2)?;
    let original = match v.get(1) {
        Some(0) => Original::Appended(value),
        Some(1) => Original::Scheduled(value),
        _ => return Err(bad("unknown kind")),
    };
    Ok(DedupRecord { original, expires_micros: u64_at(10)? })
}

const SCHEDULE_V1: u8 = 1;

/// ```text
/// version u8, flags u8 (bit 0 paused), missed u8 (0 catch up once, 1 skip), kind u8 (0 cron,
/// 1 interval), then u64 BE: id, anchor, next, fired, missed firings, last time, last seq,
/// grace µs, interval µs (0 for cron); u16 BE + cron expression; u16 BE + queue; envelope
/// ```
pub(crate) fn encode_schedule(r: &ScheduleRecord) -> Vec<u8> {
    let micros = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
    let (kind, every, cron) = match &r.recurrence.kind {
        RecurrenceKind::Cron(e) => (0u8, 0u64, e.as_str()),
        RecurrenceKind::Every(d) => (1, micros(*d), ""),
    };
    let missed = match r.recurrence.missed {
        Missed::CatchUpOnce => 0u8,
        Missed::Skip => 1,
    };
    let mut v = Vec::with_capacity(4 + 72 + 4 + cron.len() + r.queue.len() + r.envelope.len());
    v.extend_from_slice(&[SCHEDULE_V1, u8::from(r.paused), missed, kind]);
    for n in [
        r.id,
        r.anchor_micros,
        r.next_micros,
        r.fired,
        r.missed_firings,
        r.last_micros,
        r.last_seq,
        micros(r.recurrence.grace),
        every,
    ] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    for s in [cron, r.queue.as_str()] {
        // Both are short (a cron expression; a validated queue name).
        let n = u16::try_from(s.len()).unwrap_or(u16::MAX);
        v.extend_from_slice(&n.to_be_bytes());
        v.extend_from_slice(s.as_bytes().get(..usize::from(n)).unwrap_or_default());
    }
    v.extend_from_slice(&r.envelope);
    v
}

pub(crate) fn decode_schedule(key: &[u8], v: &[u8]) -> Result<ScheduleRecord, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("schedule record", key, r);
    let head: [u8; 4] = v.get(..4).and_then(|h| h.try_into().ok()).ok_or_else(|| bad("truncated"))?;
    let [version, flags, missed, kind] = head;
    if version != SCHEDULE_V1 || flags > 1 {
        return Err(bad("unknown version or flags"));
    }
    let mut n = [0u64; 9];
    for (i, slot) in n.iter_mut().enumerate() {
        let at = 4 + i * 8;
        *slot = v
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| bad("truncated"))?;
    }
    let [id, anchor_micros, next_micros, fired, missed_firings, last_micros, last_seq, grace, every] = n;
    let mut at = 4 + 72;
    let mut text = |what: &str| -> Result<String, CorruptionError> {
        let len = v.get(at..at + 2).and_then(|b| b.try_into().ok()).map(u16::from_be_bytes);
        let len = usize::from(len.ok_or_else(|| bad(&format!("truncated {what}")))?);
        let s = v.get(at + 2..at + 2 + len).ok_or_else(|| bad(&format!("truncated {what}")))?;
        at += 2 + len;
        std::str::from_utf8(s).map(str::to_owned).map_err(|_| bad(&format!("{what} is not UTF-8")))
    };
    let cron = text("cron expression")?;
    let queue = text("queue")?;
    let recurrence_kind = match kind {
        0 => RecurrenceKind::Cron(cron),
        1 => RecurrenceKind::Every(Duration::from_micros(every)),
        _ => return Err(bad("unknown recurrence")),
    };
    let missed = match missed {
        0 => Missed::CatchUpOnce,
        1 => Missed::Skip,
        _ => return Err(bad("unknown missed policy")),
    };
    let envelope = v.get(at..).ok_or_else(|| bad("truncated envelope"))?.to_vec();
    Ok(ScheduleRecord {
        id,
        queue,
        recurrence: Recurrence { kind: recurrence_kind, missed, grace: Duration::from_micros(grace) },
        anchor_micros,
        paused: flags & 1 != 0,
        next_micros,
        fired,
        missed_firings,
        last_micros,
        last_seq,
        envelope,
    })
}

/// Per queue id: how many delayed messages wait, and the earliest due time. One pass over the
/// id index (at open, and for `Broker::stats`; the gauges use the writer's running count).
pub(super) fn scheduled_counts(db: &DB, cf: &ColumnFamily) -> Result<HashMap<u32, (u64, u64)>, ReadError> {
    let (lo, hi) = keys::scheduled_id_range(None);
    let mut out: HashMap<u32, (u64, u64)> = HashMap::new();
    for item in scan(db, cf, lo, hi) {
        let (k, v) = item.map_err(storage)?;
        let (q, _) = keys::parse_scheduled_id_key(&k)?;
        let due = decode_u64(&k, &v)?;
        let e = out.entry(q).or_insert((0, u64::MAX));
        e.0 += 1;
        e.1 = e.1.min(due);
    }
    Ok(out)
}

/// The earliest due entry's time (read at open: it arms the timer).
pub(super) fn first_due(db: &DB, cf: &ColumnFamily) -> Result<Option<u64>, ReadError> {
    let (lo, hi) = keys::due_range();
    match scan(db, cf, lo, hi).next() {
        Some(item) => {
            let (k, _) = item.map_err(storage)?;
            Ok(Some(keys::parse_due_key(&k)?.0))
        }
        None => Ok(None),
    }
}

impl Batch<'_> {
    /// Schedules a delayed message: its envelope in the due index, its due time by id.
    pub fn put_scheduled(&mut self, queue_id: u32, id: u64, due: u64, envelope: &[u8]) {
        self.wb.put_cf(self.cfs.scheduled, keys::due_key(due, queue_id, id), envelope);
        self.wb.put_cf(self.cfs.scheduled, keys::scheduled_id_key(queue_id, id), due.to_be_bytes());
    }

    /// Removes a delayed message from the schedule (it fired, or was cancelled or moved).
    pub fn delete_scheduled(&mut self, queue_id: u32, id: u64, due: u64) {
        self.wb.delete_cf(self.cfs.scheduled, keys::due_key(due, queue_id, id));
        self.wb.delete_cf(self.cfs.scheduled, keys::scheduled_id_key(queue_id, id));
    }

    /// Puts a recurring schedule's next firing into the due index.
    pub fn put_firing(&mut self, id: u64, due: u64, name: &str) {
        self.wb.put_cf(self.cfs.scheduled, keys::due_key(due, keys::RECURRING, id), name.as_bytes());
    }

    /// Removes one entry of the due index.
    pub fn delete_due(&mut self, due: u64, queue_id: u32, id: u64) {
        self.wb.delete_cf(self.cfs.scheduled, keys::due_key(due, queue_id, id));
    }

    /// Writes a recurring schedule's record.
    pub fn put_schedule(&mut self, name: &str, record: &ScheduleRecord) {
        self.wb.put_cf(self.cfs.scheduled, keys::schedule_key(name), encode_schedule(record));
    }

    /// Deletes a recurring schedule's record.
    pub fn delete_schedule(&mut self, name: &str) {
        self.wb.delete_cf(self.cfs.scheduled, keys::schedule_key(name));
    }

    /// Persists the next schedule id (ids are never reused, across restarts too).
    pub fn put_next_scheduled_id(&mut self, next: u64) {
        self.wb.put_cf(self.cfs.meta, keys::SCHEDULED_ID_KEY, next.to_be_bytes());
    }

    /// Records an idempotency key of `queue_id`, and its entry in the expiry index.
    pub fn put_dedup(&mut self, queue_id: u32, key: &[u8], record: &DedupRecord) {
        self.wb.put_cf(self.cfs.dedup, keys::dedup_key(queue_id, key), encode_dedup(record));
        self.wb.put_cf(self.cfs.dedup, keys::dedup_expiry_key(record.expires_micros, queue_id, key), []);
    }

    /// Forgets an idempotency key.
    pub fn delete_dedup(&mut self, queue_id: u32, key: &[u8]) {
        self.wb.delete_cf(self.cfs.dedup, keys::dedup_key(queue_id, key));
    }

    /// Deletes the expiry index up to and including the entry `(expires, queue_id, key)`
    /// (after their keys were dealt with), with one range tombstone.
    pub fn delete_dedup_expiry_through(&mut self, expires: u64, queue_id: u32, key: &[u8]) {
        let (lo, _) = keys::dedup_expired_range(0);
        let mut hi = keys::dedup_expiry_key(expires, queue_id, key);
        // The first key after it.
        hi.push(0);
        self.wb.delete_range_cf(self.cfs.dedup, lo, hi);
    }

    /// A delayed message's due time, if it is still scheduled.
    fn scheduled_due(&self, queue_id: u32, id: u64) -> Result<Option<u64>, ReadError> {
        let key = keys::scheduled_id_key(queue_id, id);
        match self.db.get_cf(self.cfs.scheduled, key).map_err(storage)? {
            Some(v) => Ok(Some(decode_u64(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// A delayed message still scheduled: its due time and envelope.
    pub fn scheduled(&self, queue_id: u32, id: u64) -> Result<Option<(u64, Vec<u8>)>, ReadError> {
        let Some(due) = self.scheduled_due(queue_id, id)? else { return Ok(None) };
        match self.db.get_cf(self.cfs.scheduled, keys::due_key(due, queue_id, id)).map_err(storage)? {
            Some(env) => Ok(Some((due, env))),
            None => Err(CorruptionError::new(
                "scheduled message",
                &keys::scheduled_id_key(queue_id, id),
                "its due entry is missing",
            )
            .into()),
        }
    }

    /// Due entries from time `from` up to time `through`, earliest first, at most `limits.0`
    /// of them and about `limits.1` bytes, leaving out those `skip` names (changed earlier in
    /// this round); and the due time of the first entry left in the index after them (`None`:
    /// nothing else is scheduled).
    pub fn due_entries(
        &self,
        from: u64,
        through: u64,
        limits: (usize, usize),
        skip: impl Fn(u32, u64) -> bool,
    ) -> Result<(Vec<DueEntry>, Option<u64>), ReadError> {
        let (limit, max_bytes) = limits;
        // From the writer's floor, not the start of the index: the entries fired before it are
        // tombstones, and a seek past them never walks them (the queue-head problem again).
        let lo = keys::due_key(from, 0, 0).to_vec();
        let (_, hi) = keys::due_range();
        let mut bytes = 0;
        let it = scan(self.db, self.cfs.scheduled, lo, hi);
        let mut out = Vec::new();
        for item in it {
            let (k, v) = item.map_err(storage)?;
            let (due, queue_id, id) = keys::parse_due_key(&k)?;
            if skip(queue_id, id) {
                continue;
            }
            if due > through || out.len() >= limit || (bytes >= max_bytes && !out.is_empty()) {
                return Ok((out, Some(due)));
            }
            bytes += v.len();
            out.push(DueEntry { due, queue_id, id, value: v.into_vec() });
        }
        Ok((out, None))
    }

    /// The record of idempotency key `key` of `queue_id`, if any (expired or not).
    pub fn dedup(&self, queue_id: u32, key: &[u8]) -> Result<Option<DedupRecord>, ReadError> {
        let k = keys::dedup_key(queue_id, key);
        match self.db.get_cf(self.cfs.dedup, &k).map_err(storage)? {
            Some(v) => Ok(Some(decode_dedup(&k, &v)?)),
            None => Ok(None),
        }
    }

    /// The record of recurring schedule `name`, if any.
    pub fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, ReadError> {
        let k = keys::schedule_key(name);
        match self.db.get_cf(self.cfs.scheduled, &k).map_err(storage)? {
            Some(v) => Ok(Some(decode_schedule(&k, &v)?)),
            None => Ok(None),
        }
    }
}

/// A delayed message as listed: `(queue_id, id, due, envelope)`.
pub(crate) type ScheduledEntry = (u32, u64, u64, Vec<u8>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_records_round_trip_and_reject_bad_bytes() {
        for original in [Original::Appended(7), Original::Scheduled(u64::MAX)] {
            let r = DedupRecord { original, expires_micros: 99 };
            let v = encode_dedup(&r);
            assert_eq!(decode_dedup(b"k", &v).unwrap(), r);
            for cut in 0..v.len() {
                assert!(decode_dedup(b"k", &v[..cut]).is_err());
            }
        }
        let mut v = encode_dedup(&DedupRecord { original: Original::Appended(1), expires_micros: 1 });
        v[1] = 7;
        assert!(decode_dedup(b"k", &v).is_err());
    }

    #[test]
    fn schedule_records_round_trip_and_reject_bad_bytes() {
        for recurrence in [
            Recurrence::cron("0 */5 * * * *").unwrap().on_missed(Missed::Skip),
            Recurrence::every(Duration::from_secs(30)).grace(Duration::from_secs(2)),
        ] {
            let r = ScheduleRecord {
                id: 3,
                queue: "reports".into(),
                recurrence,
                anchor_micros: 10,
                paused: true,
                next_micros: 20,
                fired: 4,
                missed_firings: 1,
                last_micros: 15,
                last_seq: 9,
                envelope: b"\x02\x00envelope".to_vec(),
            };
            let v = encode_schedule(&r);
            assert_eq!(decode_schedule(b"k", &v).unwrap(), r);
            // Every cut inside the fixed part and the two strings fails (the envelope is last).
            for cut in 0..v.len() - r.envelope.len() {
                assert!(decode_schedule(b"k", &v[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
}
