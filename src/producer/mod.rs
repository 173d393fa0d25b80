//! The producer side: [`Queue`] handles whose sends go through the writer.

mod queue;

pub use queue::Queue;
