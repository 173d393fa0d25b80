//! Opening a database: deciding whether a path is ours, creating it, and loading the queue and
//! group registry.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use rocksdb::{ColumnFamilyDescriptor, DB, DBCompressionType, Direction, IteratorMode};

use super::db::{
    ALL_CFS, CF_CLAIMS, CF_MESSAGES, CF_META, CF_OFFSETS, CF_SCHEDULED, Store, bounded, storage,
};
use super::keys::{self, FORMAT_KEY};
use super::records::{self, FORMAT_VERSION};
use crate::error::Error;
use crate::model::{Claim, GroupOffset, GroupSettings, OrderedMark, QueueMeta};
use crate::options::Options;

/// A queue as found at open.
#[derive(Debug)]
pub(crate) struct LoadedQueue {
    pub name: String,
    pub meta: QueueMeta,
    /// Last written sequence, `meta.first_seq - 1` if the queue holds nothing.
    pub last_seq: u64,
}

/// A group offset as found at open.
#[derive(Debug)]
pub(crate) struct LoadedGroup {
    pub group: String,
    pub queue: String,
    pub offset: GroupOffset,
}

/// A work-queue group's claim as found at open.
#[derive(Debug)]
pub(crate) struct LoadedClaim {
    pub group: String,
    pub queue: String,
    pub seq: u64,
    pub claim: Claim,
}

/// An ordered group's mark as found at open.
#[derive(Debug)]
pub(crate) struct LoadedMark {
    pub group: String,
    pub queue: String,
    pub seq: u64,
    pub mark: OrderedMark,
}

/// A group's settings as found at open.
#[derive(Debug)]
pub(crate) struct LoadedSettings {
    pub group: String,
    pub queue: String,
    pub settings: GroupSettings,
}

/// Everything `open` loads besides the store itself.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub queues: Vec<LoadedQueue>,
    pub groups: Vec<LoadedGroup>,
    pub claims: Vec<LoadedClaim>,
    /// Work groups' progress reports `(group, queue, seq, report)`: few (running jobs that
    /// reported).
    pub progress: Vec<(String, String, u64, bytes::Bytes)>,
    /// Rate-limited work groups' buckets `(group, queue, next claim's time in wall micros)`.
    pub buckets: Vec<(String, String, u64)>,
    pub settings: Vec<LoadedSettings>,
    pub marks: Vec<LoadedMark>,
    /// The next schedule id to hand out (1 on a fresh database).
    pub next_scheduled_id: u64,
    /// The earliest entry of the due index (a delayed message or a recurring firing).
    pub first_due: Option<u64>,
    /// Per queue id: delayed messages waiting, and the earliest due time.
    pub scheduled: std::collections::HashMap<u32, (u64, u64)>,
    /// Every keyspace.
    pub keyspaces: Vec<super::kv::LoadedKeyspace>,
    /// Every sent flow step's job, and the next flow id (the writer takes them).
    pub flows: super::flows::LoadedFlows,
    /// The last keyspace revision handed out.
    pub kv_revision: u64,
    /// The priority index: `(queue id, seq, priority)` of each prioritised message retained.
    pub priorities: Vec<(u32, u64, u8)>,
}

enum PathState {
    Missing,
    Empty,
    RocksDb,
}

fn inspect(path: &Path) -> Result<PathState, Error> {
    let io = |source| Error::Io { path: Some(path.to_path_buf()), source: std::sync::Arc::new(source) };
    let not_ours = |reason: &str| Error::NotRockq { path: path.to_path_buf(), reason: reason.into() };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(PathState::Missing),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_dir() {
        return Err(not_ours("not a directory"));
    }
    let mut entries = std::fs::read_dir(path).map_err(io)?;
    if entries.next().is_none() {
        return Ok(PathState::Empty);
    }
    if path.join("CURRENT").is_file() {
        return Ok(PathState::RocksDb);
    }
    // A creation killed before RocksDB wrote `CURRENT` leaves only its own bookkeeping files
    // (found by the kill -9 pipeline test): no database anyone could open, so nothing to
    // lose. Created afresh, like an empty directory; anything else is not ours.
    let interrupted = std::fs::read_dir(path).map_err(io)?.all(|e| {
        e.ok().and_then(|e| e.file_name().into_string().ok()).is_some_and(|name| rocksdb_bookkeeping(&name))
    });
    if interrupted {
        tracing::warn!(path = %path.display(), "rockq: an interrupted database creation found; creating it again");
        Ok(PathState::Empty)
    } else {
        Err(not_ours("directory is not empty and holds no RocksDB database"))
    }
}

/// Files RocksDB writes while creating a database, before `CURRENT` names its manifest (its
/// first WAL comes after `CURRENT`: a directory with a WAL and no `CURRENT` is not ours), and
/// rockq's own creation marker.
fn rocksdb_bookkeeping(name: &str) -> bool {
    matches!(name, "LOCK" | "LOG" | "IDENTITY" | CREATING)
        || name.starts_with("LOG.old.")
        || name.starts_with("MANIFEST-")
        || name.starts_with("OPTIONS-")
        || name.ends_with(".dbtmp")
}

fn rocks_options(o: &Options) -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.increase_parallelism(2);
    opts.set_max_background_jobs(2);
    // Group commit happens in our writer; RocksDB's own write-thread batching would only add
    // a handoff for the single writer thread.
    opts.set_enable_pipelined_write(false);
    if o.statistics {
        opts.enable_statistics();
    }
    opts
}

fn messages_cf_options() -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    // Most messages are consumed and trimmed while they are still in L0/L1: compressing them
    // there spends CPU (at every flush, beside the writer) on data that is about to be
    // deleted. Levels below hold the long-retained tail, where LZ4 pays for itself.
    let mut levels = [DBCompressionType::Lz4; 7];
    levels[0] = DBCompressionType::None;
    levels[1] = DBCompressionType::None;
    opts.set_compression_per_level(&levels);
    // The queue head is a dense run of deletes: mark an SST for compaction when half of any
    // 32k-entry window is tombstones (the recipe's CompactOnDeletionCollector).
    opts.add_compact_on_deletion_collector_factory(32 * 1024, 16 * 1024, 0.5);
    // Each queue appends at its own tail: with many queues in one round, the memtable's
    // skiplist would search from its head for every key. A per-queue-id (4-byte prefix) insert
    // hint starts each search where that queue's previous key went.
    match opts.get_options_from_string("memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.4") {
        Ok(hinted) => hinted,
        Err(e) => {
            tracing::warn!(error = %e, "rockq: memtable insert hints unavailable");
            opts
        }
    }
}

/// The scheduled CF's due index is consumed from its head like a queue: the same collector
/// marks an SST for compaction once its head is mostly tombstones.
fn scheduled_cf_options() -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    opts.add_compact_on_deletion_collector_factory(32 * 1024, 16 * 1024, 0.5);
    opts
}

/// Options of column family `name`.
fn cf_options(name: &str) -> rocksdb::Options {
    match name {
        CF_MESSAGES => messages_cf_options(),
        CF_SCHEDULED => scheduled_cf_options(),
        _ => rocksdb::Options::default(),
    }
}

/// Opens the database at `path`. Blocking.
pub(crate) fn open(path: &Path, o: &Options) -> Result<(Store, Loaded), Error> {
    o.validate()?;
    let state = inspect(path)?;
    let not_ours = |reason: &str| Error::NotRockq { path: path.to_path_buf(), reason: reason.into() };
    let io = |source| Error::Io { path: Some(path.to_path_buf()), source: std::sync::Arc::new(source) };
    let creating = match state {
        PathState::Missing | PathState::Empty if !o.create_if_missing => {
            return Err(Error::NoDatabase { path: path.to_path_buf() });
        }
        PathState::Missing => {
            std::fs::create_dir_all(path).map_err(io)?;
            true
        }
        PathState::Empty => true,
        PathState::RocksDb => {
            // Checked before opening: opening would create our column families in a foreign
            // database, and "bad input changes nothing".
            let cfs = DB::list_cf(&rocksdb::Options::default(), path).map_err(|e| map_open_error(path, e))?;
            let interrupted = path.join(CREATING).is_file();
            if !cfs.iter().any(|c| c == CF_META) {
                if !interrupted {
                    return Err(not_ours("a RocksDB database without rockq's column families"));
                }
                tracing::warn!(path = %path.display(), "rockq: an interrupted database creation found; completing it");
            }
            interrupted
        }
    };
    // RocksDB creates a database, then each missing column family, one manifest write at a
    // time: a creation killed in between leaves a database with only some of them (or none of
    // rockq's), which would read as a foreign one for ever (found by the kill -9 pipeline
    // test). The marker, durable before RocksDB writes anything and removed once the format
    // marker is, says the database is rockq's own creation, to be completed.
    if creating {
        write_durably(&path.join(CREATING), b"rockq: database creation in progress\n").map_err(io)?;
        sync_dir(path)?;
    }

    let opts = rocks_options(o);
    // The keyspace CF is created like the others (a database from before keyspaces gains it).
    let descriptors = ALL_CFS
        .iter()
        .chain([&super::db::CF_KV])
        .map(|&name| ColumnFamilyDescriptor::new(name, cf_options(name)));
    let db = DB::open_cf_descriptors(&opts, path, descriptors).map_err(|e| map_open_error(path, e))?;
    let loaded = load(&db, path, true)?;
    if creating {
        // The format marker is durable (written with sync by `load`): the database is whole.
        std::fs::remove_file(path.join(CREATING)).map_err(io)?;
        sync_dir(path)?;
    }
    let store = Store {
        db: RwLock::new(Some(db)),
        path: path.to_path_buf(),
        rocks_opts: opts,
        statistics: o.statistics,
        read_only: false,
    };
    Ok((store, loaded))
}

/// Fsyncs a directory, so the names in it survive power loss (a no-op where directories cannot
/// be opened).
pub(super) fn sync_dir(dir: &Path) -> Result<(), Error> {
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|source| Error::Io { path: Some(dir.to_path_buf()), source: std::sync::Arc::new(source) })?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The file that marks a database creation in progress (see `open`).
const CREATING: &str = "ROCKQ-CREATING";

/// Writes `bytes` to a new file at `path` and fsyncs it.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Opens the database at `path` read-only: no lock is taken, so this works while another
/// process has it open, and nothing is ever written (not even the format marker). It sees
/// what was in the WAL and the SST files at this moment, not later writes. Blocking.
pub(crate) fn open_read_only(path: &Path) -> Result<(Store, Loaded), Error> {
    let not_ours = |reason: &str| Error::NotRockq { path: path.to_path_buf(), reason: reason.into() };
    match inspect(path)? {
        PathState::Missing | PathState::Empty => {
            return Err(Error::NoDatabase { path: path.to_path_buf() });
        }
        PathState::RocksDb => {}
    }
    let cfs = DB::list_cf(&rocksdb::Options::default(), path).map_err(|e| map_open_error(path, e))?;
    if !cfs.iter().any(|c| c == CF_META) {
        return Err(not_ours("a RocksDB database without rockq's column families"));
    }
    if let Some(missing) = ALL_CFS.iter().find(|&&c| !cfs.iter().any(|have| have == c)) {
        return Err(not_ours(&format!(
            "column family {missing} is missing (written by an older rockq: open it read-write once)"
        )));
    }
    let opts = rocks_options(&Options::default());
    // A database from before keyspaces has no keyspace CF: it reads as having no keyspaces.
    let kv = cfs.iter().any(|c| c == super::db::CF_KV).then_some(&super::db::CF_KV);
    let descriptors =
        ALL_CFS.iter().chain(kv).map(|&name| ColumnFamilyDescriptor::new(name, cf_options(name)));
    let db = DB::open_cf_descriptors_read_only(&opts, path, descriptors, false)
        .map_err(|e| map_open_error(path, e))?;
    let loaded = load(&db, path, false)?;
    let store = Store {
        db: RwLock::new(Some(db)),
        path: path.to_path_buf(),
        rocks_opts: opts,
        statistics: false,
        read_only: true,
    };
    Ok((store, loaded))
}

fn map_open_error(path: &Path, e: rocksdb::Error) -> Error {
    let msg = e.as_ref().to_ascii_lowercase();
    if msg.contains("lock") && (msg.contains("resource temporarily unavailable") || msg.contains("lock hold"))
    {
        Error::Locked { path: path.to_path_buf(), message: e.into_string() }
    } else {
        Error::Storage(storage(e))
    }
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, Error> {
    db.cf_handle(name).ok_or_else(|| Error::NotRockq {
        path: PathBuf::from(db.path()),
        reason: format!("column family {name} missing after open"),
    })
}

/// Reads the registry. `writable`: a fresh database gets its format marker.
pub(super) fn load(db: &DB, path: &Path, writable: bool) -> Result<Loaded, Error> {
    let meta = cf(db, CF_META)?;
    let messages = cf(db, CF_MESSAGES)?;
    let offsets = cf(db, CF_OFFSETS)?;
    let claims_cf = cf(db, CF_CLAIMS)?;

    match db.get_cf(meta, FORMAT_KEY).map_err(storage)? {
        Some(v) => match records::decode_format(&v) {
            Some(FORMAT_VERSION) => {}
            // Format 1 is format 2 without delayed messages, dedup records and envelope keys:
            // it reads as it is, and is marked 2 at the first writable open (so that an older
            // rockq refuses it instead of misreading version-2 envelopes).
            Some(1) if writable => {
                let mut wo = rocksdb::WriteOptions::default();
                wo.set_sync(true);
                db.put_cf_opt(meta, FORMAT_KEY, records::encode_format(), &wo).map_err(storage)?;
            }
            Some(1) => {}
            Some(found) => return Err(Error::IncompatibleVersion { found, supported: FORMAT_VERSION }),
            None => {
                return Err(Error::NotRockq {
                    path: path.to_path_buf(),
                    reason: "format marker is not rockq's".into(),
                });
            }
        },
        None => {
            // Fresh database, or a creation that crashed before the marker was written: both
            // are empty. Anything else without a marker is not ours.
            let empty = |cf| {
                // Every key rockq writes sorts below 0xff ff ff ff ff.
                db.iterator_cf_opt(cf, bounded(Vec::new(), vec![0xff; 5]), IteratorMode::Start)
                    .next()
                    .is_none()
            };
            if !(empty(meta) && empty(messages) && empty(offsets) && empty(claims_cf)) {
                return Err(Error::NotRockq {
                    path: path.to_path_buf(),
                    reason: "rockq column families without a format marker".into(),
                });
            }
            if !writable {
                return Ok(Loaded::default());
            }
            let mut wo = rocksdb::WriteOptions::default();
            wo.set_sync(true);
            db.put_cf_opt(meta, FORMAT_KEY, records::encode_format(), &wo).map_err(storage)?;
        }
    }

    let mut queues = Vec::new();
    let (lo, hi) = keys::queue_key_range();
    for item in db.iterator_cf_opt(meta, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let name = keys::queue_name_from_key(&k)?.to_owned();
        let meta = records::decode_queue(&k, &v)?;
        let last_seq = last_sequence(db, messages, &meta)?;
        queues.push(LoadedQueue { name, meta, last_seq });
    }

    let mut groups = Vec::new();
    let (lo, hi) = keys::offset_key_range();
    for item in
        db.iterator_cf_opt(offsets, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue) = keys::parse_offset_key(&k)?;
        let offset = records::decode_offset(&k, &v)?;
        groups.push(LoadedGroup { group: group.to_owned(), queue: queue.to_owned(), offset });
    }

    let mut claims = Vec::new();
    let (lo, hi) = keys::claim_key_range();
    for item in
        db.iterator_cf_opt(claims_cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue, seq) = keys::parse_claim_key(&k)?;
        let claim = records::decode_claim(&k, &v)?;
        claims.push(LoadedClaim { group: group.to_owned(), queue: queue.to_owned(), seq, claim });
    }

    let mut progress = Vec::new();
    let (lo, hi) = keys::progress_key_range();
    for item in
        db.iterator_cf_opt(claims_cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue, seq) = keys::parse_progress_key(&k)?;
        let report = super::outcomes::decode_progress(&k, &v)?;
        progress.push((group.to_owned(), queue.to_owned(), seq, report));
    }

    let mut buckets = Vec::new();
    let (lo, hi) = keys::rate_key_range();
    for item in
        db.iterator_cf_opt(claims_cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue) = keys::parse_rate_key(&k)?;
        buckets.push((group.to_owned(), queue.to_owned(), records::decode_rate(&k, &v)?));
    }

    // Ordered groups' marks: few (only messages whose deliveries came back).
    let mut marks = Vec::new();
    let (lo, hi) = keys::ordered_key_range();
    for item in
        db.iterator_cf_opt(claims_cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue, seq) = keys::parse_ordered_key(&k)?;
        let mark = records::decode_mark(&k, &v)?;
        marks.push(LoadedMark { group: group.to_owned(), queue: queue.to_owned(), seq, mark });
    }

    let mut settings = Vec::new();
    let (lo, hi) = keys::group_key_range();
    for item in db.iterator_cf_opt(meta, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (group, queue) = keys::parse_group_key(&k)?;
        let s = records::decode_settings(&k, &v)?;
        settings.push(LoadedSettings { group: group.to_owned(), queue: queue.to_owned(), settings: s });
    }
    let scheduled = cf(db, super::db::CF_SCHEDULED)?;
    let next_scheduled_id = match db.get_cf(meta, keys::SCHEDULED_ID_KEY).map_err(storage)? {
        Some(v) => super::scheduled::decode_u64(keys::SCHEDULED_ID_KEY, &v)?,
        None => 1,
    };
    let first_due = super::scheduled::first_due(db, scheduled).map_err(Error::from)?;
    let scheduled_counts = super::scheduled::scheduled_counts(db, scheduled).map_err(Error::from)?;
    let (keyspaces, kv_revision) = super::kv::load(db, meta).map_err(Error::from)?;
    let flows = super::flows::load(db, scheduled).map_err(Error::from)?;
    let mut priorities = Vec::new();
    let (lo, hi) = keys::priority_range(None);
    for item in
        db.iterator_cf_opt(scheduled, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let (qid, seq) = keys::parse_priority_key(&k)?;
        let priority = match *v {
            [p] if p > 0 => p,
            _ => {
                return Err(
                    crate::error::CorruptionError::new("priority", &k, "expected one byte, 1..=255").into()
                );
            }
        };
        priorities.push((qid, seq, priority));
    }
    Ok(Loaded {
        keyspaces,
        flows,
        kv_revision,
        priorities,
        queues,
        groups,
        claims,
        progress,
        buckets,
        settings,
        marks,
        next_scheduled_id,
        first_due,
        scheduled: scheduled_counts,
    })
}

/// The last sequence of a queue: the tail holds no tombstones (retention deletes from the
/// head), so a bounded `SeekToLast` is one cheap step.
pub(super) fn last_sequence(db: &DB, messages: &rocksdb::ColumnFamily, q: &QueueMeta) -> Result<u64, Error> {
    let lo = keys::message_key(q.id, q.first_seq).to_vec();
    let hi = keys::queue_upper_bound(q.id).to_vec();
    let mut it = db.raw_iterator_cf_opt(messages, bounded(lo, hi));
    it.seek_to_last();
    it.status().map_err(storage)?;
    match it.key() {
        Some(k) => {
            let (id, seq) = keys::decode_message_key(k)?;
            if id != q.id {
                return Err(crate::error::CorruptionError::new(
                    "message key",
                    k,
                    "outside its queue's bounds",
                )
                .into());
            }
            Ok(seq)
        }
        None => Ok(q.first_seq - 1),
    }
}
