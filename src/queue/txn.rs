//! Sends in a [`Transaction`] (and in a pool handler's [`TaskTx`]).

use std::sync::Arc;

use super::handle::Queue;
use crate::engine::boundary::TxSend;
use crate::error::Error;
use crate::message::Message;
use crate::txn::Transaction;
use crate::txn::task::TaskTx;

impl Transaction {
    /// Sends `message` to `queue` when the transaction commits. Delays and idempotency keys
    /// work as in [`Queue::submit`]; [`Committed::sent`](crate::Committed::sent) says what
    /// became of it.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] if the message is too large or its headers or keys are invalid;
    /// [`Error::QueueDeleted`]; [`Error::Shutdown`]. The transaction is unchanged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, invoices: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::Message;
    /// use std::time::Duration;
    /// let mut tx = broker.transaction();
    /// tx.send(&invoices, "now")?;
    /// tx.send(&invoices, Message::new("reminder").deliver_after(Duration::from_secs(86_400)))?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn send(&mut self, queue: &Queue, message: impl Into<Message>) -> Result<&mut Self, Error> {
        self.room()?;
        let index = self.sends.len();
        let (shared, state, msg) = queue.transactional(index, message.into()).map_err(|e| match e {
            crate::error::Error::Shutdown => Error::Shutdown,
            crate::error::Error::QueueDeleted { queue } => Error::QueueDeleted { queue },
            other => Error::Invalid { reason: other.to_string() },
        })?;
        self.take_bytes(msg.envelope.len())?;
        self.foreign |= !Arc::ptr_eq(&shared, &self.shared);
        self.sends.push(TxSend { queue: state, msg });
        Ok(self)
    }
}

impl TaskTx {
    /// Sends `message` to `queue` together with the job's ack (see
    /// [`Transaction::send`]).
    ///
    /// # Errors
    ///
    /// As [`Transaction::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task, invoices: rockq::Queue) -> Result<(), rockq::Error> {
    /// task.tx().send(&invoices, task.payload().clone())?;
    /// # Ok(()) }
    /// ```
    pub fn send(&self, queue: &Queue, message: impl Into<Message>) -> Result<(), Error> {
        self.lock().send(queue, message).map(drop)
    }
}
