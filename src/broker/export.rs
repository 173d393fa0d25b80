//! The export half of [`Broker`]: the database as JSON lines, and a database made from them.

use std::io::{Read, Write};
use std::path::Path;

use super::Broker;
use crate::error::Error;
use crate::export::{TransferProgress, TransferReport};

impl Broker {
    /// Writes the whole database to `out` as an export (the format: [`crate::export`]) while
    /// producers, subscriptions and worker pools go on: queues with their messages, delayed
    /// messages, groups with their offsets, settings, claims and delivery marks, dead-letter
    /// redrive state, recurring schedules, idempotency keys and keyspaces. Load it into a new
    /// database with [`Broker::import`].
    ///
    /// The export is the database at one instant (one RocksDB snapshot), as
    /// [`Broker::backup`]'s copy is: every send resolved before `export` was called is in it,
    /// no offset or claim is ahead of the messages in it. Leases in it are handed out again
    /// at once by the imported database, as after a restart; in-memory state (read-ahead,
    /// lease extensions not yet written) is not in it.
    ///
    /// `out` is written through a 1 MiB buffer on a blocking thread and flushed at the end;
    /// [`shutdown`](Broker::shutdown) waits for an export that is running.
    ///
    /// On the etcd engine the namespace is read at one etcd revision, a page at a time, and
    /// gives the same lines (what only etcd has — tails, ownership keys, purge and reset
    /// marks — is coordination between live processes and is left out). Importing it gives an
    /// embedded database with the namespace's state. An export that outlasts etcd's history
    /// (a compaction past its revision, which rockq's retention pass makes after trims) fails
    /// with [`Error::Storage`]: export again.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if writing to `out` fails (what was written is cut short: it has no
    /// `end` line, and an import refuses it), [`Error::Corrupt`] if a stored record does not
    /// decode, [`Error::Storage`], [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// The export runs on a blocking thread, which finishes on its own if the future is
    /// dropped; its report is then lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path().join("db")).await?;
    /// broker.queue("orders").await?.send("hello").await?;
    /// let file = std::fs::File::create(dir.path().join("orders.jsonl"))?;
    /// let report = broker.export(file).await?;
    /// assert_eq!(report.messages, 1);
    /// broker.shutdown().await?;
    ///
    /// let copy = rockq::Broker::import(
    ///     std::fs::File::open(dir.path().join("orders.jsonl"))?,
    ///     dir.path().join("copy"),
    /// )
    /// .await?;
    /// assert_eq!((copy.queues, copy.messages), (1, 1));
    /// # Ok(()) }
    /// ```
    pub async fn export(&self, out: impl Write + Send + 'static) -> Result<TransferReport, Error> {
        self.shared.export(Box::new(out), None).await
    }

    /// [`export`](Broker::export), calling `progress` about every thousand lines and at the
    /// end (on the blocking thread doing the export: keep it short).
    ///
    /// # Errors
    ///
    /// As [`export`](Broker::export).
    ///
    /// # Cancel safety
    ///
    /// As [`export`](Broker::export).
    pub async fn export_with_progress(
        &self,
        out: impl Write + Send + 'static,
        progress: impl FnMut(&TransferProgress) + Send + 'static,
    ) -> Result<TransferReport, Error> {
        self.shared.export(Box::new(out), Some(Box::new(progress))).await
    }

    /// Makes a new database at `into` (which must not exist, or be an empty directory) from
    /// the export read from `input`, and reports what it read; then [`Broker::open`] it.
    ///
    /// Every line is checked before it is written (names, sequences in order and inside their
    /// queue's range, every state record decodes, the `end` line counts the lines), and the
    /// database is written under a temporary name beside `into`, checked by opening it, and
    /// renamed into place: an import that fails leaves nothing under `into`. Queue and
    /// keyspace ids are handed out anew; sequences, offsets, claims (attempt counts
    /// included), idempotency windows and keyspace revisions are kept.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the line, for a file that is not an export, is cut short or
    /// holds a bad line, or if `into` exists and is not empty (nothing is written);
    /// [`Error::IncompatibleVersion`] for an export of another database format; [`Error::Io`]
    /// if reading `input` fails; [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// The import runs on a blocking thread, which finishes on its own if the future is
    /// dropped.
    ///
    /// # Examples
    ///
    /// See [`export`](Broker::export).
    pub async fn import(
        input: impl Read + Send + 'static,
        into: impl AsRef<Path>,
    ) -> Result<TransferReport, Error> {
        crate::engine::boundary::import(Box::new(input), into.as_ref().to_path_buf(), None).await
    }

    /// [`import`](Broker::import), calling `progress` about every thousand lines and at the
    /// end (`total_messages` is the header's count).
    ///
    /// # Errors
    ///
    /// As [`import`](Broker::import).
    ///
    /// # Cancel safety
    ///
    /// As [`import`](Broker::import).
    pub async fn import_with_progress(
        input: impl Read + Send + 'static,
        into: impl AsRef<Path>,
        progress: impl FnMut(&TransferProgress) + Send + 'static,
    ) -> Result<TransferReport, Error> {
        crate::engine::boundary::import(
            Box::new(input),
            into.as_ref().to_path_buf(),
            Some(Box::new(progress)),
        )
        .await
    }
}
