//! Seeing and operating a database: stats, pending claims, peeking, pausing and resetting
//! groups — from a live [`Broker`](crate::Broker) or, read-only and without taking the lock,
//! from an [`Inspector`](crate::Inspector).

mod collect;
mod control;
mod inspector;
mod types;

pub(crate) use control::{is_paused, set_paused};
pub use inspector::Inspector;
pub use types::{GroupMode, GroupStats, PendingClaim, PendingState, QueueStats, Stats, StoredMessage};
