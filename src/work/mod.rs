//! Work-queue (shared) consumer groups: competing consumers with leases, retries with
//! backoff, dead-letter queues and worker pools, layered on claim records that the writer
//! thread checks and writes atomically.

mod config;
mod dlq;
mod group;
mod handle;
mod job;
mod policy;
mod pool;
mod state;
mod subscription;

pub(crate) use dlq::dlq_headers;
pub use dlq::{DeadLetter, DeadLetters, Redrive};
pub use group::WorkGroup;
pub use handle::PoolHandle;
pub use job::{Job, Task};
pub use policy::RetryPolicy;
pub use pool::{Handler, HandlerError, PoolReport, Workers};
pub(crate) use state::{QueuedAck, WorkGroupState};
pub use subscription::WorkSubscription;
