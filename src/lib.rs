//! # rockq
//!
//! Embedded, Tokio-native durable queues and consumer groups on RocksDB: the queue you reach for
//! instead of standing up Redis Streams, SQS or Kafka for work inside one service.
//!
//! - **Producers** append to named [`Queue`]s. Every send goes through one writer thread that
//!   group-commits: many sends, one `WriteBatch`, one WAL sync. Sequences are dense and
//!   monotonic per queue.
//! - **Consumer groups** ([`Group`]) receive a [`Subscription`], a
//!   `futures::Stream<Item = Result<Delivery, Error>>` in sequence order that wakes on new
//!   writes without polling.
//! - **At-least-once**: a group's offset is committed only over a contiguous run of
//!   acknowledged deliveries, so a crash or a dropped delivery causes redelivery, never loss.
//! - **Durability** is chosen at open; see [`Durability`] for exactly what survives a process
//!   crash and a power loss.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rockq::Error> {
//! use futures::StreamExt;
//!
//! let broker = rockq::Broker::open("./data").await?;
//! let orders = broker.queue("orders").await?;
//! orders.send("order #1").await?;
//!
//! let mut billing = orders.group("billing")?.subscribe().await?;
//! while let Some(delivery) = billing.next().await {
//!     let delivery = delivery?;
//!     println!("{} {:?}", delivery.seq(), delivery.payload());
//!     delivery.ack()?;
//!     # break;
//! }
//! broker.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the layers, the key layout and what each task owns.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod broker;
mod consumer;
mod engine;
mod error;
mod message;
mod name;
mod options;
mod producer;
mod registry;
mod store;
mod writer;

pub use broker::{Broker, StorageStats, WriterStats};
pub use bytes::Bytes;
pub use consumer::{Delivery, Group, StartFrom, Subscription};
pub use error::{
    AckError, CommitError, CorruptionError, Error, NameError, NameKind, OpenError, QueueError, ReceiveError,
    SendError, ShutdownError, StorageError, SubscribeError,
};
pub use message::Message;
pub use name::MAX_NAME_LEN;
pub use options::{Durability, Options};
pub use producer::Queue;

/// The README's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
