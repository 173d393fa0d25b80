//! Online backups of the embedded database, and restores of them.
//!
//! A backup is a RocksDB checkpoint: RocksDB flushes the memtables, holds back file deletions,
//! hard-links the live SST files into the new directory (copies them across filesystems),
//! copies the MANIFEST and the live WAL, and fsyncs what it wrote. It is the state of one
//! RocksDB sequence number across every column family, so every atomic write of rockq's
//! writer is in it whole or not at all: a send resolved before the backup began is there,
//! sequences have no holes, and no offset, claim or mark is ahead of the messages it is about.
//! Every record of rockq's lives in RocksDB (queues, messages, offsets, claims, marks,
//! settings, schedules, idempotency keys, keyspaces, the format record); nothing else needs
//! copying.
//!
//! A restore copies a backup into a new directory (SST files hard-linked: RocksDB never
//! modifies one; the MANIFEST, WAL and options copied, because opening a database appends to
//! them), fsyncs it, and renames it into place, so a restore stopped halfway leaves no
//! half-written database under the target name.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::checkpoint::Checkpoint;

use super::db::{Store, storage};
use crate::backup::BackupReport;
use crate::error::Error;

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: Some(path.to_path_buf()), source: Arc::new(source) }
}

/// Refuses a target that exists (a backup never overwrites anything); `empty_ok`: an empty
/// directory is taken (a restore into a prepared mount point).
pub(super) fn check_target(dir: &Path, empty_ok: bool) -> Result<(), Error> {
    let meta = match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
        Ok(meta) => meta,
    };
    if empty_ok && meta.is_dir() && fs::read_dir(dir).map_err(io(dir))?.next().is_none() {
        return Ok(());
    }
    Err(Error::Invalid {
        reason: format!(
            "{} already exists: a backup, restore or import writes a new directory",
            dir.display()
        ),
    })
}

/// Creates the parent directories of `dir`.
pub(super) fn make_parent(dir: &Path) -> Result<(), Error> {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => fs::create_dir_all(p).map_err(io(p)),
        _ => Ok(()),
    }
}

impl Store {
    /// Writes a checkpoint of the open database into `dir`, which must not exist, and reports
    /// it as read back. Blocking: RocksDB flushes and links while the writer goes on (the
    /// close of the store waits for it).
    pub(crate) fn backup(&self, dir: &Path) -> Result<BackupReport, Error> {
        check_target(dir, false)?;
        make_parent(dir)?;
        {
            let guard = self.lock();
            let Some(db) = guard.0.as_ref() else { return Err(Error::Shutdown) };
            let checkpoint = Checkpoint::new(db).map_err(|e| Error::Storage(storage(e)))?;
            checkpoint.create_checkpoint(dir).map_err(|e| Error::Storage(storage(e)))?;
        }
        report(dir)
    }
}

/// Copies the backup `from` into `to` (which must not exist, or be an empty directory), checks
/// the copy opens, and reports it. Blocking.
pub(crate) fn restore(from: &Path, to: &Path) -> Result<BackupReport, Error> {
    check_target(to, true)?;
    // Only a rockq database is restored (a foreign or newer one is refused here, untouched).
    let (source, _) = super::open_read_only(from)?;
    source.close()?;
    make_parent(to)?;
    let staging = staging_path(to, "restore");
    clear_staging(&staging)?;
    let copied = copy_files(from, &staging);
    if let Err(e) = copied {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    install(&staging, to)?;
    report(to)
}

/// `<parent>/.<name>.rockq-<what>`: beside the target, so the rename stays on one filesystem.
pub(super) fn staging_path(to: &Path, what: &str) -> PathBuf {
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "db".into());
    to.with_file_name(format!(".{name}.rockq-{what}"))
}

/// Removes what a restore or import stopped before its rename left in `staging` (nothing else
/// writes there), and creates it empty.
pub(super) fn clear_staging(staging: &Path) -> Result<(), Error> {
    if fs::symlink_metadata(staging).is_ok() {
        fs::remove_dir_all(staging).map_err(io(staging))?;
    }
    fs::create_dir(staging).map_err(io(staging))
}

/// Fsyncs `staging` and renames it to `to` (replacing the empty directory `check_target`
/// took), then fsyncs `to`'s parent: the database appears whole under its name or not at all.
pub(super) fn install(staging: &Path, to: &Path) -> Result<(), Error> {
    super::open::sync_dir(staging)?;
    if fs::symlink_metadata(to).is_ok() {
        fs::remove_dir(to).map_err(io(to))?;
    }
    fs::rename(staging, to).map_err(io(to))?;
    if let Some(parent) = to.parent().filter(|p| !p.as_os_str().is_empty()) {
        super::open::sync_dir(parent)?;
    }
    Ok(())
}

/// Copies the database files of `from` into `to`: SST files hard-linked where the filesystem
/// allows it, the rest copied and fsynced. The lock and RocksDB's info logs are left behind
/// (a backup that was opened has them).
fn copy_files(from: &Path, to: &Path) -> Result<(), Error> {
    for entry in fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let name = entry.file_name();
        let Some(text) = name.to_str() else { continue };
        if text == "LOCK" || text == "LOG" || text.starts_with("LOG.old") {
            continue;
        }
        let src = entry.path();
        if !entry.file_type().map_err(io(&src))?.is_file() {
            return Err(Error::NotRockq {
                path: from.to_path_buf(),
                reason: format!("{text} is not a file: a backup holds only RocksDB's files"),
            });
        }
        let dst = to.join(&name);
        if text.ends_with(".sst") && fs::hard_link(&src, &dst).is_ok() {
            continue;
        }
        fs::copy(&src, &dst).map_err(io(&dst))?;
        fs::File::open(&dst).and_then(|f| f.sync_all()).map_err(io(&dst))?;
    }
    Ok(())
}

/// Counts the files of `dir` and reads its registry back (opening it read-only, which checks
/// that it opens).
fn report(dir: &Path) -> Result<BackupReport, Error> {
    let (mut files, mut bytes, mut linked) = (0, 0, 0);
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let meta = entry.and_then(|e| e.metadata()).map_err(io(dir))?;
        if meta.is_file() {
            files += 1;
            bytes += meta.len();
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                linked += u64::from(meta.nlink() > 1);
            }
        }
    }
    let (copy, loaded) = super::open_read_only(dir)?;
    copy.close()?;
    let queues = loaded.queues.into_iter().map(|q| (q.name, q.meta.first_seq, q.last_seq)).collect();
    Ok(BackupReport { path: dir.to_path_buf(), files, bytes, linked, queues })
}
