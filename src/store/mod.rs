//! The storage layer: opening RocksDB with rockq's column families, verifying that a directory
//! is ours, loading the registry at start, and the blocking reads the consumers need.
//!
//! Everything here is blocking FFI. Callers run it on the writer thread or in
//! `spawn_blocking`, never on a Tokio worker. This is the only module that uses RocksDB.
//!
//! - `db.rs`: the open database ([`Store`]) and its column families.
//! - `open.rs`: opening, verifying a directory is ours, loading the registry.
//! - `batch.rs`: the writer's domain operations, applied atomically per round.
//! - `read.rs`: the consumers' bounded reads; `inspect.rs`: the reads behind stats.
//! - `scheduled.rs`: delayed messages, recurring schedules and idempotency keys.
//! - `lifecycle.rs`: deleting every record of a queue or a group.
//! - `flows.rs`: flows of dependent jobs (their steps, kept messages and job index).
//! - `kv.rs`: keyspaces of versioned entries (application state written with the queues).
//! - `keys.rs`, `records.rs`, `envelope.rs`, `outcomes.rs`: the key layout and the codecs of
//!   every value (`outcomes.rs`: job outcomes and progress reports).

mod backup;
mod batch;
mod db;
#[cfg(test)]
mod decode_props;
pub(crate) mod envelope;
pub(crate) mod etcd;
#[cfg(feature = "json")]
mod export;
mod flows;
#[cfg(fuzzing)]
pub mod fuzzing;
#[cfg(feature = "json")]
mod import;
#[cfg(feature = "json")]
mod import_check;
mod inspect;
pub(crate) mod keys;
mod kv;
mod lifecycle;
mod open;
mod outcomes;
mod read;
pub(crate) mod records;
mod scheduled;

pub(crate) use backup::restore;
pub(crate) use batch::{Batch, GroupKeys, WriteMode, group_id};
#[cfg(feature = "json")]
pub(crate) use import::import;
#[cfg(feature = "json")]
pub(crate) use import_check::Reader;
pub(crate) use inspect::Snapshot;
pub(crate) use open::{Loaded, LoadedClaim, LoadedQueue, open, open_read_only};
pub(crate) use outcomes::micros_of;
pub(crate) use read::{
    RawMessage, ReadOutcome, first_enqueued_at, last_enqueued_before, newest_stamp, read_cursor,
    read_letter_marks, read_range, read_seqs,
};

pub(crate) use db::{ReadError, Store};
pub(crate) use flows::{LoadedFlows, flow_ids, flow_status};
pub(crate) use keys::RECURRING;
pub(crate) use kv::{RawEntry, kv_get, kv_scan, prefix_end};
pub(crate) use lifecycle::next_queue_id;
pub(crate) use scheduled::DueEntry;
