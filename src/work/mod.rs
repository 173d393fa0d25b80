//! Work-queue consumer groups: competing consumers with leases, retries with backoff,
//! dead-letter queues and worker pools, layered on claim records that the writer thread checks
//! and writes atomically. The claim state machine itself is the engine's
//! (`engine/registry/work.rs`); these are the handles over it.

mod adapt;
mod config;
mod dlq;
mod feed;
mod group;
mod handle;
mod handler;
mod job;
mod keyed;
mod pool;
mod subscription;
mod txn;

pub use dlq::{DeadLetter, DeadLetters, Redrive};
pub use group::WorkGroup;
pub use handle::PoolHandle;
pub use handler::{Handler, HandlerError, HandlerResultExt, IntoHandler, IntoTypedHandler};
pub use job::{Job, Task};
pub use pool::{PoolReport, Workers};
pub use subscription::WorkSubscription;
