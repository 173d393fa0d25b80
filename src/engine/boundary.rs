//! The engine boundary: everything the public handles (`broker.rs`, `producer/`, `consumer/`,
//! `work/`, `admin/`) may ask of the engine, in one list. Handles import engine items from here
//! and nowhere else, and never touch `store/` directly (`tests/layers.rs` checks both).
//!
//! This is the seam along which a second, distributed engine will be added (see
//! `docs/ARCHITECTURE.md`, "The engine boundary"): whatever it must provide is what this module
//! lists. It has four parts.
//!
//! 1. **Opening and the handle anchor**: [`open`] starts an engine (with its background tasks:
//!    the writer, retention, metrics gauges) and returns the [`Shared`] every handle holds.
//! 2. **The request set**: [`Request`] and its per-concept enums, sent to the writer over
//!    `Shared::tx`, each answered on its reply channel; sends are staged in the engine's inbox
//!    instead (`Shared::engine.inbox`) and resolve through a [`Completion`].
//! 3. **Read operations**, all blocking (run them on the blocking pool): [`read_range`] and
//!    [`read_seqs`] for consumers, [`read_cursor`] for redrive, the inspection reads
//!    ([`stats`], [`pending`], [`peek`], [`dead_letters`]) over a [`Store`], and
//!    [`open_read_only`] for an inspector; [`retention_pass`] and [`reset_target`] read and
//!    then request.
//! 4. **Wake-ups**: a queue's `watch` of its last published sequence
//!    ([`QueueState::last`]: new messages, pauses, shutdown), a work group's `Notify`
//!    ([`WorkGroupState::changed`]: releases, new retry times), a subscription's waker (set by
//!    acks in the consumer's own window), the engine's event broadcast (`Engine::events`), and
//!    `Shared::closing` (shutdown began).
//!
//! The in-memory state the handles share with the engine ([`QueueState`],
//! [`OrderedGroupState`], [`WorkGroupState`] and the claim state machine's values) is part of
//! the boundary too: a second engine keeps the same state machine and feeds it from its own
//! store.

pub(crate) use super::completion::Completion;
#[cfg(test)]
pub(crate) use super::completion::Resolver;
pub(crate) use super::inspect::{
    LiveLeases, dead_letters, live_peek, live_pending, live_stats, peek, pending, stats,
};
pub(crate) use super::open::open;
pub(crate) use super::registry::{
    Claimed, LiveSubscription, OrderedGroupState, PendingRecord, QueueState, SettlingGuard, WorkGroupState,
};
pub(crate) use super::request::{
    OrderedRequest, Outcome, QueueRequest, RedriveItem, Request, RetentionRequest, SettingsChange,
    SettingsRequest, WorkRequest,
};
pub(crate) use super::retention::{pass as retention_pass, reset_target};
pub(crate) use super::shared::Shared;
pub(crate) use crate::store::envelope::{EncodeError, body_len, encode as encode_envelope, validate};
pub(crate) use crate::store::{
    RawMessage, ReadOutcome, Store, open_read_only, read_cursor, read_range, read_seqs,
};

/// The sequence in a message key, if `key` is one (to name the message behind a corruption
/// error).
pub(crate) fn message_seq(key: &[u8]) -> Option<u64> {
    crate::store::keys::decode_message_key(key).ok().map(|(_, seq)| seq)
}
