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
//!   A delivery can be redelivered later with [`Delivery::nack_after`], and a poison message
//!   moved to a dead-letter queue after [`Group::max_deliveries`].
//! - **Work-queue groups** ([`WorkGroup`]) give competing consumers [`Job`]s under leases, with
//!   fencing, retries with backoff ([`RetryPolicy`]), dead-letter queues ([`DeadLetters`]) and
//!   worker pools ([`Workers`]); attempt counts are written before a job is handed out, so they
//!   survive crashes. Lifecycle [`Event`]s are broadcast by [`Broker::events`].
//! - **Durability** is chosen at open; see [`Durability`] for exactly what survives a process
//!   crash and a power loss.
//!
//! - **Typed jobs**: [`Queue::typed`] sends values through a [`Codec`] (JSON by default,
//!   [`Postcard`] with the `postcard` feature); [`Workers::run_typed`] hands handlers the
//!   decoded value and shared [state](Workers::state); [`HandlerError`] takes any error with
//!   `?` and keeps its cause chain; with the `tower` feature any `tower::Service` is a handler.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rockq::Error> {
//! use futures::StreamExt;
//!
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path();
//! let broker = rockq::Broker::open(path).await?;
//! let orders = broker.queue("orders").await?;
//! orders.send("order #1").await?;
//!
//! let mut billing = orders.group("billing")?.subscribe().await?;
//! while let Some(delivery) = billing.next().await {
//!     let delivery = delivery?;
//!     assert_eq!(delivery.payload(), "order #1");
//!     delivery.ack_durable().await?; // or ack(): queued, returns at once
//!     break;
//! }
//! assert_eq!(billing.committed(), 1);
//! broker.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the layers, the key layout and what each task owns.

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

// Layers, top down; each imports only from the layers below it (`tests/arch_layers.rs` checks it):
// the handles (`broker`, `queue`, `ordered`, `work`, `pool`, `dead_letter`, `kv`, `txn`, `inspector`, and `web`, the console,
// which goes through the public API only), the engine (`engine`,
// reached only through `engine::boundary`), the store (`store`, the only user of RocksDB), and
// plain value types (the rest).
mod broker;
mod dead_letter;
mod flow;
mod group_admin;
mod inspector;
mod kv;
mod ordered;
mod pool;
mod queue;
mod txn;
#[cfg(feature = "web")]
pub mod web;
mod work;

mod engine;

mod store;

mod backup;
mod clock;
mod codec;
mod entry;
mod error;
mod events;
#[cfg(feature = "json")]
pub mod export;
mod faults;
mod flow_state;
mod json;
mod message;
mod model;
mod name;
mod options;
#[cfg(feature = "otel")]
pub mod otel;
mod rate_limit;
mod retention;
mod retry;
mod schedule;
mod sent;
mod stats;
pub mod telemetry;

pub use backup::BackupReport;
pub use broker::Broker;
pub use broker::events::EventStream;
engine::boundary::cfg_etcd! {
    pub use broker::etcd::EtcdOptions;
}
pub use bytes::Bytes;
pub use clock::{Clock, ManualClock};
#[cfg(feature = "json")]
pub use codec::Json;
#[cfg(feature = "postcard")]
pub use codec::Postcard;
pub use codec::{BoxError, CODEC_HEADER, Codec, DecodeError};
pub use dead_letter::{DeadLetter, DeadLetters, Redrive};
pub use entry::{Entry, Expect, MAX_KV_KEY_LEN, MAX_TX_BYTES, MAX_TX_OPS};
pub use error::{
    CorruptionError, Error, ErrorKind, FailedError, NameError, NameKind, Result, StorageError,
    UnsupportedError,
};
pub use events::Event;
#[cfg(feature = "json")]
pub use export::{TransferProgress, TransferReport};
pub use flow::Flow;
pub use flow_state::{
    FLOW_HEADER, FlowState, FlowStatus, FlowStep, MAX_ETCD_STEP_RESULT_BYTES, MAX_FLOW_STEPS, RunWhen, Step,
    StepState, StepStatus, StepTally, Submitted,
};
pub use inspector::Inspector;
pub use kv::{Keyspace, Scan};
pub use message::{MAX_KEY_LEN, Message};
pub use model::StartFrom;
pub use name::MAX_NAME_LEN;
pub use options::{Durability, Options};
pub use ordered::{Decoded, Delivery, Group, Subscription};
pub use pool::{
    Handler, HandlerError, HandlerResultExt, IntoHandler, IntoTypedHandler, PoolHandle, PoolReport, Workers,
};
pub use queue::{Queue, SendReceipt, TypedQueue, TypedSend};
pub use rate_limit::RateLimit;
pub use retention::{ResetTo, Retention, TrimReport};
pub use retry::RetryPolicy;
#[allow(deprecated)]
pub use schedule::ScheduledInfo;
pub use schedule::{DelayedInfo, Missed, Recurrence, ScheduleInfo};
pub use sent::{Original, ScheduledMessage, Sent};
pub use stats::{
    GroupMode, GroupStats, JobOutcome, JobState, JobStatus, KeyspaceStats, MAX_PROGRESS_BYTES,
    MAX_RESULT_BYTES, OutcomeKind, PendingClaim, PendingState, QueueStats, Stats, StorageStats,
    StoredMessage, WriterStats,
};
pub use tokio_util::sync::CancellationToken;
pub use txn::task::TaskTx;
pub use txn::{Committed, Transaction};
pub use work::{Job, Task, WorkGroup, WorkSubscription};

/// Entry points for the cargo-fuzz targets in `fuzz/` (compiled only under `cargo fuzz`).
#[cfg(fuzzing)]
#[doc(hidden)]
pub use store::fuzzing;

/// The README's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The work-queue guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide-work-queues.md")]
pub struct GuideWorkQueuesDoctests;

/// The ordered-groups guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide-ordered-groups.md")]
pub struct GuideOrderedGroupsDoctests;

/// The jobs guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide-jobs.md")]
pub struct GuideJobsDoctests;

/// The transactions guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide-transactions.md")]
pub struct GuideTransactionsDoctests;

/// The web console guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/console.md")]
pub struct ConsoleDoctests;

/// The etcd guide's code blocks compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/etcd.md")]
pub struct EtcdDoctests;
