//! The engine boundary: everything the public handles (`broker/`, `producer/`, `consumer/`,
//! `work/`, `inspector.rs`) may ask of the engine, in one list. Handles import engine items from
//! here and nowhere else, never name `store/`, and never reach into the engine past [`Shared`]'s
//! methods (its `engine` field is private to `engine/`). `tests/layers.rs` checks the first
//! two; the compiler enforces the third.
//!
//! This is the seam along which a second, distributed engine will be added (see
//! `docs/ARCHITECTURE.md`, "The engine boundary"): whatever it must provide is what this module
//! and [`Shared`]'s methods list. Four parts:
//!
//! 1. **Opening and the handle anchor**: [`open`] starts an engine (with its background tasks:
//!    the writer, retention, metrics gauges) and returns the [`Shared`] every handle holds;
//!    [`Shared::close`] stops it. [`ReadOnly`] opens a database for inspection only.
//! 2. **The request set**: [`Request`] and its per-concept enums, sent to the writer over
//!    `Shared::tx`, each answered on its reply channel; sends are staged with
//!    [`Shared::stage`] and resolve through a [`Completion`]. Messages are checked with
//!    [`validate`] and [`body_len`] on the caller's task first.
//! 3. **Reads**, all blocking (run them on the blocking pool): [`Shared::read_range`],
//!    [`Shared::read_seqs`], [`Shared::read_cursor`]; the inspection reads [`live_stats`],
//!    [`live_pending`], [`live_peek`] and [`ReadOnly`]'s; [`retention_pass`] and
//!    [`reset_target`] read and then request. Lookups: [`Shared::queue`],
//!    [`Shared::ordered_group`], [`Shared::work_group`].
//! 4. **Wake-ups**: a queue's `watch` of its last published sequence ([`QueueState::watch`]:
//!    new messages, pauses, shutdown; counted, so that queues nobody waits on skip the send), a work group's `Notify` ([`WorkGroupState::changed`]:
//!    releases, new retry times), [`Shared::mark_dirty`] / [`Shared::mark_work_dirty`] plus
//!    `Shared::nudge_writer` (acks for the writer's next round), the event broadcast
//!    ([`Shared::events`]), and `Shared::closing` (shutdown began).
//!
//! The in-memory state the handles share with the engine ([`QueueState`],
//! [`OrderedGroupState`], [`WorkGroupState`] and the claim state machine's values) is part of
//! the boundary too: a second engine keeps the same state machine and feeds it from its own
//! store.

#[cfg(test)]
pub(crate) use super::completion::Resolver;
pub(crate) use super::completion::{Completion, staged_sent};
#[cfg(feature = "etcd")]
pub(crate) use super::etcd::{EtcdSettings, connect::connect as connect_etcd};
pub(crate) use super::inspect::{
    ReadOnly, live_peek, live_pending, live_scheduled, live_schedules, live_stats,
};
pub(crate) use super::open::open;
pub(crate) use super::registry::{
    Claimed, KeyspaceState, LiveSubscription, OrderedGroupState, PendingRecord, QueueState, SettlingGuard,
    Watching, WorkGroupState,
};
pub(crate) use super::request::{
    KvRequest, KvWrite, LifecycleRequest, OrderedRequest, Outcome, QueueRequest, RedriveItem, Request,
    RetentionRequest, ScheduleRequest, SettingsMode, Submission, TxApplied, TxDelivery, TxJob, TxRequest,
    TxSend, WorkRequest, WorkSettingsRequest,
};
pub(crate) use super::retention::{pass as retention_pass, reset_target};
pub(crate) use super::shared::{OwnerHold, Shared};
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
