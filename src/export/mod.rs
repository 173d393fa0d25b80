//! Export and import: a database's whole content as a stream of JSON lines, to move it to
//! another database (an embedded one, from either engine), to keep a readable copy, or to
//! inspect and edit it with other tools ([`Broker::export`](crate::Broker::export),
//! [`Broker::import`](crate::Broker::import), `rockq export` / `rockq import`).
//!
//! # The format (version 1)
//!
//! UTF-8, one JSON object per line, each with `"t"` naming its kind. Bytes are standard base64
//! with padding. The first line is the header, the last is `end`:
//!
//! ```text
//! {"t":"header","format":"rockq-export","version":1,"records_format":2,"source":"embedded","rockq":"0.1.0","exported_at_micros":…,"messages":3}
//! {"t":"queue","name":"orders","first_seq":1,"last_seq":3,"record":"…"}
//! {"t":"message","queue":"orders","seq":1,"body":{"enqueued_at_micros":…,"key":"customer-7","headers":[["h","dmFsdWU="]],"payload":"aGk="}}
//! {"t":"offset","group":"billing","queue":"orders","record":"…"}
//! {"t":"end","records":4}
//! ```
//!
//! | `t` | fields | what |
//! | --- | --- | --- |
//! | `header` | `format`, `version`, `records_format`, `source`, `rockq`, `exported_at_micros`, `messages` | first line; `messages` counts queued and delayed messages (for progress) |
//! | `queue` | `name`, `first_seq`, `last_seq`, `record` | a queue and its retention and dedup settings; before anything of it |
//! | `message` | `queue`, `seq`, `body` | a queued message, in sequence order |
//! | `delayed` | `queue`, `id`, `due_micros`, `body` | a delayed message not yet due |
//! | `group`, `offset` | `group`, `queue`, `record` | a group's settings; its offset (mode, last committed sequence) |
//! | `claim`, `delivery` | `group`, `queue`, `seq`, `record` | a work group's claim (leased, waiting retry, done); an ordered group's delivery mark |
//! | `outcome`, `progress` | `group`, `queue`, `seq`, `record` | a work group's kept job outcome ([`WorkGroup::keep_outcomes`](crate::WorkGroup::keep_outcomes)); an unfinished job's last progress report (added within version 1: written only by databases that have them) |
//! | `redrive`, `letter` | `dlq`, `record` / `seq` | a dead-letter queue's redrive cursor; a dead letter settled on its own above it |
//! | `schedule`, `schedule_due` | `name`, `record` / `id`, `due_micros` | a recurring schedule; its next firing |
//! | `dedup` | `queue`, `key`, `record` | an idempotency key's record (the original message, expiry) |
//! | `keyspace`, `entry` | `name` / `keyspace`, `key`, `revision`, `value` | a keyspace; its entries in key order |
//! | `counter` | `name`, `value` | `scheduled-id` (next schedule id), `kv-revision` (last keyspace revision) |
//! | `end` | `records` | last line: lines before it; a file without it was cut short |
//!
//! A `body` is `enqueued_at_micros`, optional `key` and `idempotency_key`, optional `headers`
//! (`[name, base64]` pairs) and `payload`. Messages, names, sequences and keyspace entries are
//! plain JSON. The `record` fields are rockq's own storage encoding of those state records,
//! base64, in the database format `records_format`: an import refuses a file whose
//! `records_format` this build does not write. Queue and keyspace ids are not exported (they
//! are local to a database); unknown kinds and fields are refused, not skipped.
//!
//! # What an export holds
//!
//! The database at one instant (a RocksDB snapshot across every column family), as
//! [`Broker::backup`](crate::Broker::backup) does: every send resolved before the export
//! started is in it, no offset or claim is ahead of the messages in it. Leases in it are
//! handed out again at once by the imported database, as after a restart.

pub(crate) mod record;

use std::path::PathBuf;

use record::Record;

/// What an export wrote or an import read, by kind of record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferReport {
    /// The database written (an import), `None` for an export.
    pub path: Option<PathBuf>,
    /// Lines, header and end included.
    pub records: u64,
    /// Bytes of those lines, newlines included.
    pub bytes: u64,
    /// Queues.
    pub queues: u64,
    /// Messages in queues.
    pub messages: u64,
    /// Delayed messages not yet due.
    pub delayed: u64,
    /// Groups (their offsets).
    pub groups: u64,
    /// Work groups' claims and progress reports, and ordered groups' delivery marks.
    pub claims: u64,
    /// Work groups' kept job outcomes.
    pub outcomes: u64,
    /// Recurring schedules.
    pub schedules: u64,
    /// Idempotency keys.
    pub idempotency_keys: u64,
    /// Keyspaces.
    pub keyspaces: u64,
    /// Keyspace entries.
    pub entries: u64,
}

/// How far an export or an import has come, passed to a progress callback about every
/// thousand lines and at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferProgress {
    /// Lines so far.
    pub records: u64,
    /// Messages so far (queued and delayed).
    pub messages: u64,
    /// Bytes so far.
    pub bytes: u64,
    /// Messages in the whole file (the header's count).
    pub total_messages: u64,
}

impl TransferReport {
    /// Counts one line of `bytes` bytes (its newline included).
    pub(crate) fn count(&mut self, r: &Record, bytes: u64) {
        self.records += 1;
        self.bytes += bytes;
        match r {
            Record::Queue { .. } => self.queues += 1,
            Record::Message { .. } => self.messages += 1,
            Record::Delayed { .. } => self.delayed += 1,
            Record::Offset { .. } => self.groups += 1,
            Record::Claim { .. } | Record::Delivery { .. } | Record::Progress { .. } => self.claims += 1,
            Record::Outcome { .. } => self.outcomes += 1,
            Record::Schedule { .. } => self.schedules += 1,
            Record::Dedup { .. } => self.idempotency_keys += 1,
            Record::Keyspace { .. } => self.keyspaces += 1,
            Record::Entry { .. } => self.entries += 1,
            Record::Header(_)
            | Record::Group { .. }
            | Record::Redrive { .. }
            | Record::Letter { .. }
            | Record::ScheduleDue { .. }
            | Record::Counter { .. }
            | Record::End { .. } => {}
        }
    }

    /// The progress this report stands for.
    pub(crate) fn progress(&self, total_messages: u64) -> TransferProgress {
        TransferProgress {
            records: self.records,
            messages: self.messages + self.delayed,
            bytes: self.bytes,
            total_messages,
        }
    }
}

/// How often a progress callback is called: every this many lines (and at the end).
pub(crate) const PROGRESS_EVERY: u64 = 1000;

/// A progress callback (called on the blocking thread doing the work).
pub(crate) type ProgressFn = Box<dyn FnMut(&TransferProgress) + Send>;
