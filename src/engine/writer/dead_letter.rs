//! The dead-letter copy, shared by work-queue groups (`work.rs`) and ordered groups
//! (`ordered.rs`): both append the same message format to a dead-letter queue in the round that
//! finishes the message for its group, so the move is atomic.

use bytes::Bytes;

use super::queue;
use super::round::Round;
use crate::engine::registry::QueueState;
use crate::model::dlq;
use crate::store::envelope;

/// Headers `dlq::headers` adds to a dead letter.
const DLQ_HEADERS: usize = 6;

/// Where a dead letter comes from: message `seq` of `queue`, given up on by `group` after
/// `attempts` attempts (deliveries, for an ordered group).
pub(crate) struct Origin<'a> {
    pub queue: &'a QueueState,
    pub group: &'a str,
    pub seq: u64,
    pub attempts: u32,
}

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

/// The dead-letter copy of `origin`'s message `env`, stamped `now`: its payload and headers
/// plus the `rockq-dlq-*` headers, and the reason as recorded. Both engines write this.
///
/// A message whose headers leave no room for the `rockq-dlq-*` ones keeps as many as fit, and
/// the reason says how many were dropped: a message must be able to leave its group.
pub(crate) fn copy(
    origin: &Origin<'_>,
    reason: &str,
    env: envelope::Envelope,
    now: u64,
) -> Result<(Vec<u8>, String), String> {
    let mut reason = reason.to_owned();
    let enqueued_at_micros = env.enqueued_at_micros;
    let mut msg = env.into_message();
    let room = usize::from(u16::MAX) - DLQ_HEADERS;
    if msg.headers.len() > room {
        let dropped = msg.headers.len() - room;
        msg.headers.truncate(room);
        reason
            .push_str(&format!(" ({dropped} original headers dropped: a dead letter keeps at most {room})"));
    }
    let Origin { queue, group, seq, attempts } = *origin;
    for (k, v) in dlq::headers(&queue.name, group, seq, attempts, &reason, enqueued_at_micros) {
        msg.headers.push((k.to_owned(), Bytes::from(v)));
    }
    let value = envelope::encode(&msg, now).map_err(|e| format!("cannot encode dead letter: {e:?}"))?;
    Ok((value, reason))
}
