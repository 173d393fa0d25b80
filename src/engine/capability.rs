//! What each engine carries out: **one table** for every refusal. A handle asks before it
//! acts (`Shared::check`); an engine's send check asks for what a send call needs (the etcd
//! engine: a call larger than one transaction); the etcd writer asks for any
//! request it has no handler for ([`for_request`]). An operation an engine does not carry out is refused with
//! [`Error::Unsupported`](crate::error::Error::Unsupported), naming it, and nothing changes.
//!
//! Adding a feature to the etcd engine is: build it there, then flip its row here (the tests
//! that expect the refusal fail until the table and the engine agree).

use super::request::{
    LifecycleRequest, OrderedRequest, QueueRequest, Request, RetentionRequest, ScheduleRequest, WorkRequest,
};
use crate::error::{Error, UnsupportedError};

/// The two engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// RocksDB in this process: everything.
    Embedded,
    /// An etcd namespace shared by many processes (feature `etcd`).
    #[allow(dead_code)] // built only with the etcd engine
    Etcd,
}

impl Flavour {
    /// The engine's name in refusals.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Embedded => "embedded",
            Flavour::Etcd => "etcd",
        }
    }
}

/// An operation that one engine may carry out and another not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // some rows are asked for only by the etcd writer (feature `etcd`)
pub(crate) enum Capability {
    /// `reset_to` of either group kind.
    ResetGroup,
    /// Pausing and resuming groups.
    PauseGroup,
    /// Deleting queues.
    DeleteQueue,
    /// Deleting groups.
    DeleteGroup,
    /// Purging a queue.
    PurgeQueue,
    /// Delayed messages: `submit` with a delay, `cancel`, `reschedule`, their listing.
    DelayedMessages,
    /// Recurring schedules (`Broker::schedule` and its siblings).
    Scheduling,
    /// Idempotency keys and the dedup window.
    IdempotencyKeys,
    /// Keyspaces, and transactions (`Request::Tx`).
    Keyspaces,
    /// A message larger than one etcd transaction (1 MiB), or a call recording more idempotency
    /// keys than one transaction holds: what etcd's limits on one transaction forbid.
    HugeMessage,
    /// `Durability::Buffered`.
    BufferedDurability,
    /// An operator's action on one job: retry now, delete, dead-letter.
    JobActions,
    /// Redriving or deleting one dead letter on its own.
    DeadLetterActions,
    /// `Broker::backup`: a copy of the store made by this process.
    Backup,
    /// `Broker::export`: a stream of the store's records, read at one instant.
    Export,
    /// `WorkGroup::keep_outcomes`: job outcome records and their retention.
    KeepOutcomes,
    /// `Task::progress`: progress reports of running jobs.
    JobProgress,
    /// `Message::priority` above 0: claims by priority.
    Priority,
    /// Flows of dependent jobs (`Broker::flow`).
    Flows,
}

impl Capability {
    /// What is refused, as the refusal names it.
    pub fn describe(self) -> &'static str {
        match self {
            Capability::ResetGroup => "resetting a group",
            Capability::PauseGroup => "pausing groups",
            Capability::DeleteQueue => "deleting queues",
            Capability::DeleteGroup => "deleting groups",
            Capability::PurgeQueue => "purging a queue",
            Capability::DelayedMessages => "delayed messages",
            Capability::Scheduling => "recurring schedules",
            Capability::IdempotencyKeys => "idempotency keys",
            Capability::Keyspaces => "keyspaces",
            Capability::HugeMessage => {
                "a message over 1 MiB, over 125 idempotency keys and prioritised messages in one call, a submit call with delayed messages larger than one transaction, a recurring schedule's message over 256 KiB, or a keyspace transaction of over 127 keys, 127 conditions or 1 MiB, or, in a flow larger than one transaction, a step message over 32 KiB or over 8,000 dependencies and first steps (the limits of one etcd transaction)"
            }
            Capability::BufferedDurability => "Durability::Buffered (every etcd write is a quorum write)",
            Capability::JobActions => "acting on one job (retry now, delete, dead-letter)",
            Capability::DeadLetterActions => "redriving or deleting one dead letter on its own",
            Capability::Backup => "a backup by the broker (back etcd up with `etcdctl snapshot save`)",
            Capability::Export => "an export of the store",
            Capability::KeepOutcomes => "keeping job outcomes (WorkGroup::keep_outcomes)",
            Capability::JobProgress => "progress reports of running jobs (Task::progress)",
            Capability::Priority => "a message priority (Message::priority)",
            Capability::Flows => "flows of dependent jobs (Broker::flow)",
        }
    }
}

/// **The table**: whether `flavour` carries out `cap`.
pub(crate) fn supports(flavour: Flavour, cap: Capability) -> bool {
    match flavour {
        Flavour::Embedded => true,
        // Everything below is refused on etcd until the etcd engine builds it (docs/DISTRIBUTED.md).
        Flavour::Etcd => match cap {
            Capability::IdempotencyKeys
            | Capability::PauseGroup
            | Capability::ResetGroup
            | Capability::PurgeQueue
            | Capability::JobActions
            | Capability::DeadLetterActions
            | Capability::KeepOutcomes
            | Capability::JobProgress
            | Capability::DelayedMessages
            | Capability::Scheduling
            | Capability::DeleteGroup
            | Capability::DeleteQueue
            | Capability::Keyspaces
            | Capability::Export
            | Capability::Priority
            | Capability::Flows => true,
            Capability::HugeMessage | Capability::BufferedDurability | Capability::Backup => false,
        },
    }
}

/// `Ok` if `flavour` carries out `cap`, else the refusal naming it.
pub(crate) fn check(flavour: Flavour, cap: Capability) -> Result<(), UnsupportedError> {
    match supports(flavour, cap) {
        true => Ok(()),
        false => Err(UnsupportedError::new(cap.describe(), flavour.name())),
    }
}

/// The error an engine answers when it has no code for `cap`: the table's refusal, or, should
/// the table claim the engine carries it out, an internal error saying so (a bug).
pub(crate) fn refusal(flavour: Flavour, cap: Capability) -> Error {
    match check(flavour, cap) {
        Err(u) => Error::Unsupported(u),
        Ok(()) => {
            Error::Internal(format!("the {} engine has no handler for {}", flavour.name(), cap.describe()))
        }
    }
}

/// The capability a write request needs, for an engine's writer that has no handler for it
/// (`None`: every engine must carry it out).
#[allow(dead_code)] // asked only by the etcd writer (feature `etcd`)
pub(crate) fn for_request(req: &Request) -> Option<Capability> {
    Some(match req {
        Request::Queue(QueueRequest::SetDedupWindow { .. }) => Capability::IdempotencyKeys,
        Request::Ordered(OrderedRequest::Reset { .. }) | Request::Work(WorkRequest::Reset { .. }) => {
            Capability::ResetGroup
        }
        Request::Retention(RetentionRequest::ExpireDedup { .. }) => Capability::IdempotencyKeys,
        Request::Retention(RetentionRequest::ExpireOutcomes { .. }) => Capability::KeepOutcomes,
        Request::Settings(_) => Capability::PauseGroup,
        Request::Schedule(
            ScheduleRequest::Upsert { .. } | ScheduleRequest::Pause { .. } | ScheduleRequest::Delete { .. },
        ) => Capability::Scheduling,
        Request::Schedule(_) => Capability::DelayedMessages,
        Request::Lifecycle(LifecycleRequest::DeleteQueue { .. }) => Capability::DeleteQueue,
        Request::Lifecycle(LifecycleRequest::DeleteGroup { .. }) => Capability::DeleteGroup,
        Request::Lifecycle(LifecycleRequest::PurgeQueue { .. }) => Capability::PurgeQueue,
        Request::Kv(_) | Request::Tx(_) => Capability::Keyspaces,
        Request::Flow(_) => Capability::Flows,
        Request::Work(WorkRequest::SettleLetter { .. }) => Capability::DeadLetterActions,
        _ => return None,
    })
}
