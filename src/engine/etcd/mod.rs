//! The etcd engine (feature `etcd`): the same [`Shared`] and registry as the embedded engine,
//! over an etcd namespace that several processes share (design: `docs/DISTRIBUTED.md`).
//!
//! What differs from the embedded engine, and where:
//! - `writer.rs`: an async task on the runtime (not a thread) applies the same request set;
//!   each round's appends are compare-and-set transactions on the queues' tail keys, so
//!   processes appending to one queue get dense, unique sequences. What it does not carry out
//!   yet it refuses with the family's `Unsupported` error.
//! - `watch.rs`: tails moved by other processes are published to the same `QueueState`s, so
//!   subscriptions wake without polling.
//! - `owner.rs`: an ordered group's single active subscriber across processes, held by an etcd
//!   lease; every offset commit compares it.
//! - reads (`Shared::read_range`, `read_seqs`) become ranged `Get`s, run on the blocking pool
//!   like the RocksDB reads.

pub(crate) mod connect;
pub(crate) mod inspect;
pub(crate) mod owner;
mod redrive;
pub(crate) mod retention;
pub(crate) mod stats;
mod watch;
mod work;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use super::registry::QueueState;
use crate::error::{ReceiveError, UnsupportedError};
use crate::store::etcd::EtcdStore;
use crate::store::{RawMessage, ReadOutcome};

/// The engine name in `Unsupported` errors.
pub(crate) const ENGINE: &str = "etcd";

/// An `Unsupported` refusal of `operation` by this engine.
pub(crate) fn unsupported(operation: &'static str) -> UnsupportedError {
    UnsupportedError::new(operation, ENGINE)
}

/// How a broker talks to etcd (see [`EtcdOptions`](crate::EtcdOptions)).
#[derive(Debug, Clone)]
pub(crate) struct EtcdSettings {
    /// Each etcd request: after this, a write with an unknown outcome is given up.
    pub request_timeout: Duration,
    /// The lease holding an ordered group's active subscriber.
    pub owner_ttl: Duration,
}

/// The etcd side of an engine: the store and the ownership this process holds.
pub(crate) struct EtcdSide {
    pub store: EtcdStore,
    pub settings: EtcdSettings,
    /// This process's owner id (written into owner keys).
    pub owner_id: Vec<u8>,
    pub owners: owner::Owners,
    /// The work groups this process has loaded, by group id.
    pub work: dashmap::DashMap<Vec<u8>, Arc<work::WorkSide>>,
    /// The revisions retention passes started at: how far a compaction may go.
    pub revisions: retention::Revisions,
}

impl EtcdSide {
    /// Messages `from..=to` of `queue`, at most `max_bytes` of values (at least one). Blocking:
    /// runs the request on `runtime` from a blocking-pool thread.
    pub fn read_range(
        &self,
        runtime: &tokio::runtime::Handle,
        queue: &QueueState,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, ReceiveError> {
        let t = self.settings.request_timeout;
        let got = runtime.block_on(retrying(t, || self.store.read_range(queue.id, from, to, max_bytes)))?;
        let mut out = Vec::with_capacity(got.len());
        for (expected, (seq, v)) in (from..).zip(got) {
            if seq != expected {
                return self.gap_or(runtime, out, queue, expected, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                // The good prefix first; the next read starts at the bad record and reports it.
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.is_empty() {
            return self.gap_or(runtime, out, queue, from, None);
        }
        Ok(ReadOutcome::Messages(out))
    }

    /// The messages at `seqs` (ascending) of `queue`. Blocking, as [`read_range`](Self::read_range).
    pub fn read_seqs(
        &self,
        runtime: &tokio::runtime::Handle,
        queue: &QueueState,
        seqs: &[u64],
    ) -> Result<ReadOutcome, ReceiveError> {
        let t = self.settings.request_timeout;
        let got = runtime.block_on(retrying(t, || self.store.read_seqs(queue.id, seqs)))?;
        let mut out = Vec::with_capacity(got.len());
        for (&want, (seq, v)) in seqs.iter().zip(got) {
            if seq != want {
                return self.gap_or(runtime, out, queue, want, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.len() < seqs.len() {
            let missing = seqs[out.len()];
            return self.gap_or(runtime, out, queue, missing, None);
        }
        Ok(ReadOutcome::Messages(out))
    }
}

impl EtcdSide {
    /// The redrive cursor of `dlq` (`None`: never redriven). Blocking, as
    /// [`read_range`](Self::read_range).
    pub fn read_cursor(
        &self,
        runtime: &tokio::runtime::Handle,
        dlq: &str,
    ) -> Result<Option<u64>, crate::error::RedriveError> {
        let t = self.settings.request_timeout;
        let (cursor, rev) = runtime.block_on(retrying(t, || self.store.cursor(dlq)))?;
        Ok((rev != 0).then_some(cursor))
    }
}

impl EtcdSide {
    /// The good prefix if there is one (the next read reports the gap), else the gap. A gap
    /// is most often a trim, maybe another process's that the watch has not brought yet: the
    /// first sequence is read from the queue record first (a trim writes both in one
    /// transaction), so the reader sees the gap as trimmed and skips it.
    fn gap_or(
        &self,
        runtime: &tokio::runtime::Handle,
        out: Vec<RawMessage>,
        queue: &QueueState,
        expected: u64,
        found: Option<u64>,
    ) -> Result<ReadOutcome, ReceiveError> {
        if !out.is_empty() {
            return Ok(ReadOutcome::Messages(out));
        }
        let t = self.settings.request_timeout;
        if let Ok(Some((meta, _))) = runtime.block_on(retrying(t, || self.store.queue_record(&queue.name)))
            && meta.id == queue.id
        {
            queue.first_seq.fetch_max(meta.first_seq, std::sync::atomic::Ordering::AcqRel);
        }
        Err(ReceiveError::Gap { queue: queue.name.to_string(), expected, found })
    }
}

/// A send call must fit one append transaction (it is never split: its sequences are
/// contiguous), and idempotency keys are not carried out on etcd yet.
pub(crate) fn check_send(msgs: &[crate::message::Message]) -> Result<(), crate::error::SendError> {
    use crate::store::etcd::{MAX_TXN_BYTES, MAX_TXN_OPS};
    if msgs.iter().any(|m| m.idempotency_key.is_some()) {
        return Err(crate::error::SendError::Unsupported(unsupported("idempotency keys")));
    }
    let bytes: usize = msgs.iter().map(crate::store::envelope::encoded_len).sum();
    if msgs.len() > MAX_TXN_OPS - 1 || bytes > MAX_TXN_BYTES {
        return Err(crate::error::SendError::Unsupported(unsupported(
            "a send call larger than one etcd transaction (127 messages, 1 MiB)",
        )));
    }
    Ok(())
}

/// Runs an idempotent etcd operation, trying again after a failure (a member went away, an
/// election under way) until `timeout` has passed; then the last error.
pub(crate) async fn retrying<T, Fut>(
    timeout: Duration,
    mut op: impl FnMut() -> Fut,
) -> Result<T, crate::error::StorageError>
where
    Fut: std::future::Future<Output = Result<T, crate::error::StorageError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(20);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() + backoff >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "rockq: etcd request failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Registers queue `name` unless it is (the writer creating it, or the watch seeing another
/// process's): whoever comes second gets the state already there, so every handle of one
/// queue shares one state.
pub(crate) fn register_queue(
    engine: &Engine,
    name: &str,
    meta: &crate::model::QueueMeta,
    last: u64,
) -> Arc<QueueState> {
    let entry = engine.registry.queues.entry(Arc::from(name)).or_insert_with(|| {
        let q = QueueState::new(meta.id, name, meta.first_seq, last, meta.retention);
        q.set_dedup_window(meta.dedup_window);
        q
    });
    let q = entry.value().clone();
    drop(entry);
    q.publish_max(last);
    q
}
