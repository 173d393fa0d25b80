//! The producer side: [`Queue`] handles whose sends go through the writer.

mod queue;
mod receipt;
mod txn;
mod typed;

pub use queue::Queue;
pub use receipt::SendReceipt;
pub use typed::TypedQueue;
