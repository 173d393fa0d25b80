//! Per-key ordering, the claimer's half: before a group ordered by key claims, it reads the
//! ordering keys of the messages it may claim next, so that the claim index can park each
//! message behind an unfinished earlier one with the same key (`engine/registry/dispatch.rs`).
//!
//! Two reads, both on the blocking pool and outside the group's lock:
//! - after a restart, the keys of the slots restored from claim records (nothing is claimed
//!   until every one is known: one of them may have to park);
//! - the never-claimed messages from the group's frontier, a batch at a time, while fewer than
//!   [`MAX_PARKED`] messages are parked.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::engine::boundary::{RawMessage, ReadOutcome, Shared, WorkGroupState};
use crate::error::Error;

/// Messages one learning step reads.
const LEARN_BATCH: u64 = 1024;
/// Messages read ahead and not handed out (parked, or claimable) beyond which a group stops
/// reading ahead: memory stays bounded behind a hot key or a slow consumer.
pub(crate) const MAX_PARKED: usize = 65_536;
/// Bytes one learning read may return (the keys sit in the envelopes).
const LEARN_BYTES: usize = 4 << 20;

/// The hash a key is parked under. Two keys that collide only share a turn; order within each
/// is kept.
fn key_hash(key: Option<&str>) -> Option<u64> {
    key.map(|k| {
        let mut h = rustc_hash::FxHasher::default();
        k.hash(&mut h);
        h.finish()
    })
}

fn keys_of(msgs: &[RawMessage]) -> Vec<(u64, Option<u64>)> {
    msgs.iter().map(|m| (m.seq, key_hash(m.key.as_deref()))).collect()
}

/// What one learning step did.
pub(super) enum Learned {
    /// Keys were read: claim (and learn) again before waiting.
    Progress,
    /// Nothing to read.
    Nothing,
    /// The broker is closing.
    Closed,
}

/// Reads the keys a claim of `group` needs next (see the module docs).
pub(super) async fn learn(
    shared: &Arc<Shared>,
    group: &Arc<WorkGroupState>,
    last: u64,
) -> Result<Learned, Error> {
    let unknown = group.unknown_keys();
    if !unknown.is_empty() {
        for chunk in unknown.chunks(LEARN_BATCH as usize) {
            let (s, g, seqs) = (shared.clone(), group.clone(), chunk.to_vec());
            let read = shared.runtime.spawn_blocking(move || s.read_seqs(&g.queue, &seqs)).await;
            let keys = match read {
                Ok(Ok(ReadOutcome::Messages(msgs))) => keys_of(&msgs),
                Ok(Ok(ReadOutcome::Closed)) | Err(_) => return Ok(Learned::Closed),
                // One record is gone (retention) or does not decode: read them one by one, so
                // that only that one goes without a key (the claim path deals with a corrupt
                // record when it reads it to deliver it).
                Ok(Err(Error::Gap { .. } | Error::Corrupt(_))) => {
                    let (s, g, seqs) = (shared.clone(), group.clone(), chunk.to_vec());
                    // Only the record that is gone or does not decode: any other failure (etcd
                    // not answering) leaves the keys unknown, to be read again — a message
                    // learned without its key would run beside its key's others.
                    let one_by_one = shared.runtime.spawn_blocking(move || {
                        seqs.iter()
                            .map(|&seq| match s.read_seqs(&g.queue, &[seq]) {
                                Ok(ReadOutcome::Messages(m)) => {
                                    Ok((seq, key_hash(m.first().and_then(|m| m.key.as_deref()))))
                                }
                                Ok(ReadOutcome::Closed) | Err(Error::Gap { .. } | Error::Corrupt(_)) => {
                                    Ok((seq, None))
                                }
                                Err(e) => Err(e),
                            })
                            .collect::<Result<Vec<_>, Error>>()
                    });
                    match one_by_one.await {
                        Ok(Ok(keys)) => keys,
                        Ok(Err(e)) => return Err(e),
                        Err(_) => return Ok(Learned::Closed),
                    }
                }
                Ok(Err(e)) => return Err(e),
            };
            group.assign_keys(keys);
        }
        return Ok(Learned::Progress);
    }
    let Some((from, to)) = group.learn_window(last, LEARN_BATCH, MAX_PARKED) else {
        return Ok(Learned::Nothing);
    };
    let (s, g) = (shared.clone(), group.clone());
    let read = shared.runtime.spawn_blocking(move || s.read_range(&g.queue, from, to, LEARN_BYTES)).await;
    let keys = match read {
        Ok(Ok(ReadOutcome::Messages(msgs))) => keys_of(&msgs),
        Ok(Ok(ReadOutcome::Closed)) | Err(_) => return Ok(Learned::Closed),
        // Retention deleted the head meanwhile: the next window starts past it.
        Ok(Err(Error::Gap { .. }))
            if from < group.queue.first_seq.load(std::sync::atomic::Ordering::Acquire) =>
        {
            return Ok(Learned::Progress);
        }
        // Missing although retained (outside rockq's doing): learned without a key, so the
        // group does not stall on it; the claim path reports it.
        Ok(Err(Error::Gap { .. })) => vec![(from, None)],
        // The record at `from` does not decode: learn it without a key; the claim path
        // dead-letters it.
        Ok(Err(Error::Corrupt(_))) => vec![(from, None)],
        Ok(Err(e)) => return Err(e),
    };
    Ok(if group.learn(keys) > 0 { Learned::Progress } else { Learned::Nothing })
}
