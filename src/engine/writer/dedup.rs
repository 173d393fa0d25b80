//! Idempotency keys on the writer's side: checking a key against this round's records and the
//! dedup column family, and recording it in the batch that writes its message. Used by staged
//! sends (`queue.rs`) and submit requests (`schedule.rs`).

use super::round::Round;
use crate::engine::registry::QueueState;
use crate::model::DedupRecord;
use crate::sent::Original;
use crate::store::ReadError;

/// Records idempotency key `key` of `queue` for `original`, for the queue's window from `now`.
pub(super) fn record(r: &mut Round<'_>, queue: &QueueState, key: String, original: Original, now: u64) {
    let window = queue.dedup_window().as_micros().min(u128::from(u64::MAX)) as u64;
    let record = DedupRecord { original, expires_micros: now.saturating_add(window) };
    r.batch.put_dedup(queue.id, key.as_bytes(), &record);
    r.jobs.dedup.entry(queue.id).or_default().insert(key, (original, record.expires_micros));
}

/// The idempotency check of a staged send (`queue.rs`): the original if `key` is a duplicate
/// within its window — nothing is to be written — or else `None`, with the key recorded for
/// `appending` in this batch. A record that cannot be read counts as absent (and is logged):
/// a storage read failing here is followed by the write failing, which fails the broker
/// closed; a corrupt record is overwritten.
pub(super) fn check(
    r: &mut Round<'_>,
    queue: &QueueState,
    key: &str,
    now: u64,
    appending: Original,
) -> Option<Original> {
    match lookup(r, queue.id, key, now) {
        Ok(Some(original)) => return Some(original),
        Ok(None) => {}
        Err(e) => {
            tracing::error!(queue = %queue.name, error = %e, "rockq: an idempotency key's record does not read")
        }
    }
    record(r, queue, key.to_owned(), appending, now);
    None
}

/// The original of idempotency key `key` if it is still within its window at `now` (this
/// round's records first).
pub(super) fn lookup(
    r: &Round<'_>,
    queue_id: u32,
    key: &str,
    now: u64,
) -> Result<Option<Original>, ReadError> {
    if let Some(o) = r.jobs.dedup(queue_id, key) {
        return Ok(Some(o));
    }
    Ok(r.batch.dedup(queue_id, key.as_bytes())?.filter(|d| d.expires_micros > now).map(|d| d.original))
}
