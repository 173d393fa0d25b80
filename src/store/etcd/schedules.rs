//! Recurring schedules in etcd (`engine/etcd/schedules.rs` drives them): `N w/<name>` holds
//! a schedule's record (the RocksDB codec: its id, queue, recurrence, anchor, next firing,
//! counters and message). Its pending firing is a due-index entry like a delayed message's,
//! under the queue id `RECURRING` (`N sd/<next><RECURRING><id>`, and `N x/<RECURRING><id>` =
//! the due time and the schedule's name), so the timer every process runs finds it.
//!
//! Every change compares the record's `mod_revision` as read: an upsert, a pause, a delete, and
//! each firing, whose transaction appends the messages, rewrites the record with its next
//! firing and moves the due entry. Two processes firing one occurrence cannot both succeed:
//! the record's revision decides, so each occurrence fires once across processes and crashes.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::delayed::Marked;
use super::{EtcdStore, ScheduleWrite, corrupt};
use crate::error::StorageError;
use crate::model::ScheduleRecord;
use crate::store::keys::RECURRING;
use crate::store::scheduled::{decode_schedule, encode_schedule};

impl EtcdStore {
    fn schedule_key(&self, name: &str) -> Vec<u8> {
        self.key(b"w/", name.as_bytes())
    }

    /// Schedule `name` and its record's `mod_revision`, if it exists.
    pub async fn schedule(&self, name: &str) -> Result<Option<(ScheduleRecord, i64)>, StorageError> {
        let got = self.kv().get(self.schedule_key(name), None).await?;
        let Some(kv) = got.kvs().first() else { return Ok(None) };
        let rec = decode_schedule(kv.key(), kv.value()).map_err(corrupt)?;
        Ok(Some((rec, kv.mod_revision())))
    }

    /// Every schedule, by name, a page at a time (a schedule's record holds its message: the
    /// pages shrink under the client's answer limit).
    pub async fn schedules(&self) -> Result<Vec<(String, ScheduleRecord)>, StorageError> {
        let prefix = self.key(b"w/", b"");
        let end = crate::store::prefix_end(&prefix).unwrap_or_default();
        let (mut start, mut page, mut out) = (prefix.clone(), 256, Vec::new());
        loop {
            let opts = GetOptions::new().with_range(end.clone()).with_limit(page);
            let Some(got) = self.kv().get_bounded(start.clone(), Some(opts)).await? else {
                page = (page / 4).max(1);
                continue;
            };
            for kv in got.kvs() {
                let name = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                out.push((name, decode_schedule(kv.key(), kv.value()).map_err(corrupt)?));
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

    /// Adds a schedule change to a transaction: compared with the record as read, the record
    /// put (or deleted: `record` `None`), the old due entry deleted, the new one written.
    pub(super) fn push_schedule(
        &self,
        w: &ScheduleWrite<'_>,
        delete: bool,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) {
        let key = self.schedule_key(w.name);
        cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, w.rev));
        ops.push(match delete {
            true => TxnOp::delete(key, None),
            false => TxnOp::put(key, encode_schedule(w.record), None),
        });
        if let Some((due, id)) = w.unarm {
            ops.push(TxnOp::delete(self.due_key(due, RECURRING, id), None));
            // etcd refuses a transaction naming one key twice: a firing that re-arms the same
            // id overwrites its entry instead.
            if w.arm.is_none_or(|(_, next)| next != id) {
                ops.push(TxnOp::delete(self.delayed_key(RECURRING, id), None));
            }
        }
        if let Some((due, id)) = w.arm {
            ops.push(TxnOp::put(self.due_key(due, RECURRING, id), Vec::new(), None));
            let entry = super::delayed::encode_record(due, w.name.as_bytes());
            ops.push(TxnOp::put(self.delayed_key(RECURRING, id), entry, None));
        }
    }

    /// Writes (or, `delete`, deletes) a schedule as `w` says, in one transaction (with the
    /// call's marker, if `marked`). `false`: its record changed since it was read, nothing
    /// written.
    pub async fn write_schedule(
        &self,
        w: &ScheduleWrite<'_>,
        delete: bool,
        marked: Option<Marked>,
    ) -> Result<bool, StorageError> {
        let (mut cmps, mut ops) = (Vec::new(), Vec::new());
        self.push_schedule(w, delete, &mut cmps, &mut ops);
        self.push_marker(marked, &mut ops);
        crate::faults::check("rockq-etcd-schedule-write")?;
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops)).await?;
        crate::faults::check("rockq-etcd-schedule-answer")?;
        Ok(resp.succeeded())
    }
}
