//! **The seam between the two engines.** A broker runs on the embedded engine (RocksDB in this
//! process) or on the etcd engine (an etcd namespace shared by many processes, feature
//! `etcd`). Both keep the same in-memory state (the [`Engine`]: registry, claim state
//! machine, inbox) and take the same request set; what differs is where records live and who
//! writes them. Everything that differs is a method here, with one `match` over [`Backend`]:
//! reads, inspection, the retention pass, ordered ownership across processes, lease
//! persistence, closing. What each engine carries out at all is the table in `capability.rs`.
//!
//! An enum, not a trait (as tokio's scheduler `Handle` holds its flavours): two closed
//! variants, no dynamic dispatch on the read path. The etcd arm of each match is written inside
//! [`on_etcd!`]: compiled with the `etcd` feature; without it the variant holds a type with no
//! values ([`absent`]), so the arm is statically unreachable and its code is not compiled.
//! Nothing else in `engine/` branches on the engine: this file, `etcd/` and `store/etcd/` are
//! the only places that name the `etcd` feature.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::Engine;
use super::capability::{self, Capability, Flavour};
#[cfg(feature = "etcd")]
use super::etcd::{self, EtcdSide, owner::OwnerRelease};
use super::registry::{OrderedGroupState, QueueState};
use super::request::{Extension, Request};
use super::{inspect, retention};
use crate::backup::BackupReport;
use crate::error::{Error, StorageError};
use crate::message::Message;
use crate::model::Claim;
use crate::retention::{ResetTo, TrimReport};
use crate::schedule::{DelayedInfo, ScheduleInfo};
use crate::stats::{JobOutcome, PendingClaim, Stats, StorageStats, StoredMessage};
use crate::store::{self, RawEntry, ReadOutcome, Store};

/// Marks items compiled only with the etcd engine (feature `etcd`), as tokio's `cfg_rt!`
/// marks its runtime's: the one place outside `etcd/` folders that names the feature.
macro_rules! cfg_etcd {
    ($($item:item)*) => {
        $(
            #[cfg(feature = "etcd")]
            $item
        )*
    };
}
pub(crate) use cfg_etcd;

/// The etcd arm of a match over [`Backend`]: `on_etcd!(side => expr)` is `expr` with the `etcd`
/// feature; without it, `side` (an `Arc` of an [`absent`] type) has no value to match, so the
/// arm diverges and `expr` is never compiled.
#[cfg(feature = "etcd")]
macro_rules! on_etcd {
    ($side:ident => $e:expr) => {{
        let _ = &$side;
        $e
    }};
}
#[cfg(not(feature = "etcd"))]
macro_rules! on_etcd {
    ($side:ident => $e:expr) => {
        match **$side {}
    };
}

/// Without the etcd engine, its side and an ordered group's ownership are types with no values:
/// `Backend::Etcd` and `OwnerHold`'s release cannot be built.
#[cfg(not(feature = "etcd"))]
mod absent {
    pub(crate) enum EtcdSide {}
    pub(crate) enum OwnerRelease {}
}
#[cfg(not(feature = "etcd"))]
use absent::{EtcdSide, OwnerRelease};

/// Where a broker's records live, and who else writes them.
#[derive(Clone)]
pub(crate) enum Backend {
    /// RocksDB in this process; the writer thread owns the writes, this handle reads.
    Embedded(Arc<Store>),
    /// An etcd namespace; the etcd writer task and other processes write.
    #[allow(dead_code)] // constructed only with the etcd engine (feature `etcd`)
    Etcd(Arc<EtcdSide>),
}

/// An ordered group's cross-process ownership, held by its subscription for its `Drop`, which
/// asks the writer to release the group (the etcd engine); nothing for the embedded engine,
/// whose in-process active slot is all there is.
#[derive(Default)]
pub(crate) struct OwnerHold(#[allow(dead_code)] Option<OwnerRelease>);

impl Backend {
    /// Which engine this is.
    pub fn flavour(&self) -> Flavour {
        match self {
            Backend::Embedded(_) => Flavour::Embedded,
            Backend::Etcd(_) => Flavour::Etcd,
        }
    }

    /// `Ok` if this engine carries out `cap` (the table in `capability.rs`), else the refusal.
    #[inline]
    pub fn check(&self, cap: Capability) -> Result<(), Error> {
        capability::check(self.flavour(), cap).map_err(Error::Unsupported)
    }

    /// Refuses a plain send call this engine cannot carry out as it stands. Nothing to check for
    /// the embedded engine (a constant); the etcd engine needs one transaction per call and does
    /// not keep idempotency keys yet.
    #[inline]
    #[allow(unused_variables)] // `msgs` is read only by the etcd engine (feature `etcd`)
    pub fn check_send(&self, msgs: &[Message]) -> Result<(), Error> {
        match self {
            Backend::Embedded(_) => Ok(()),
            Backend::Etcd(side) => on_etcd!(side => etcd::check_send(msgs)),
        }
    }

    /// Wakes whoever writes staged sends, if it is idle: `true` if that is the engine's own
    /// appender task (etcd), `false` if the caller must nudge the writer (embedded).
    pub fn wake_appender(&self) -> bool {
        match self {
            Backend::Embedded(_) => false,
            Backend::Etcd(side) => on_etcd!(side => {
                side.sends_wake.notify_one();
                true
            }),
        }
    }

    /// The database directory, or the etcd namespace's label.
    pub fn path(&self) -> &Path {
        match self {
            Backend::Embedded(store) => &store.path,
            Backend::Etcd(side) => on_etcd!(side => Path::new(&side.store.label)),
        }
    }

    /// RocksDB's own figures (the embedded engine only).
    pub fn storage_stats(&self) -> Option<StorageStats> {
        match self {
            Backend::Embedded(store) => store.stats(),
            Backend::Etcd(_) => None,
        }
    }

    /// Reads messages `from..=to` of `queue` (at most `max_bytes` of values). Blocking.
    pub fn read_range(
        &self,
        runtime: &Handle,
        closed: bool,
        queue: &QueueState,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, Error> {
        // (Used by the etcd arm only: without the feature, named here so that they count as used.)
        let _ = (runtime, closed);
        match self {
            Backend::Embedded(store) => store::read_range(store, &queue.name, queue.id, from, to, max_bytes),
            Backend::Etcd(_) if closed => Ok(ReadOutcome::Closed),
            Backend::Etcd(side) => on_etcd!(side => side.read_range(runtime, queue, from, to, max_bytes)),
        }
    }

    /// Reads the messages at `seqs` (ascending) of `queue`. Blocking.
    pub fn read_seqs(
        &self,
        runtime: &Handle,
        closed: bool,
        queue: &QueueState,
        seqs: &[u64],
    ) -> Result<ReadOutcome, Error> {
        let _ = (runtime, closed);
        match self {
            Backend::Embedded(store) => store::read_seqs(store, &queue.name, queue.id, seqs),
            Backend::Etcd(_) if closed => Ok(ReadOutcome::Closed),
            Backend::Etcd(side) => on_etcd!(side => side.read_seqs(runtime, queue, seqs)),
        }
    }

    /// How far dead-letter queue `dlq` has been redriven. Blocking.
    pub fn read_cursor(&self, runtime: &Handle, dlq: &str) -> Result<Option<u64>, Error> {
        let _ = runtime;
        match self {
            Backend::Embedded(store) => store::read_cursor(store, dlq),
            Backend::Etcd(side) => on_etcd!(side => side.read_cursor(runtime, dlq)),
        }
    }

    /// The dead letters of `dlq` settled on their own (marks the cursor has not passed yet,
    /// and on etcd perhaps some below it: callers count those above the cursor). Blocking.
    pub fn read_letter_marks(
        &self,
        runtime: &Handle,
        dlq: &str,
    ) -> Result<std::collections::BTreeSet<u64>, Error> {
        let _ = runtime;
        match self {
            Backend::Embedded(store) => store::read_letter_marks(store, dlq),
            Backend::Etcd(side) => on_etcd!(side => side.read_letter_marks(runtime, dlq)),
        }
    }

    /// `key` of keyspace `keyspace`: its revision and value. Blocking.
    pub fn kv_get(
        &self,
        runtime: &Handle,
        keyspace: u32,
        key: &[u8],
    ) -> Result<Option<(u64, Vec<u8>)>, Error> {
        let _ = runtime;
        match self {
            Backend::Embedded(store) => Ok(store::kv_get(store, keyspace, key)?),
            Backend::Etcd(side) => on_etcd!(side => side.kv_get(runtime, keyspace, key)),
        }
    }

    /// Up to `limit` entries of keyspace `keyspace` in `[from, to)`, in key order. Blocking.
    pub fn kv_scan(
        &self,
        runtime: &Handle,
        keyspace: u32,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<RawEntry>, Error> {
        let _ = runtime;
        match self {
            Backend::Embedded(store) => Ok(store::kv_scan(store, keyspace, from, to, limit)?),
            Backend::Etcd(side) => on_etcd!(side => side.kv_scan(runtime, keyspace, from, to, limit)),
        }
    }

    /// Every queue and group: the store's figures with this process's leases and in-flight
    /// deliveries laid over them.
    pub async fn stats(&self, engine: &Arc<Engine>, runtime: &Handle) -> Result<Stats, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_stats(engine, store, runtime).await,
            Backend::Etcd(side) => on_etcd!(side => {
                let stats = etcd::stats::stats(engine, side).await?;
                crate::telemetry::publish(&stats);
                Ok(stats)
            }),
        }
    }

    /// The pending claims of work group `group` on `queue`, with this process's deadlines.
    pub async fn pending(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        group: &str,
        queue: &str,
    ) -> Result<Vec<PendingClaim>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_pending(engine, store, runtime, group, queue).await,
            Backend::Etcd(side) => on_etcd!(side => {
                let live = super::figures::live_leases(engine, Some((group, queue)));
                etcd::inspect::pending(engine, side, group, queue, &live).await
            }),
        }
    }

    /// The claim record of `seq` in work group `group` on `queue`, if there is one.
    pub async fn claim(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        group: &str,
        queue: &str,
        seq: u64,
    ) -> Result<Option<Claim>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_claim(engine, store, runtime, group, queue, seq).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::claim(side, group, queue, seq).await),
        }
    }

    /// Whether `group` on `queue` is a work group as the store holds it: asked for a group this
    /// process has not registered. The embedded engine registers every group at open (and
    /// this process is the only writer), so none is found; on etcd another process may have
    /// created it since this one connected.
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    pub async fn stored_work_group(&self, group: &str, queue: &str) -> Result<bool, Error> {
        match self {
            Backend::Embedded(_) => Ok(false),
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::is_work_group(side, group, queue).await),
        }
    }

    /// The stored progress report of unfinished job `seq` (asked on etcd only: the embedded
    /// engine's memory has every report, restored at open and written by this process only).
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    pub async fn progress(&self, group: &str, queue: &str, seq: u64) -> Result<Option<bytes::Bytes>, Error> {
        match self {
            Backend::Embedded(_) => Ok(None),
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::progress(side, group, queue, seq).await),
        }
    }

    /// The kept outcome of job `seq` in work group `group` on `queue`, if there is one.
    pub async fn outcome(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        group: &str,
        queue: &str,
        seq: u64,
    ) -> Result<Option<JobOutcome>, Error> {
        match self {
            Backend::Embedded(store) => {
                inspect::live_outcome(engine, store, runtime, group, queue, seq).await
            }
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::outcome(side, group, queue, seq).await),
        }
    }

    /// Flow `id` as stored (`None`: no such flow).
    pub async fn flow_status(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        id: u64,
    ) -> Result<Option<crate::flow_state::FlowStatus>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_flow(engine, store, runtime, id).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::flow_status(side, id).await),
        }
    }

    /// Up to `limit` flow ids from `from`.
    pub async fn flow_ids(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        from: u64,
        limit: usize,
    ) -> Result<Vec<u64>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_flow_ids(engine, store, runtime, from, limit).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::flow_ids(side, from, limit).await),
        }
    }

    /// Up to `limit` stored messages of `queue` from `from`.
    pub async fn peek(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_peek(engine, store, runtime, queue, from, limit).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::peek(side, queue, from, limit).await),
        }
    }

    /// Up to `limit` delayed messages of `queue` (all queues: `None`).
    pub async fn scheduled(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
        queue: Option<String>,
        limit: usize,
    ) -> Result<Vec<DelayedInfo>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_scheduled(engine, store, runtime, queue, limit).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::delayed(side, queue, limit).await),
        }
    }

    /// Every recurring schedule.
    pub async fn schedules(
        &self,
        engine: &Arc<Engine>,
        runtime: &Handle,
    ) -> Result<Vec<ScheduleInfo>, Error> {
        match self {
            Backend::Embedded(store) => inspect::live_schedules(engine, store, runtime).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::inspect::schedules(side).await),
        }
    }

    /// One retention pass over every queue (the etcd engine: over the namespace, as every
    /// process left it).
    pub async fn retention_pass(
        &self,
        engine: &Arc<Engine>,
        tx: &mpsc::Sender<Request>,
        runtime: &Handle,
        compact: Option<bool>,
    ) -> Result<TrimReport, Error> {
        match self {
            Backend::Embedded(store) => retention::pass(engine, store, tx, runtime, compact).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::retention::pass(engine, side, compact).await),
        }
    }

    /// Writes a consistent copy of the store into `dir` (`Broker::backup`), on the blocking
    /// pool.
    pub async fn backup(&self, runtime: &Handle, dir: PathBuf) -> Result<BackupReport, Error> {
        match self {
            Backend::Embedded(store) => {
                let store = store.clone();
                runtime.spawn_blocking(move || store.backup(&dir)).await.map_err(|_| Error::Shutdown)?
            }
            Backend::Etcd(_) => Err(self.refusal(Capability::Backup)),
        }
    }

    /// Writes the store's records to `out` as an export (`Broker::export`), on the blocking
    /// pool.
    #[cfg(feature = "json")]
    pub async fn export(
        &self,
        runtime: &Handle,
        now_micros: u64,
        out: Box<dyn std::io::Write + Send>,
        progress: Option<crate::export::ProgressFn>,
    ) -> Result<crate::export::TransferReport, Error> {
        match self {
            Backend::Embedded(store) => {
                let store = store.clone();
                runtime
                    .spawn_blocking(move || super::export::export(&store, now_micros, out, progress))
                    .await
                    .map_err(|_| Error::Shutdown)?
            }
            Backend::Etcd(side) => {
                on_etcd!(side => super::export::export_etcd(&side.store, runtime, now_micros, out, progress).await)
            }
        }
    }

    /// The sequence a reset of a group on `queue` to `to` starts at, if it is retained.
    pub async fn reset_target(
        &self,
        runtime: &Handle,
        queue: &Arc<QueueState>,
        to: ResetTo,
    ) -> Result<u64, Error> {
        match self {
            Backend::Embedded(store) => retention::reset_target(store, runtime, queue, to).await,
            Backend::Etcd(side) => on_etcd!(side => etcd::reset::target(side, queue, to).await),
        }
    }

    /// Takes the cross-process ownership of ordered group `group` for a new subscription.
    pub async fn own_ordered(
        &self,
        group: &Arc<OrderedGroupState>,
        tx: &mpsc::Sender<Request>,
    ) -> Result<OwnerHold, Error> {
        let _ = (group, tx);
        match self {
            Backend::Embedded(_) => Ok(OwnerHold::default()),
            Backend::Etcd(side) => on_etcd!(side => {
                let release = etcd::owner::acquire(side, group, tx.clone()).await?;
                Ok(OwnerHold(Some(release)))
            }),
        }
    }

    /// Persists a lease extension where other processes must see it: the etcd engine has its
    /// writer write it. The embedded engine keeps extensions in memory (see
    /// `figures::live_leases`): nothing to do. Never blocks.
    pub fn persist_extension(&self, tx: &mpsc::Sender<Request>, runtime: &Handle, extension: Extension) {
        let _ = (tx, runtime);
        match self {
            Backend::Embedded(_) => drop(extension),
            Backend::Etcd(side) => on_etcd!(side => etcd::persist_extension(tx, runtime, extension)),
        }
    }

    /// Closes the store: the embedded engine's RocksDB (blocking); the etcd engine has nothing
    /// open here (its writer released what it held as it stopped).
    pub fn close(&self) -> Result<(), StorageError> {
        match self {
            Backend::Embedded(store) => store.close(),
            Backend::Etcd(_) => Ok(()),
        }
    }

    /// The refusal of `cap` by this engine.
    fn refusal(&self, cap: Capability) -> Error {
        capability::refusal(self.flavour(), cap)
    }
}
