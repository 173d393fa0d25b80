//! The open database: RocksDB behind a lock that `close` takes, and rockq's column families.

use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard};

use rocksdb::{ColumnFamily, DB, ReadOptions};

use super::keys;
use crate::error::{CorruptionError, StorageError};
use crate::stats::StorageStats;

/// RocksDB's error as ours (the message only: no RocksDB type leaves `store/`).
pub(super) fn storage(e: rocksdb::Error) -> StorageError {
    StorageError::new(e.into_string())
}

/// A read of a record failed: the storage engine failed, or the record does not decode.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
}

impl From<ReadError> for crate::error::Error {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Storage(s) => crate::error::Error::Storage(s),
            ReadError::Corrupt(c) => crate::error::Error::Corrupt(c),
        }
    }
}

pub(super) const CF_MESSAGES: &str = "rockq.messages";
pub(super) const CF_META: &str = "rockq.meta";
pub(super) const CF_OFFSETS: &str = "rockq.offsets";
pub(super) const CF_CLAIMS: &str = "rockq.claims";
/// Delayed messages and recurring schedules (`keys.rs`).
pub(super) const CF_SCHEDULED: &str = "rockq.scheduled";
/// Idempotency keys and their expiry index (`keys.rs`).
pub(super) const CF_DEDUP: &str = "rockq.dedup";
/// Keyspace entries (`kv.rs`). Not in [`ALL_CFS`]: an older database opened read-only may
/// lack it.
pub(super) const CF_KV: &str = "rockq.kv";
/// Column families this version opens. Missing ones are created at open, so a database from
/// an older build (without `rockq.claims`, or the format-1 ones without `rockq.scheduled` and
/// `rockq.dedup`) opens in a newer one.
pub(super) const ALL_CFS: [&str; 6] = [CF_MESSAGES, CF_META, CF_OFFSETS, CF_CLAIMS, CF_SCHEDULED, CF_DEDUP];

/// The open database. The `RwLock` lets `shutdown` close RocksDB (take it out) while handles
/// that still point here get a clean "closed" answer instead of a use-after-close.
pub(crate) struct Store {
    pub(super) db: RwLock<Option<DB>>,
    pub(crate) path: PathBuf,
    /// Kept for its statistics object, which RocksDB shares with the open database.
    pub(super) rocks_opts: rocksdb::Options,
    pub(super) statistics: bool,
    /// Opened with `open_read_only`: never written, not even at close.
    pub(crate) read_only: bool,
}

/// Bytes of live SST files over all column families, plus the memtables.
pub(super) fn db_bytes(db: &DB, cfs: &Cfs<'_>) -> u64 {
    [cfs.messages, cfs.meta, cfs.offsets, cfs.claims, cfs.scheduled, cfs.dedup]
        .into_iter()
        .chain(cfs.kv)
        .map(|cf| {
            let p = |name: &str| db.property_int_value_cf(cf, name).ok().flatten().unwrap_or(0);
            p("rocksdb.live-sst-files-size") + p("rocksdb.size-all-mem-tables")
        })
        .sum()
}

/// Handles of rockq's column families, valid while the read guard they came from is held.
pub(super) struct Cfs<'a> {
    pub messages: &'a ColumnFamily,
    pub meta: &'a ColumnFamily,
    pub offsets: &'a ColumnFamily,
    pub claims: &'a ColumnFamily,
    pub scheduled: &'a ColumnFamily,
    pub dedup: &'a ColumnFamily,
    /// Keyspace entries (`kv.rs`): absent only in an older database opened read-only.
    pub kv: Option<&'a ColumnFamily>,
}

/// A read lock on the open database.
pub(crate) struct DbGuard<'a>(pub(super) RwLockReadGuard<'a, Option<DB>>);

impl DbGuard<'_> {
    /// Whether the database is still open.
    pub fn is_open(&self) -> bool {
        self.0.is_some()
    }

    /// Fsyncs the WAL: everything written before is durable against power loss. `Ok` once
    /// closed (the close synced it).
    pub fn sync_wal(&self) -> Result<(), StorageError> {
        match self.0.as_ref() {
            Some(db) => db.flush_wal(true).map_err(storage),
            None => Ok(()),
        }
    }

    /// The database and its column families, or `None` once closed.
    pub(super) fn get(&self) -> Option<(&DB, Cfs<'_>)> {
        let db = self.0.as_ref()?;
        let cfs = Cfs {
            messages: db.cf_handle(CF_MESSAGES)?,
            meta: db.cf_handle(CF_META)?,
            offsets: db.cf_handle(CF_OFFSETS)?,
            claims: db.cf_handle(CF_CLAIMS)?,
            scheduled: db.cf_handle(CF_SCHEDULED)?,
            dedup: db.cf_handle(CF_DEDUP)?,
            kv: db.cf_handle(CF_KV),
        };
        Some((db, cfs))
    }
}

impl Store {
    /// Locks the database for use. Cheap: an uncontended read lock.
    pub fn lock(&self) -> DbGuard<'_> {
        DbGuard(self.db.read().unwrap_or_else(|poison| poison.into_inner()))
    }

    /// Syncs the WAL and closes RocksDB. Waits for in-flight reads. Idempotent.
    pub fn close(&self) -> Result<(), StorageError> {
        let db = self.db.write().unwrap_or_else(|poison| poison.into_inner()).take();
        match db {
            Some(db) if self.read_only => {
                drop(db);
                Ok(())
            }
            Some(db) => {
                let synced = db.flush_wal(true);
                drop(db);
                synced.map_err(storage)
            }
            None => Ok(()),
        }
    }

    /// Bytes of live SST files over all column families (what compaction can reclaim shows
    /// here), plus the memtables. Blocking.
    pub fn disk_bytes(&self) -> u64 {
        let guard = self.lock();
        guard.get().map_or(0, |(db, cfs)| db_bytes(db, &cfs))
    }

    /// Compacts the messages of each `(queue_id, below)` below `below` (a trimmed head), then
    /// the claims CF once, so deleted entries and their tombstones leave the disk. Kept job
    /// outcomes are left out of the claims' compaction: they are many and long-lived, and a
    /// trim deletes none of them (their own expiry leaves tombstones to ordinary compaction).
    /// Blocking.
    pub fn compact_trimmed(&self, trimmed: &[(u32, u64)]) -> Result<(), StorageError> {
        let guard = self.lock();
        let Some((db, cfs)) = guard.get() else { return Ok(()) };
        for &(queue_id, below) in trimmed {
            let lo = keys::message_key(queue_id, 0);
            let hi = keys::message_key(queue_id, below);
            db.compact_range_cf(cfs.messages, Some(&lo[..]), Some(&hi[..]));
        }
        let (outcomes, after) = keys::outcome_key_range();
        db.compact_range_cf(cfs.claims, None::<&[u8]>, Some(&outcomes[..]));
        db.compact_range_cf(cfs.claims, Some(&after[..]), None::<&[u8]>);
        Ok(())
    }

    /// RocksDB's WAL counters, if statistics were enabled at open.
    pub fn stats(&self) -> Option<StorageStats> {
        use rocksdb::statistics::Ticker;
        if !self.statistics {
            return None;
        }
        Some(StorageStats {
            wal_syncs: self.rocks_opts.get_ticker_count(Ticker::WalFileSynced),
            wal_bytes: self.rocks_opts.get_ticker_count(Ticker::WalFileBytes),
            writes_with_wal: self.rocks_opts.get_ticker_count(Ticker::WriteWithWal),
        })
    }
}

/// Read options bounding an iterator to `[lo, hi)` (iterate_lower_bound / upper_bound): it never
/// walks entries outside, tombstones included.
pub(super) fn bounded(lo: Vec<u8>, hi: Vec<u8>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    ro.set_iterate_lower_bound(lo);
    ro.set_iterate_upper_bound(hi);
    ro
}

/// Every entry of `cf` in `[lo, hi)`, in key order, through an iterator bounded to that range.
pub(super) fn scan<'a>(
    db: &'a DB,
    cf: &ColumnFamily,
    lo: Vec<u8>,
    hi: Vec<u8>,
) -> rocksdb::DBIteratorWithThreadMode<'a, DB> {
    let from = lo.clone();
    db.iterator_cf_opt(cf, bounded(lo, hi), rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward))
}
