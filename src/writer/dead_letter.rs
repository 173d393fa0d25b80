//! The dead-letter copy, shared by work-queue groups (`work.rs`) and ordered groups
//! (`ordered.rs`): both append the same record format to a dead-letter queue in the round that
//! finishes the message for its group, so the move is atomic.

use bytes::Bytes;
use rocksdb::WriteBatch;

use super::{Round, Writer};
use crate::message::Message;
use crate::registry::QueueState;
use crate::store::{Cfs, envelope};
use crate::work::dlq_headers;

/// Headers `dlq_headers` adds to a dead letter.
const DLQ_HEADERS: usize = 6;

impl Writer {
    /// Appends to `dlq` (created in this round if missing) the dead-letter copy of message
    /// `seq` of `origin`, as `group` gave up on it after `attempts` attempts: its payload and
    /// headers plus the `rockq-dlq-*` headers, stamped like a send. Returns its sequence in the
    /// dead-letter queue and the reason as recorded.
    ///
    /// A message whose headers leave no room for the `rockq-dlq-*` ones keeps as many as fit,
    /// and the reason says how many were dropped: a message must be able to leave its group.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append_dead_letter(
        &mut self,
        wb: &mut WriteBatch,
        cfs: &Cfs<'_>,
        r: &mut Round,
        origin: &QueueState,
        group: &str,
        seq: u64,
        attempts: u32,
        reason: &str,
        env: envelope::Envelope,
        dlq: &str,
    ) -> Result<(u64, String), String> {
        let dlq_queue =
            self.ensure_queue(wb, cfs.meta, r, dlq).map_err(|e| format!("dead-letter queue {dlq:?}: {e}"))?;
        let mut reason = reason.to_owned();
        let mut msg = Message { payload: env.payload, headers: env.headers };
        let room = usize::from(u16::MAX) - DLQ_HEADERS;
        if msg.headers.len() > room {
            let dropped = msg.headers.len() - room;
            msg.headers.truncate(room);
            reason.push_str(&format!(
                " ({dropped} original headers dropped: a dead letter keeps at most {room})"
            ));
        }
        for (k, v) in dlq_headers(&origin.name, group, seq, attempts, &reason, env.enqueued_at_micros) {
            msg.headers.push((k.to_owned(), Bytes::from(v)));
        }
        // Stamped like a send, so times along the dead-letter queue never decrease.
        let now = self.stamp();
        let value = envelope::encode(&msg, now).map_err(|e| format!("cannot encode dead letter: {e:?}"))?;
        let dlq_seq = self
            .append(wb, cfs.messages, r, &dlq_queue, &value)
            .ok_or_else(|| "dead-letter queue has no sequence".to_owned())?;
        Ok((dlq_seq, reason))
    }
}
