//! One dead letter on its own: redrive it, or delete it, whatever its place in the queue. The
//! redrive cursor covers the letters before it; one settled above the cursor gets a mark
//! (`letter:<dlq>:<seq>`) that listings, counts and redrives skip, until the cursor passes it
//! and the mark goes. The copy, the mark or cursor move are one write.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::{DeadLetter, DeadLetters, redrive_item};
use crate::engine::boundary::{Capability, Request, WorkRequest};
use crate::error::{Error, NameKind};

impl DeadLetters {
    /// Redrives dead letter `dlq_seq` alone — to `to`, or to the queue it came from — and
    /// returns the queue and sequence of its copy. The letters before it stay.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchLetter`] if it was redriven or deleted already, trimmed, or never
    /// written; [`Error::NoOrigin`] without `to` for a letter sent to the dead-letter queue
    /// directly; [`Error::InvalidName`]; [`Error::QueueDeleted`], [`Error::Shutdown`],
    /// [`Error::Storage`] (on the etcd engine also when etcd's answer was lost: the letter may
    /// have been settled). On the etcd engine two processes settling the same letter settle
    /// it once; the other gets [`Error::NoSuchLetter`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: cancelled before the writer has it, nothing changes; after, the
    /// letter is redriven once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("emails.dlq").await?;
    /// let (queue, seq) = dlq.redrive_one(7, None).await?;
    /// println!("letter 7 is {queue}#{seq} again");
    /// # Ok(()) }
    /// ```
    pub async fn redrive_one(&self, dlq_seq: u64, to: Option<&str>) -> Result<(String, u64), Error> {
        if let Some(t) = to {
            crate::name::validate(NameKind::Queue, t)?;
        }
        self.shared.check(Capability::DeadLetterActions)?;
        let letter = self.letter(dlq_seq).await?;
        let item = redrive_item(letter, to, self.shared.clock().wall_micros())?;
        match self.settle(dlq_seq, Some(item)).await? {
            Some((queue, seq)) => Ok((queue.to_string(), seq)),
            None => Err(Error::Internal("a redrive wrote no copy".into())),
        }
    }

    /// Deletes dead letter `dlq_seq`: it is no longer listed, counted or redriven. The letters
    /// before it stay.
    ///
    /// # Errors
    ///
    /// As for [`redrive_one`](Self::redrive_one), without the target's.
    ///
    /// # Cancel safety
    ///
    /// As for [`redrive_one`](Self::redrive_one).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.dead_letters("emails.dlq").await?.delete(7).await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self, dlq_seq: u64) -> Result<(), Error> {
        self.shared.check(Capability::DeadLetterActions)?;
        // Read first: a letter that is gone is refused by name, not by a write that finds it
        // missing.
        self.letter(dlq_seq).await?;
        self.settle(dlq_seq, None).await.map(drop)
    }

    /// Letter `dlq_seq`, if it is still to be settled.
    async fn letter(&self, dlq_seq: u64) -> Result<DeadLetter, Error> {
        let missing = || Error::NoSuchLetter { dlq: self.queue.name.to_string(), seq: dlq_seq };
        let (cursor, marks) = self.cursor_and_marks().await?;
        if dlq_seq <= cursor || marks.contains(&dlq_seq) || dlq_seq > self.queue.last_seq() {
            return Err(missing());
        }
        let raw = self.read(dlq_seq, 1).await?;
        raw.into_iter().find(|m| m.seq == dlq_seq).map(DeadLetter::from_raw).ok_or_else(missing)
    }

    async fn settle(
        &self,
        seq: u64,
        item: Option<crate::engine::boundary::RedriveItem>,
    ) -> Result<Option<(Arc<str>, u64)>, Error> {
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let (reply, rx) = oneshot::channel();
        let req = Request::Work(WorkRequest::SettleLetter { dlq: self.queue.clone(), seq, item, reply });
        self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }
}
