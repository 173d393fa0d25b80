//! Worker pools: `async fn` handlers run over a work group's jobs with a bounded concurrency,
//! adaptive prefetch (`adapt.rs`, `feed.rs`), shared state, and graceful shutdown
//! (`handle.rs`); what a pool runs is a [`Handler`] (`handler/`).

mod adapt;
mod feed;
mod handle;
mod handler;
mod workers;

pub use handle::PoolHandle;
pub use handler::typed::IntoTypedHandler;
pub use handler::{Handler, HandlerError, HandlerResultExt, IntoHandler};
pub use workers::{PoolReport, Workers};
