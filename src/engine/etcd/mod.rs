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

mod owner;
mod stats;
mod watch;
mod writer;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::inbox::Inbox;
use super::registry::{OrderedGroupState, QueueState, Registry};
use super::shared::Shared;
use super::timer::Timer;
use super::{Counters, Engine};
use crate::error::{OpenError, ReceiveError, UnsupportedError};
use crate::model::GroupMode;
use crate::options::{Durability, Options};
use crate::store::etcd::{ConnectFailure, EtcdStore};
use crate::store::{RawMessage, ReadOutcome, Store};

pub(crate) use owner::{OwnerRelease, acquire as owner_acquire};
pub(crate) use stats::stats;

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
}

/// Connects to the namespace and starts the engine on the current runtime.
pub(crate) async fn connect(
    endpoints: &[String],
    namespace: &str,
    options: Options,
    settings: EtcdSettings,
) -> Result<Arc<Shared>, OpenError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| OpenError::NoRuntime)?;
    if options.durability != Durability::Fsync {
        return Err(OpenError::Unsupported(unsupported(
            "Durability::Buffered (every etcd write is a quorum write)",
        )));
    }
    crate::name::validate(crate::error::NameKind::Queue, namespace)
        .map_err(|e| OpenError::InvalidOption(format!("etcd namespace: {e}")))?;
    if endpoints.is_empty() {
        return Err(OpenError::InvalidOption("no etcd endpoint given".into()));
    }
    let store =
        EtcdStore::connect(endpoints, namespace, settings.request_timeout).await.map_err(|e| match e {
            ConnectFailure::Storage(s) => OpenError::Storage(s),
            ConnectFailure::Foreign(reason) => {
                OpenError::NotRockq { path: format!("etcd namespace {namespace:?}").into(), reason }
            }
        })?;
    let loaded = retrying(settings.request_timeout, || store.load()).await?;
    let registry = Registry::default();
    for (name, meta, last) in &loaded.queues {
        let q = QueueState::new(meta.id, name, meta.first_seq, *last, meta.retention);
        q.set_dedup_window(meta.dedup_window);
        registry.queues.insert(q.name.clone(), q);
    }
    for (group, queue, offset) in &loaded.groups {
        let Some(q) = registry.queue(queue) else { continue };
        let id = crate::store::group_id(group, queue);
        match offset.mode {
            GroupMode::Ordered => {
                registry.ordered.insert(id, OrderedGroupState::new(group, q, offset.committed));
            }
            // Work-queue groups are not carried out yet: not registered, refused on subscribe.
            GroupMode::WorkQueue => {}
        }
    }
    let owner_id = format!("{}-{}-{:016x}", hostname(), std::process::id(), fastrand::u64(..)).into_bytes();
    let side =
        Arc::new(EtcdSide { store: store.clone(), settings, owner_id, owners: owner::Owners::default() });
    let label = std::path::PathBuf::from(&store.label);
    let engine = Arc::new(Engine {
        store: Store::detached(label),
        inbox: Inbox::new(options.channel_capacity, options.max_batch_messages, options.max_batch_bytes),
        registry,
        options: options.clone(),
        dirty: Mutex::new(Vec::new()),
        dirty_work: Mutex::new(Vec::new()),
        failed: Mutex::new(None),
        counters: Counters::default(),
        events: tokio::sync::broadcast::channel(4096).0,
        timer: Arc::new(Timer::new(None, 0)),
        etcd: Some(side.clone()),
    });
    tracing::info!(store = %store.label, queues = engine.registry.queues.len(), "rockq: connected to etcd");
    let (tx, rx) = mpsc::channel(options.channel_capacity);
    let shared = Arc::new(Shared {
        engine: engine.clone(),
        tx,
        closed: AtomicBool::new(false),
        runtime: runtime.clone(),
        writer: Mutex::new(None),
        closing: tokio_util::sync::CancellationToken::new(),
        stopped: tokio_util::sync::CancellationToken::new(),
        pools: tokio_util::task::TaskTracker::new(),
        shutdown: Mutex::new(None),
    });
    let stop = shared.stopped.clone();
    runtime.spawn(watch::run(Arc::downgrade(&engine), side.clone(), loaded.revision, stop));
    runtime.spawn(writer::run(engine, side, rx));
    Ok(shared)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into())
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
                return gap_or(out, &queue.name, expected, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                // The good prefix first; the next read starts at the bad record and reports it.
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.is_empty() {
            return gap_or(out, &queue.name, from, None);
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
                return gap_or(out, &queue.name, want, Some(seq));
            }
            match crate::store::etcd::decode_envelope(queue.id, seq, &v) {
                Ok(env) => out.push(RawMessage::new(seq, env)),
                Err(_) if !out.is_empty() => return Ok(ReadOutcome::Messages(out)),
                Err(e) => return Err(e.into()),
            }
        }
        if out.len() < seqs.len() {
            let missing = seqs[out.len()];
            return gap_or(out, &queue.name, missing, None);
        }
        Ok(ReadOutcome::Messages(out))
    }
}

/// The good prefix if there is one (the next read reports the gap), else the gap.
fn gap_or(
    out: Vec<RawMessage>,
    queue: &str,
    expected: u64,
    found: Option<u64>,
) -> Result<ReadOutcome, ReceiveError> {
    if out.is_empty() {
        return Err(ReceiveError::Gap { queue: queue.to_owned(), expected, found });
    }
    Ok(ReadOutcome::Messages(out))
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
