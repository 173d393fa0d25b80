#![cfg(feature = "etcd")]
//! The etcd engine (feature `etcd`): the same [`Engine`] state and request set as the embedded
//! engine, over an etcd namespace that several processes share (design: `docs/DISTRIBUTED.md`).
//! Handles reach it through `Backend::Etcd` (`backend.rs`); what it does not carry out yet is
//! refused by the table in `capability.rs`.
//!
//! What differs from the embedded engine, and where:
//! - `writer.rs`: an async task on the runtime (not a thread) applies the same request set;
//!   each round's appends are compare-and-set transactions on the queues' tail keys, so
//!   processes appending to one queue get dense, unique sequences. A request it has no handler
//!   for is refused with `Unsupported`, naming what `capability.rs` says it needs.
//! - `appender.rs`: staged sends are written by a task of their own, beside the writer's
//!   claims, acks and commits (etcd commits transactions that arrive together in one log write).
//! - `watch.rs`: tails moved by other processes are published to the same `QueueState`s, so
//!   subscriptions wake without polling.
//! - `owner.rs`: an ordered group's single active subscriber across processes, held by an etcd
//!   lease; every offset commit compares it.
//! - reads (`Backend::read_range`, `read_seqs`) become ranged `Get`s, run on the blocking pool
//!   like the RocksDB reads.
//! - `claims.rs`: what this process knows of each work group's claim records, and the watch
//!   that teaches the claim state machine what other processes wrote.
//! - `reset.rs`: group resets, which move an offset backwards on a store where every other
//!   write moves it forward; `purge.rs`: a purge, a trim through the tail.
//! - `delayed.rs`: delayed messages; every process's timer fires what is due, each message
//!   once (the firing's transaction compares its record); `schedules.rs`: recurring schedules,
//!   each occurrence once (compared with the schedule's record).

mod appender;
mod claims;
mod dedup;
mod delayed;
mod deletion;
mod flow_book;
mod flow_submit;
mod flows;
mod follow;
mod forget;
pub(crate) mod inspect;
mod keyspaces;
mod known;
mod kv;
pub(crate) mod owner;
mod owners;
mod pause;
mod plan;
mod purge;
mod redrive;
mod reserve;
pub(crate) mod reset;
pub(crate) mod retention;
mod schedules;
mod settings;
mod side;
pub(crate) mod start;
pub(crate) mod stats;
mod txn;
mod watch;
mod work;
mod writer;

pub(crate) use side::{EtcdSettings, EtcdSide};

use tokio::sync::mpsc;

use super::capability::{self, Capability, Flavour};
use super::request::{Request, WorkRequest};
use crate::error::Error;

/// A send call of any size is written (one larger than a transaction under a reservation of
/// its sequences, `reserve.rs`), but each message must fit one transaction on its own, and its
/// prioritised and keyed messages the transaction that makes it visible.
pub(crate) fn check_send(msgs: &[crate::message::Message]) -> Result<(), Error> {
    if msgs.iter().any(|m| crate::store::envelope::encoded_len(m) > crate::store::etcd::MAX_TXN_BYTES) {
        capability::check(Flavour::Etcd, Capability::HugeMessage)?;
    }
    // Every index entry (and a key) goes in the transaction that makes a call visible
    // (`reserve.rs`).
    let entries = msgs.iter().filter(|m| m.priority > 0).count()
        + msgs.iter().filter(|m| m.idempotency_key.is_some()).count();
    if entries > reserve::MAX_KEYS_PER_CALL {
        capability::check(Flavour::Etcd, Capability::HugeMessage)?;
    }
    Ok(())
}

/// Has the writer persist a lease extension, so that other processes see it. Never blocks:
/// with the channel full, the request is sent from a task.
pub(crate) fn persist_extension(
    tx: &mpsc::Sender<Request>,
    runtime: &tokio::runtime::Handle,
    extension: crate::engine::request::Extension,
) {
    let req = Request::Work(WorkRequest::Extend(extension));
    // In order with this caller's later requests, unless the channel is full.
    if let Err(mpsc::error::TrySendError::Full(req)) = tx.try_send(req) {
        let tx = tx.clone();
        runtime.spawn(async move { drop(tx.send(req).await) });
    }
}
