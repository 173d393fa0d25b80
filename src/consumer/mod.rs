//! The consumer side: ordered groups, their subscriptions (as `Stream`s) and deliveries.

mod acks;
mod delivery;
mod group;
mod records;
mod subscription;

pub(crate) use acks::{PendingRecord, SubShared};
pub use delivery::Delivery;
pub use group::{Group, StartFrom};
pub(crate) use records::GroupRecords;
pub use subscription::Subscription;
