//! Ordered consumer groups: one active subscriber at a time, deliveries in sequence order as a
//! `Stream`, and each subscription's acknowledgement window (`acks.rs`).

mod acks;
mod decoded;
mod delivery;
mod group;
mod subscription;
mod txn;

pub use decoded::Decoded;
pub use delivery::Delivery;
pub use group::Group;
pub use subscription::Subscription;
