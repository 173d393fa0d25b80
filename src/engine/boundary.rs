//! The engine boundary: everything the public handles (`broker/`, `queue/`, `ordered/`,
//! `work/`, `pool/`, `dead_letter/`, `kv/`, `txn/`, `inspector.rs`) may ask of the engine, in
//! one list. Handles import engine items from here and nowhere else, never name `store/`, and
//! never reach into the engine past [`Shared`]'s methods (its `engine` and `backend` fields are
//! private to `engine/`). `tests/arch_layers.rs` checks the first two; the compiler enforces
//! the third.
//!
//! Both engines sit behind it: a handle cannot tell an embedded broker from an etcd one except
//! by what [`Shared::check`] refuses (`capability.rs`). Four parts:
//!
//! 1. **Opening and the handle anchor**: [`open`] (RocksDB) and `connect_etcd` (feature
//!    `etcd`) start an engine with its background tasks and return the [`Shared`] every handle
//!    holds; [`Shared::close`] stops it. [`ReadOnly`] opens a database for inspection only.
//! 2. **The request set**: [`Request`] and its per-concept enums, sent to the writer over
//!    `Shared::tx`, each answered on its reply channel; sends are staged with
//!    [`Shared::stage`] and resolve through a [`Completion`]. Messages are checked with
//!    [`validate`] and [`body_len`] on the caller's task first, and a send call with
//!    [`Shared::check_send`]; any other operation an engine may not carry out with
//!    [`Shared::check`] and a [`Capability`].
//! 3. **Reads**: blocking ones (run them on the blocking pool) [`Shared::read_range`],
//!    [`Shared::read_seqs`], [`Shared::read_cursor`], [`Shared::kv_get`], [`Shared::kv_scan`];
//!    async ones [`Shared::stats`], [`Shared::pending`], [`Shared::peek`],
//!    [`Shared::scheduled`], [`Shared::schedules`]; [`Shared::trim`] and
//!    [`Shared::reset_target`] read and then request; [`ReadOnly`]'s. Lookups:
//!    [`Shared::queue`], [`Shared::ordered_group`], [`Shared::work_group`].
//! 4. **Wake-ups**: a queue's `watch` of its last published sequence ([`QueueState::watch`]:
//!    new messages, pauses, shutdown; counted, so that queues nobody waits on skip the send), a
//!    work group's `Notify` ([`WorkGroupState::changed`]: releases, new retry times),
//!    [`Shared::mark_dirty`] / [`Shared::mark_work_dirty`] plus `Shared::nudge_writer` (acks for
//!    the writer's next round), the event broadcast ([`Shared::events`]), and
//!    `Shared::closing` (shutdown began).
//!
//! The in-memory state the handles share with the engine ([`QueueState`],
//! [`OrderedGroupState`], [`WorkGroupState`] and the claim state machine's values) is part of
//! the boundary too: both engines keep the same state machine, each feeding it from its own
//! store.

pub(crate) use super::backend::{OwnerHold, cfg_etcd};
pub(crate) use super::capability::Capability;
#[cfg(test)]
pub(crate) use super::completion::Resolver;
pub(crate) use super::completion::{Completion, staged_sent};
cfg_etcd! {
    pub(crate) use super::connect::connect as connect_etcd;
    pub(crate) use super::etcd::EtcdSettings;
    #[cfg(feature = "json")]
    pub(crate) use super::export::import_etcd;
}
#[cfg(feature = "json")]
pub(crate) use super::export::import;
pub(crate) use super::inspect::ReadOnly;
pub(crate) use super::open::{open, restore};
pub(crate) use super::registry::{
    Claimed, KeyLock, KeyspaceState, LiveSubscription, OrderedGroupState, PendingRecord, QueueState,
    QueuedAck, Refused, SettlingGuard, TakenFrom, Watching, WorkGroupState,
};
pub(crate) use super::request::{
    FlowStepSpec, HeldLease, KvRequest, KvWrite, LifecycleRequest, OrderedRequest, Outcome, QueueRequest,
    RedriveItem, Request, RetentionRequest, ScheduleRequest, SettingsMode, Submission, TxApplied, TxDelivery,
    TxJob, TxRequest, TxSend, WorkRequest, WorkSettingsRequest,
};
pub(crate) use super::shared::Shared;
pub(crate) use crate::store::envelope::{EncodeError, body_len, validate};

/// A checked message's envelope (the writer stamps its time).
pub(crate) fn encode(m: &crate::message::Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(crate::store::envelope::encoded_len(m));
    crate::store::envelope::encode_into(m, 0, &mut out);
    out
}
pub(crate) use crate::store::{RawEntry, RawMessage, ReadOutcome, prefix_end};

/// The sequence in a message key, if `key` is one (to name the message behind a corruption
/// error).
pub(crate) fn message_seq(key: &[u8]) -> Option<u64> {
    crate::store::keys::decode_message_key(key).ok().map(|(_, seq)| seq)
}
