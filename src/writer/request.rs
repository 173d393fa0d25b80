//! What producers, groups and the broker ask of the writer.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::consumer::StartFrom;
use crate::error::{CommitError, QueueError, SendError, StorageError, SubscribeError};
use crate::registry::{GroupState, QueueState};

/// Encoded envelopes of one send call. `One` avoids a `Vec` per single send.
pub(crate) enum Payloads {
    One(Vec<u8>),
    Many(Vec<Vec<u8>>),
}

impl Payloads {
    pub fn len(&self) -> usize {
        match self {
            Payloads::One(_) => 1,
            Payloads::Many(v) => v.len(),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Payloads::One(v) => v.len(),
            Payloads::Many(v) => v.iter().map(Vec::len).sum(),
        }
    }
}

pub(crate) enum Request {
    /// Append messages; reply with the first sequence (the rest follow contiguously).
    Send {
        queue: Arc<QueueState>,
        payloads: Payloads,
        reply: oneshot::Sender<Result<u64, SendError>>,
    },
    CreateQueue {
        name: String,
        reply: oneshot::Sender<Result<Arc<QueueState>, QueueError>>,
    },
    CreateGroup {
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: oneshot::Sender<Result<Arc<GroupState>, SubscribeError>>,
    },
    /// Wake-up only: a group became dirty while the writer was idle.
    Commit,
    /// Reply once every acknowledgement recorded before this request is durable.
    Flush {
        reply: oneshot::Sender<Result<(), CommitError>>,
    },
    /// Finish everything queued before this, sync the WAL, and stop.
    Shutdown {
        reply: oneshot::Sender<Result<(), StorageError>>,
    },
}

impl Request {
    /// Messages and bytes this request adds to a WriteBatch, for the round's caps.
    pub fn weight(&self) -> (usize, usize) {
        match self {
            Request::Send { payloads, .. } => (payloads.len(), payloads.bytes()),
            _ => (0, 0),
        }
    }
}
