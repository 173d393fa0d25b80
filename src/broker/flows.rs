//! Flows of dependent jobs: building one, reading where it stands, listing and deleting them.

use crate::error::Error;
use crate::flow::Flow;
use crate::flow_state::FlowStatus;

use super::Broker;

impl Broker {
    /// A new, empty [`Flow`]: add its steps, then [`submit`](Flow::submit) it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let jobs = broker.queue("jobs").await?.work_group("workers")?;
    /// let mut flow = broker.flow();
    /// let a = flow.job(&jobs, "a")?;
    /// let b = flow.job(&jobs, "b")?;
    /// flow.then(&jobs, "after a and b", &[a, b])?;
    /// flow.submit().await?;
    /// # Ok(()) }
    /// ```
    pub fn flow(&self) -> Flow {
        Flow::new(self.shared.clone())
    }

    /// Where flow `id` stands: every step's state, the results of those that succeeded, and
    /// the flow's state from them. Read from the store (one bounded read of the flow's
    /// records, on the blocking pool).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchFlow`] if there is none (never submitted, or deleted);
    /// [`Error::Shutdown`], [`Error::Storage`],
    /// [`Error::Corrupt`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let status = broker.flow_status(1).await?;
    /// for step in &status.steps {
    ///     println!("{} {} {}", step.step, step.group, step.state.as_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn flow_status(&self, id: u64) -> Result<FlowStatus, Error> {
        self.shared.flow_status(id).await
    }

    /// Up to `limit` flow ids from `from` (inclusive), in id order (the order they were
    /// submitted).
    ///
    /// # Errors
    ///
    /// As [`flow_status`](Broker::flow_status).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for id in broker.flows(0, 100).await? {
    ///     println!("flow {id}: {:?}", broker.flow_status(id).await?.state);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn flows(&self, from: u64, limit: usize) -> Result<Vec<u64>, Error> {
        self.shared.flow_ids(from, limit).await
    }

    /// Deletes flow `id`'s records. Its jobs already sent stay in their queues and run, but
    /// no longer move a flow; its steps not sent yet never are. Returns `false` if there was
    /// none. Ids are never reused.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancelled before the writer has it, nothing changes; after, the flow is deleted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// if broker.flow_status(7).await?.state == rockq::FlowState::Succeeded {
    ///     broker.delete_flow(7).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delete_flow(&self, id: u64) -> Result<bool, Error> {
        self.shared.delete_flow(id).await
    }
}
