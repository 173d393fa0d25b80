//! [`Retention`]: how long a queue keeps its messages.

use std::time::Duration;

/// How long a queue keeps messages, persisted with the queue (see
/// [`Queue::set_retention`](crate::Queue::set_retention)). Deleted messages are removed with one
/// range tombstone per trim and the queue's first sequence moves past them, so readers never
/// walk deleted entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Delete a message once every group of the queue has finished it (its offset passed it; a
    /// work-queue group's offset never passes a claimed message). A queue without groups keeps
    /// everything. The default.
    #[default]
    UntilAcked,
    /// Delete messages enqueued longer ago than this, consumed or not. Groups that fall behind
    /// skip to the first live message (reported as [`Event::Skipped`](crate::Event::Skipped)).
    MaxAge(Duration),
    /// Keep at most this many messages, consumed or not; the oldest go first.
    MaxLen(u64),
    /// Never delete: a replayable log.
    Forever,
}
