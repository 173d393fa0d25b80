//! Work-queue consumer groups: competing consumers with leases, retries with backoff and
//! dead-letter queues, layered on claim records that the writer thread checks and writes
//! atomically. The claim state machine itself is the engine's (`engine/registry/work.rs`);
//! these are the handles over it. Worker pools over a work group are `pool/`; dead-letter
//! queues, shared with ordered groups, are `dead_letter/`.

mod group;
mod job;
mod keyed;
mod limits;
pub(crate) mod operator;
mod subscription;
mod txn;

pub use group::WorkGroup;
pub(crate) use job::PoolOutcome;
pub use job::{Job, Task};
pub use subscription::WorkSubscription;
