//! Import of an export file into a new embedded database.
//!
//! The database is written under a staging name beside the target, checked by opening it, and
//! renamed into place: an import that fails (a bad line, a file cut short, a full disk) leaves
//! nothing under the target name. The lines are checked by `import_check.rs` before anything
//! of them is written.

use std::path::Path;

use rocksdb::WriteBatch;

use super::backup::{check_target, clear_staging, install, make_parent, staging_path};
use super::db::storage;
use super::import_check::{Reader, Write};
use super::{keys, kv, records};
use crate::error::Error;
use crate::export::TransferReport;
use crate::options::Options;

/// Bytes of one write batch at most, before it is written.
const BATCH_BYTES: usize = 4 << 20;

/// Reads the export `input` into a new database at `into` (which must not exist, or be an
/// empty directory) and reports what it read. Blocking.
pub(crate) fn import(mut input: Reader, into: &Path) -> Result<TransferReport, Error> {
    check_target(into, true)?;
    make_parent(into)?;
    let staging = staging_path(into, "import");
    clear_staging(&staging)?;
    let written = write(&mut input, &staging);
    let checked = written.and_then(|()| {
        // Opening it is the check that the registry loads what was written.
        let (store, _) = super::open_read_only(&staging)?;
        store.close()?;
        Ok(())
    });
    match checked {
        Ok(()) => {
            install(&staging, into)?;
            let (mut report, _) = input.finish();
            report.path = Some(into.to_path_buf());
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

fn write(input: &mut Reader, dir: &Path) -> Result<(), Error> {
    let (store, _) = super::open(dir, &Options::default())?;
    let result = (|| {
        let guard = store.lock();
        let Some((db, cfs)) = guard.get() else { return Err(Error::Shutdown) };
        let Some(kv_cf) = cfs.kv else {
            return Err(Error::Internal("the keyspace column family is missing".into()));
        };
        let mut wb = WriteBatch::default();
        while let Some((_, w)) = input.next()? {
            match w {
                Write::Queue { name, meta, .. } => {
                    wb.put_cf(cfs.meta, keys::queue_key(&name), records::encode_queue(&meta));
                }
                Write::Message { qid, seq, envelope } => {
                    // The priority index is rebuilt from the envelopes (export leaves it out).
                    let priority = super::envelope::priority(&envelope);
                    if priority > 0 {
                        wb.put_cf(cfs.scheduled, keys::priority_key(qid, seq), [priority]);
                    }
                    wb.put_cf(cfs.messages, keys::message_key(qid, seq), envelope)
                }
                Write::Delayed { qid, id, due_micros, envelope } => {
                    wb.put_cf(cfs.scheduled, keys::due_key(due_micros, qid, id), envelope);
                    wb.put_cf(cfs.scheduled, keys::scheduled_id_key(qid, id), due_micros.to_be_bytes());
                }
                Write::Group { group, queue, record } => {
                    wb.put_cf(cfs.meta, keys::group_key(&group, &queue), record)
                }
                Write::Offset { group, queue, record } => {
                    wb.put_cf(cfs.offsets, keys::offset_key(&group, &queue), record);
                }
                Write::Claim { group, queue, seq, record } => {
                    wb.put_cf(cfs.claims, keys::claim_key(&keys::claim_prefix(&group, &queue), seq), record);
                }
                Write::Delivery { group, queue, seq, record } => {
                    wb.put_cf(
                        cfs.claims,
                        keys::claim_key(&keys::ordered_prefix(&group, &queue), seq),
                        record,
                    );
                }
                Write::Outcome { group, queue, seq, record } => {
                    wb.put_cf(
                        cfs.claims,
                        keys::claim_key(&keys::outcome_prefix(&group, &queue), seq),
                        record,
                    );
                }
                Write::Progress { group, queue, seq, record } => {
                    wb.put_cf(
                        cfs.claims,
                        keys::claim_key(&keys::progress_prefix(&group, &queue), seq),
                        record,
                    );
                }
                Write::Redrive { dlq, record } => wb.put_cf(cfs.meta, keys::redrive_key(&dlq), record),
                Write::Letter { dlq, seq } => wb.put_cf(cfs.meta, keys::letter_key(&dlq, seq), []),
                Write::Schedule { name, record } => {
                    wb.put_cf(cfs.scheduled, keys::schedule_key(&name), record)
                }
                Write::ScheduleDue { name, id, due_micros } => {
                    wb.put_cf(cfs.scheduled, keys::due_key(due_micros, keys::RECURRING, id), name.as_bytes());
                }
                Write::Dedup { qid, key, record, expires_micros } => {
                    wb.put_cf(cfs.dedup, keys::dedup_key(qid, key.as_bytes()), record);
                    wb.put_cf(cfs.dedup, keys::dedup_expiry_key(expires_micros, qid, key.as_bytes()), []);
                }
                // Its record is written at the end, with its count of keys.
                Write::Keyspace { .. } => {}
                Write::Entry { keyspace, key, revision, value } => {
                    wb.put_cf(kv_cf, kv::entry_key(keyspace, &key), kv::encode_entry(revision, &value));
                }
                Write::ScheduledId(next) => wb.put_cf(cfs.meta, keys::SCHEDULED_ID_KEY, next.to_be_bytes()),
            }
            if wb.size_in_bytes() >= BATCH_BYTES {
                db.write(std::mem::take(&mut wb)).map_err(storage)?;
            }
        }
        let summary = input.summary();
        for (name, id, count) in &summary.keyspaces {
            wb.put_cf(
                cfs.meta,
                [kv::KEYSPACE_PREFIX, name.as_bytes()].concat(),
                kv::encode_keyspace(*id, *count),
            );
        }
        if summary.kv_revision > 0 {
            wb.put_cf(cfs.meta, kv::REVISION_KEY, summary.kv_revision.to_be_bytes());
        }
        db.write(wb).map_err(|e| Error::Storage(storage(e)))
    })();
    let closed = store.close();
    result?;
    Ok(closed?)
}
