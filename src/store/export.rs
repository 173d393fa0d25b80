//! Export of the embedded database: every record of rockq's, read under one RocksDB snapshot
//! (so across column families it is the database at one instant), as the lines of
//! `crate::export::record`. Queue and keyspace ids become names; every record is decoded on
//! the way, so an export never carries a corrupted one.

use std::collections::HashMap;

use rocksdb::{ColumnFamily, DB, DBIteratorWithThreadMode, Direction, IteratorMode, SnapshotWithThreadMode};

use super::db::{bounded, storage};
use super::keys::{self, MetaKey};
use super::{Store, envelope, kv, records, scheduled};
use crate::error::{CorruptionError, Error};
use crate::export::record::{Body, EXPORTED_QUEUE_ID, FORMAT_NAME, FORMAT_VERSION, Header, Record};

type Snap<'a> = SnapshotWithThreadMode<'a, DB>;

/// Every key of a column family rockq writes sorts below this.
const ALL_END: [u8; 5] = [0xff; 5];

/// `[lo, hi)` of `cf` as the snapshot `snap` sees it.
fn scan_at<'a>(
    db: &'a DB,
    snap: &Snap<'a>,
    cf: &ColumnFamily,
    lo: Vec<u8>,
    hi: Vec<u8>,
) -> DBIteratorWithThreadMode<'a, DB> {
    let mut ro = bounded(lo.clone(), hi);
    ro.set_snapshot(snap);
    db.iterator_cf_opt(cf, ro, IteratorMode::From(&lo, Direction::Forward))
}

/// A message envelope as an export body.
pub(in crate::store) fn body(key: &[u8], value: &[u8]) -> Result<Body, CorruptionError> {
    let e = envelope::decode(key, value)?;
    Ok(Body {
        enqueued_at_micros: e.enqueued_at_micros,
        key: e.key,
        idempotency_key: e.idempotency_key,
        priority: e.priority,
        headers: e.headers.into_iter().map(|(k, v)| (k, v.to_vec())).collect(),
        payload: e.payload.to_vec(),
    })
}

fn utf8(what: &'static str, key: &[u8], bytes: &[u8]) -> Result<String, CorruptionError> {
    std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| CorruptionError::new(what, key, "not UTF-8"))
}

struct QueueRow {
    name: String,
    id: u32,
    first_seq: u64,
    record: Vec<u8>,
}

impl Store {
    /// Reads the whole database under one snapshot and hands each line to `emit`, header first
    /// and `end` last. Blocking: run it on the blocking pool. Writers go on meanwhile.
    pub(crate) fn export(
        &self,
        now_micros: u64,
        emit: &mut dyn FnMut(Record) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let guard = self.lock();
        let Some((db, cfs)) = guard.get() else { return Err(Error::Shutdown) };
        let snap = db.snapshot();
        let all = |cf: &ColumnFamily| scan_at(db, &snap, cf, Vec::new(), ALL_END.to_vec());
        let mut lines = 0u64;
        let mut out = |r: Record| {
            lines += 1;
            emit(r)
        };

        // The meta column family is small: read it whole first, to order the lines.
        let mut queues = Vec::new();
        let mut rest = Vec::new();
        let mut keyspaces = Vec::new();
        for item in all(cfs.meta) {
            let (k, v) = item.map_err(storage)?;
            match keys::classify_meta(&k)? {
                MetaKey::Format | MetaKey::NextQueueId => {}
                MetaKey::Queue(name) => {
                    let meta = records::decode_queue(&k, &v)?;
                    // Ids are local to a database: the record goes out with a fixed one.
                    let record =
                        records::encode_queue(&crate::model::QueueMeta { id: EXPORTED_QUEUE_ID, ..meta })
                            .to_vec();
                    queues.push(QueueRow {
                        name: name.to_owned(),
                        id: meta.id,
                        first_seq: meta.first_seq,
                        record,
                    });
                }
                MetaKey::Group(group, queue) => {
                    records::decode_settings(&k, &v)?;
                    rest.push(Record::Group { group: group.into(), queue: queue.into(), record: v.to_vec() });
                }
                MetaKey::Redrive(dlq) => {
                    records::decode_cursor(&k, &v)?;
                    rest.push(Record::Redrive { dlq: dlq.into(), record: v.to_vec() });
                }
                MetaKey::Letter(dlq, seq) => rest.push(Record::Letter { dlq: dlq.into(), seq }),
                MetaKey::ScheduledId => {
                    let value = scheduled::decode_u64(&k, &v)?;
                    rest.push(Record::Counter { name: "scheduled-id".into(), value });
                }
                MetaKey::Other if &*k == kv::REVISION_KEY => {
                    let value = scheduled::decode_u64(&k, &v)?;
                    rest.push(Record::Counter { name: "kv-revision".into(), value });
                }
                MetaKey::Other if k.starts_with(kv::KEYSPACE_PREFIX) => {
                    let name = utf8("keyspace", &k, &k[kv::KEYSPACE_PREFIX.len()..])?;
                    let (id, _) = kv::decode_keyspace(&k, &v)?;
                    keyspaces.push((name, id));
                }
                MetaKey::Other => {
                    return Err(CorruptionError::new("meta record", &k, "not a key rockq writes").into());
                }
            }
        }
        let names: HashMap<u32, &str> = queues.iter().map(|q| (q.id, q.name.as_str())).collect();

        // Each queue's last sequence at the snapshot (the tail holds no tombstones).
        let mut lasts = Vec::with_capacity(queues.len());
        for q in &queues {
            let mut ro = bounded(
                keys::message_key(q.id, q.first_seq).to_vec(),
                keys::queue_upper_bound(q.id).to_vec(),
            );
            ro.set_snapshot(&snap);
            let mut it = db.raw_iterator_cf_opt(cfs.messages, ro);
            it.seek_to_last();
            it.status().map_err(storage)?;
            lasts.push(match it.key() {
                Some(k) => keys::decode_message_key(k)?.1,
                None => q.first_seq - 1,
            });
        }
        let (lo, hi) = keys::scheduled_id_range(None);
        let mut delayed = 0u64;
        for item in scan_at(db, &snap, cfs.scheduled, lo, hi) {
            item.map_err(storage)?;
            delayed += 1;
        }
        let queued: u64 =
            queues.iter().zip(&lasts).map(|(q, last)| (last + 1).saturating_sub(q.first_seq)).sum();
        out(Record::Header(Header {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            records_format: records::FORMAT_VERSION,
            source: "embedded".into(),
            rockq: env!("CARGO_PKG_VERSION").into(),
            exported_at_micros: now_micros,
            messages: queued + delayed,
        }))?;

        for (q, last) in queues.iter().zip(&lasts) {
            out(Record::Queue {
                name: q.name.clone(),
                first_seq: q.first_seq,
                last_seq: *last,
                record: q.record.clone(),
            })?;
            let hi = keys::message_upper_bound(q.id, *last);
            for item in scan_at(db, &snap, cfs.messages, keys::message_key(q.id, q.first_seq).to_vec(), hi) {
                let (k, v) = item.map_err(storage)?;
                let (_, seq) = keys::decode_message_key(&k)?;
                out(Record::Message { queue: q.name.clone(), seq, body: body(&k, &v)? })?;
            }
        }
        for r in rest {
            out(r)?;
        }
        for item in all(cfs.offsets) {
            let (k, v) = item.map_err(storage)?;
            let (group, queue) = keys::parse_offset_key(&k)?;
            records::decode_offset(&k, &v)?;
            out(Record::Offset { group: group.into(), queue: queue.into(), record: v.to_vec() })?;
        }
        for item in all(cfs.claims) {
            let (k, v) = item.map_err(storage)?;
            if k.starts_with(b"rate:") {
                // A rate bucket is this database's recent claims, not data: checked, not
                // exported (an imported group starts with a full burst).
                keys::parse_rate_key(&k)?;
                records::decode_rate(&k, &v)?;
                continue;
            }
            let record = v.to_vec();
            out(if k.starts_with(b"claim:") {
                let (group, queue, seq) = keys::parse_claim_key(&k)?;
                records::decode_claim(&k, &v)?;
                Record::Claim { group: group.into(), queue: queue.into(), seq, record }
            } else if k.starts_with(b"outcome:") {
                let (group, queue, seq) = keys::parse_outcome_key(&k)?;
                super::outcomes::decode_outcome(&k, &v)?;
                Record::Outcome { group: group.into(), queue: queue.into(), seq, record }
            } else if k.starts_with(b"progress:") {
                let (group, queue, seq) = keys::parse_progress_key(&k)?;
                super::outcomes::decode_progress(&k, &v)?;
                Record::Progress { group: group.into(), queue: queue.into(), seq, record }
            } else {
                let (group, queue, seq) = keys::parse_ordered_key(&k)?;
                records::decode_mark(&k, &v)?;
                Record::Delivery { group: group.into(), queue: queue.into(), seq, record }
            })?;
        }
        for item in all(cfs.scheduled) {
            let (k, v) = item.map_err(storage)?;
            match k.first() {
                Some(b't') => {
                    let (due_micros, qid, id) = keys::parse_due_key(&k)?;
                    if qid == keys::RECURRING {
                        out(Record::ScheduleDue {
                            name: utf8("schedule due entry", &k, &v)?,
                            id,
                            due_micros,
                        })?;
                    } else if let Some(queue) = names.get(&qid) {
                        out(Record::Delayed { queue: (*queue).into(), id, due_micros, body: body(&k, &v)? })?;
                    } else {
                        tracing::warn!(
                            queue_id = qid,
                            id,
                            "rockq: export: a delayed message of no queue; left out"
                        );
                    }
                }
                // The id index is rebuilt from the due entries, the priority index from the
                // messages.
                Some(b'i' | b'p') => {}
                // Flows are not exported (docs/operations.md): their steps name sequences of
                // this database, which an import does not keep.
                _ if super::flows::is_flow_key(&k) => {}
                _ => {
                    let name = keys::schedule_name_from_key(&k)?;
                    scheduled::decode_schedule(&k, &v)?;
                    out(Record::Schedule { name: name.into(), record: v.to_vec() })?;
                }
            }
        }
        for item in all(cfs.dedup) {
            let (k, v) = item.map_err(storage)?;
            // The expiry index is rebuilt from the records.
            if k.first() == Some(&b'x') {
                continue;
            }
            let bad = || CorruptionError::new("idempotency record key", &k, "expected k<queue><key>");
            let qid = k.get(1..5).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes).ok_or_else(bad)?;
            let key = utf8("idempotency key", &k, &k[5..])?;
            scheduled::decode_dedup(&k, &v)?;
            match names.get(&qid) {
                Some(queue) => out(Record::Dedup { queue: (*queue).into(), key, record: v.to_vec() })?,
                None => {
                    tracing::warn!(queue_id = qid, "rockq: export: an idempotency key of no queue; left out")
                }
            }
        }
        for (name, id) in &keyspaces {
            out(Record::Keyspace { name: name.clone() })?;
            let Some(kv_cf) = cfs.kv else { continue };
            let (lo, hi) = (id.to_be_bytes().to_vec(), kv::prefix_end(&id.to_be_bytes()).unwrap_or_default());
            for item in scan_at(db, &snap, kv_cf, lo, hi) {
                let (k, v) = item.map_err(storage)?;
                let (revision, value) = kv::decode_entry(&k, &v)?;
                out(Record::Entry { keyspace: name.clone(), key: k[4..].to_vec(), revision, value })?;
            }
        }
        let records = lines;
        emit(Record::End { records })
    }
}
