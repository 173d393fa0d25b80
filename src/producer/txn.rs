//! Sends in a [`Transaction`] (and in a pool handler's [`TaskTx`]).

use std::sync::Arc;

use super::Queue;
use crate::engine::boundary::TxSend;
use crate::error::TxError;
use crate::message::Message;
use crate::txn::{TaskTx, Transaction};

impl Transaction {
    /// Sends `message` to `queue` when the transaction commits. Delays and idempotency keys
    /// work as in [`Queue::submit`]; [`Committed::sent`](crate::Committed::sent) says what
    /// became of it.
    ///
    /// # Errors
    ///
    /// [`TxError::Invalid`] if the message is too large or its headers or keys are invalid;
    /// [`TxError::QueueDeleted`]; [`TxError::Shutdown`]. The transaction is unchanged.
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
    pub fn send(&mut self, queue: &Queue, message: impl Into<Message>) -> Result<&mut Self, TxError> {
        self.room()?;
        let index = self.sends.len();
        let (shared, state, msg) = queue.transactional(index, message.into()).map_err(|e| match e {
            crate::error::SendError::Shutdown => TxError::Shutdown,
            crate::error::SendError::QueueDeleted { queue } => TxError::QueueDeleted { queue },
            other => TxError::Invalid { reason: other.to_string() },
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
    /// # fn demo(task: rockq::Task, invoices: rockq::Queue) -> Result<(), rockq::TxError> {
    /// task.tx().send(&invoices, task.payload().clone())?;
    /// # Ok(()) }
    /// ```
    pub fn send(&self, queue: &Queue, message: impl Into<Message>) -> Result<(), TxError> {
        self.lock().send(queue, message).map(drop)
    }
}
