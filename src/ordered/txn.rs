//! Ordered deliveries in a [`Transaction`]: `ack`, and what the transaction needs of a
//! [`Delivery`].

use std::sync::Arc;

use super::Delivery;
use crate::engine::boundary::TxDelivery;
use crate::error::Error;
use crate::txn::{HeldDelivery, Transaction};

impl Transaction {
    /// Acknowledges an ordered delivery when the transaction commits. If it fails (or is
    /// dropped), the delivery is handed back as if dropped. An ack is an operation:
    /// [`commit`](Transaction::commit) refuses a transaction of more than
    /// [`MAX_TX_OPS`](crate::MAX_TX_OPS).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, mut sub: rockq::Subscription) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let seen = broker.kv("seen").await?;
    /// while let Some(d) = sub.next().await {
    ///     let d = d?;
    ///     let mut tx = broker.transaction();
    ///     tx.put(&seen, d.seq().to_be_bytes(), d.payload().clone())?;
    ///     tx.ack(d);
    ///     tx.commit().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn ack(&mut self, delivery: Delivery) -> &mut Self {
        self.foreign |= !Arc::ptr_eq(delivery.shared(), &self.shared);
        self.deliveries.push(Box::new(delivery));
        self
    }
}

impl HeldDelivery for Delivery {
    fn tx_refusal(&self) -> Option<Error> {
        Delivery::tx_refusal(self)
    }

    fn into_tx(self: Box<Self>) -> Option<TxDelivery> {
        Delivery::into_tx(*self)
    }
}
