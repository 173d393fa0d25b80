//! The dead-letter copy both engines write: a message's payload and headers plus the
//! `rockq-dlq-*` headers that say where it came from and why (the embedded writer appends it in
//! the round that finishes the message, `writer/dead_letter.rs`; the etcd writer in the
//! transaction that does).

use bytes::Bytes;

use super::registry::QueueState;
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
