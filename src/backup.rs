//! What a backup and a restore report ([`Broker::backup`](crate::Broker::backup),
//! [`Broker::restore`](crate::Broker::restore)).

use std::path::PathBuf;

/// A backup written by [`Broker::backup`](crate::Broker::backup), or a database written by
/// [`Broker::restore`](crate::Broker::restore): where, how big, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackupReport {
    /// The directory written.
    pub path: PathBuf,
    /// Files in it.
    pub files: u64,
    /// Bytes of those files. Files hard-linked to the source's share their blocks with it: on
    /// the same filesystem, the space newly taken is far less.
    pub bytes: u64,
    /// Files hard-linked rather than copied (RocksDB's SST files, which are never modified).
    pub linked: u64,
    /// Every queue it holds: `(name, first sequence, last sequence)`, read back from the copy
    /// (which is how a backup is checked: it opens and its registry loads).
    pub queues: Vec<(String, u64, u64)>,
}
