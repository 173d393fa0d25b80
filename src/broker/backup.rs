//! The backup half of [`Broker`]: online backups of the embedded database, and restores.

use std::path::Path;

use super::Broker;
use crate::backup::BackupReport;
use crate::error::Error;

impl Broker {
    /// Writes a consistent copy of the database into the new directory `dir` while producers,
    /// subscriptions and worker pools go on. Open the copy with [`Broker::restore`] (which
    /// keeps the backup as it is) or directly with [`Broker::open`].
    ///
    /// The copy is the database at one instant (one RocksDB sequence number across every
    /// column family), so each of rockq's atomic writes is in it whole or not at all:
    ///
    /// - every send resolved before `backup` was called is in it, and its queues have no
    ///   sequence holes;
    /// - no group's offset, claim or delivery record is ahead of the messages the copy holds,
    ///   and attempt counts, retries waiting, dead letters, settings, delayed messages and
    ///   schedules, idempotency keys and keyspaces are there as they were at that instant (a
    ///   job leased then is handed out again at once by the restored database, as after a
    ///   restart, as its next attempt).
    ///
    /// What is not in it: sends, acks and settlements still in flight then (they resolve later,
    /// in this database only), and this process's in-memory state (live subscriptions' read-ahead,
    /// lease extensions not yet written).
    ///
    /// It is cheap on the same filesystem: RocksDB flushes its memtables, hard-links the SST
    /// files (never modified, so sharing them is safe) and copies the small rest; on another
    /// filesystem every file is copied. The copy is fsynced before this returns, whatever the
    /// [`Durability`](crate::Durability): it survives power loss from then on. It is then
    /// opened read-only to check it and to report the queues it holds.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if `dir` exists (nothing is written), [`Error::Shutdown`],
    /// [`Error::Io`] if `dir`'s parent cannot be created, [`Error::Storage`] if RocksDB fails
    /// (a partial copy is removed), [`Error::Unsupported`] on the etcd engine (back etcd up
    /// with `etcdctl snapshot save`: a snapshot of the cluster holds every namespace).
    ///
    /// # Cancel safety
    ///
    /// The copy is made on a blocking thread, which finishes on its own if the future is
    /// dropped; the backup is then complete, but its report is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let report = broker.backup("/backups/rockq-2026-11-27").await?;
    /// println!("{} files, {} bytes", report.files, report.bytes);
    /// # Ok(()) }
    /// ```
    pub async fn backup(&self, dir: impl AsRef<Path>) -> Result<BackupReport, Error> {
        self.shared.backup(dir.as_ref().to_path_buf()).await
    }

    /// Restores the backup `backup` (written by [`Broker::backup`]) into the new database
    /// directory `into`, and returns what it holds; then [`Broker::open`] it. The backup is
    /// left as it was, so it can be restored again.
    ///
    /// SST files are hard-linked where `into` is on the backup's filesystem (RocksDB never
    /// modifies one), the rest is copied. Everything is written under a temporary name beside
    /// `into`, fsynced, and renamed into place: a restore stopped halfway leaves no database
    /// under `into` (the next restore removes the leftover).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if `into` exists and is not an empty directory (nothing is written),
    /// [`Error::NoDatabase`] or [`Error::NotRockq`] if `backup` holds no rockq database,
    /// [`Error::IncompatibleVersion`], [`Error::Io`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// The copy runs on a blocking thread, which finishes on its own if the future is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// rockq::Broker::restore("/backups/rockq-2026-11-27", "./data").await?;
    /// let broker = rockq::Broker::open("./data").await?;
    /// # Ok(()) }
    /// ```
    pub async fn restore(backup: impl AsRef<Path>, into: impl AsRef<Path>) -> Result<BackupReport, Error> {
        crate::engine::boundary::restore(backup.as_ref(), into.as_ref()).await
    }
}
