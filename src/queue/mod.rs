//! Queues: [`Queue`] handles whose sends go through the writer, the receipts they resolve
//! through, typed sends, and a transaction's sends (`txn.rs`).

mod handle;
mod receipt;
mod txn;
mod typed;

pub use handle::Queue;
pub(crate) use handle::check_flow_message;
pub use receipt::SendReceipt;
pub use typed::{TypedQueue, TypedSend};
