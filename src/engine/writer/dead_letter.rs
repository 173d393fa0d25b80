//! Appending a dead letter in the embedded writer's round, shared by work-queue groups
//! (`work.rs`) and ordered groups (`ordered.rs`): both append the same copy
//! (`engine/dead_letter.rs`, which the etcd engine writes too) to a dead-letter queue in the
//! round that finishes the message for its group, so the move is atomic.

use super::queue;
use super::round::Round;
pub(crate) use crate::engine::dead_letter::Origin;
use crate::engine::dead_letter::copy;
use crate::store::envelope;

/// Appends to `dlq` (created in this round if missing) the dead-letter copy of `origin`'s
/// message `env` ([`copy`]), stamped like a send. Returns its sequence in the dead-letter queue
/// and the reason as recorded.
pub(super) fn append(
    r: &mut Round<'_>,
    origin: &Origin<'_>,
    reason: &str,
    env: envelope::Envelope,
    dlq: &str,
) -> Result<(u64, String), String> {
    let dlq_queue = queue::ensure(r, dlq).map_err(|e| format!("dead-letter queue {dlq:?}: {e}"))?;
    // Stamped like a send, so times along the dead-letter queue never decrease.
    let now = r.stamp();
    let (value, reason) = copy(origin, reason, env, now)?;
    let dlq_seq =
        queue::append(r, &dlq_queue, &value).ok_or_else(|| "dead-letter queue has no sequence".to_owned())?;
    Ok((dlq_seq, reason))
}
