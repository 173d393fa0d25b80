//! One queue's in-memory state: its id, first live sequence, published last sequence (the
//! `watch` channel its subscribers wait on) and retention policy.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::watch;

use crate::retention::Retention;

/// One queue.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub id: u32,
    pub name: Arc<str>,
    /// First live sequence (retention moves it forward).
    pub first_seq: AtomicU64,
    /// Last sequence written and visible to readers. The writer publishes after each round
    /// that touched the queue; subscribers wait on it instead of polling.
    pub last: watch::Sender<u64>,
    /// Retention policy (persisted in the queue record; the writer changes it).
    pub retention: std::sync::Mutex<Retention>,
}

impl QueueState {
    pub fn new(id: u32, name: &str, first_seq: u64, last_seq: u64, retention: Retention) -> Arc<Self> {
        Arc::new(QueueState {
            id,
            name: Arc::from(name),
            first_seq: AtomicU64::new(first_seq),
            last: watch::Sender::new(last_seq),
            retention: std::sync::Mutex::new(retention),
        })
    }

    pub fn retention(&self) -> Retention {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn last_seq(&self) -> u64 {
        *self.last.borrow()
    }
}
