//! The producer side: [`Queue`] handles whose sends go through the writer.

mod queue;
mod receipt;

pub use queue::Queue;
pub use receipt::SendReceipt;
