//! [`Flow`]: work-queue jobs that run after other jobs — a parent after its children, a chain,
//! a batch's callbacks — built here and submitted as one write.

use std::sync::Arc;

use crate::engine::boundary::{FlowStepSpec, Shared};
use crate::error::Error;
use crate::flow_state::{FLOW_HEADER, MAX_FLOW_STEPS, MAX_STEP_DEPENDENCIES, RunWhen, Step, Submitted};

/// The longest value of the step header the writer adds (`"<flow u64>/<step u32>"`).
const LONGEST_STEP_HEADER: &[u8] = b"18446744073709551615/4294967295";
use crate::message::Message;
use crate::work::WorkGroup;

/// A flow of dependent work-queue jobs, built step by step and stored by
/// [`submit`](Flow::submit) in **one write**: every step is recorded, and the steps that run
/// after nothing are sent at once. Made by [`Broker::flow`](crate::Broker::flow).
///
/// Each step is a job for one [`WorkGroup`]: its message goes to the group's queue, and the
/// group's outcome of it is what counts (an ack succeeds the step; a dead letter or an
/// operator's delete fails it). A step added with [`then`](Flow::then) is sent once all the
/// steps it names succeeded; one added with [`finally`](Flow::finally) once they all finished,
/// however. The writer sends it **in the same write that records the last of them**, so a
/// crash never loses it or sends it twice, and its handler can read what they returned
/// ([`Job::flow_dependencies`](crate::Job::flow_dependencies)).
///
/// - **Parent and children**: `then(parent, &children)`.
/// - **A chain**: each step `then` the one before.
/// - **A batch with callbacks** (Sidekiq's model): `then(on_success, &jobs)` and
///   `finally(on_complete, &jobs)`.
///
/// **Failure**: a step that fails (dead-lettered, or deleted by an operator) blocks every step
/// that needs it to succeed — they are not sent, and count as failed for the steps after
/// them — while `finally` steps go on. **Redriving** the dead letter queues the step again
/// (in the redrive's write): what it blocked waits for it again, and runs if it succeeds. A
/// `finally` step that already ran does not run again.
///
/// Steps may not be delayed or carry an idempotency key (`InvalidOption`): a step is sent
/// when its flow says so, once. Flows are kept until [deleted](crate::Broker::delete_flow);
/// an export leaves them out. On etcd a flow larger than one transaction is written and moved
/// in parts; its steps' messages are then at most 32 KiB each, and a step's result is at most
/// [`MAX_ETCD_STEP_RESULT_BYTES`](crate::MAX_ETCD_STEP_RESULT_BYTES) (docs/etcd.md).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
/// let resize = broker.queue("images").await?.work_group("resize")?;
/// let albums = broker.queue("albums").await?.work_group("build")?;
/// let mut flow = broker.flow();
/// let mut images = Vec::new();
/// for name in ["a.jpg", "b.jpg", "c.jpg"] {
///     images.push(flow.job(&resize, name)?);
/// }
/// flow.then(&albums, "album 7", &images)?; // after all three resized
/// let submitted = flow.submit().await?;
/// println!("flow {}", submitted.id);
/// # Ok(()) }
/// ```
#[must_use = "a flow does nothing unless submitted"]
pub struct Flow {
    shared: Arc<Shared>,
    steps: Vec<FlowStepSpec>,
    /// Set by a step refused for belonging to another broker: refused again at submit.
    foreign: bool,
    /// This builder's number, carried by its steps ([`Step`]'s second field).
    builder: u64,
}

impl std::fmt::Debug for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flow").field("steps", &self.steps.len()).finish()
    }
}

impl Flow {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Flow {
            shared,
            steps: Vec::new(),
            foreign: false,
            builder: crate::flow_state::NEXT_BUILDER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Adds a step sent as soon as the flow is submitted.
    ///
    /// # Errors
    ///
    /// As [`then`](Flow::then); nothing is added.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, charge: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// let first = flow.job(&charge, "order 7")?;
    /// # Ok(()) }
    /// ```
    pub fn job(&mut self, group: &WorkGroup, message: impl Into<Message>) -> Result<Step, Error> {
        self.add(group, message.into(), RunWhen::AllSucceeded, &[])
    }

    /// Adds a step sent once every step of `after` **succeeded** (a parent after its children,
    /// the next step of a chain, a batch's "on success" callback). `after` may be empty (sent
    /// at once, as [`job`](Flow::job)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOption`] for a step of `after` not added to this flow before, a delayed
    /// message or one with an idempotency key, more than [`MAX_FLOW_STEPS`] steps, or a group
    /// of another broker; the message's own refusals as
    /// [`Queue::send`](crate::Queue::send) gives them ([`Error::MessageTooLarge`],
    /// [`Error::InvalidHeader`], [`Error::InvalidKey`], [`Error::QueueDeleted`],
    /// [`Error::Shutdown`]). Nothing is added.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, charge: rockq::WorkGroup, ship: rockq::WorkGroup, mail: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// let charged = flow.job(&charge, "order 7")?;
    /// let shipped = flow.then(&ship, "order 7", &[charged])?;
    /// flow.then(&mail, "order 7 shipped", &[shipped])?;
    /// flow.submit().await?;
    /// # Ok(()) }
    /// ```
    pub fn then(
        &mut self,
        group: &WorkGroup,
        message: impl Into<Message>,
        after: &[Step],
    ) -> Result<Step, Error> {
        self.add(group, message.into(), RunWhen::AllSucceeded, after)
    }

    /// Adds a step sent once every step of `after` **finished**, succeeded or failed (a
    /// batch's "on complete" callback: its handler reads which failed). A step of `after`
    /// that is blocked behind a failure counts as finished. It runs once, even if a failed
    /// step is redriven later.
    ///
    /// # Errors
    ///
    /// As [`then`](Flow::then).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, import: rockq::WorkGroup, report: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// let rows: Vec<_> = (0..100).map(|i| flow.job(&import, format!("row {i}"))).collect::<Result<_, _>>()?;
    /// flow.finally(&report, "import done", &rows)?;
    /// flow.submit().await?;
    /// # Ok(()) }
    /// ```
    pub fn finally(
        &mut self,
        group: &WorkGroup,
        message: impl Into<Message>,
        after: &[Step],
    ) -> Result<Step, Error> {
        self.add(group, message.into(), RunWhen::AllFinished, after)
    }

    /// How many steps it has.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// assert_eq!(broker.flow().len(), 0);
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether it has no step.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// assert!(broker.flow().is_empty());
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    fn add(
        &mut self,
        group: &WorkGroup,
        mut message: Message,
        when: RunWhen,
        after: &[Step],
    ) -> Result<Step, Error> {
        if !Arc::ptr_eq(&group.shared, &self.shared) {
            self.foreign = true;
            return Err(Error::InvalidOption("a flow step's work group belongs to another broker".into()));
        }
        if self.steps.len() >= MAX_FLOW_STEPS {
            return Err(Error::InvalidOption(format!("a flow has at most {MAX_FLOW_STEPS} steps")));
        }
        if after.len() > MAX_STEP_DEPENDENCIES {
            return Err(Error::InvalidOption(format!(
                "a flow step runs after at most {MAX_STEP_DEPENDENCIES} steps"
            )));
        }
        let index = self.steps.len();
        if let Some(bad) = after.iter().find(|s| s.1 != self.builder || s.0 as usize >= index) {
            return Err(Error::InvalidOption(format!(
                "step {} is not a step added to this flow before this one",
                bad.0
            )));
        }
        if message.due.is_some() {
            return Err(Error::InvalidOption("a flow step cannot be delayed".into()));
        }
        if message.idempotency_key.is_some() {
            return Err(Error::InvalidOption("a flow step cannot carry an idempotency key".into()));
        }
        // The writer names the step in a header when it sends it: the message is checked with
        // that header at its longest, so a step accepted here is within `max_message_bytes`
        // when sent. A header of that name given by the caller is replaced, as the writer does.
        message.headers.retain(|(k, _)| k != FLOW_HEADER);
        message.headers.push((FLOW_HEADER.to_owned(), bytes::Bytes::from_static(LONGEST_STEP_HEADER)));
        let checked =
            crate::queue::check_flow_message(&self.shared, group.queue_state(), index, &mut message);
        message.headers.retain(|(k, _)| k != FLOW_HEADER);
        checked?;
        let mut deps: Vec<u32> = after.iter().map(|s| s.0).collect();
        deps.sort_unstable();
        deps.dedup();
        self.steps.push(FlowStepSpec {
            queue: group.queue_state().clone(),
            group: group.name().to_owned(),
            when,
            after: deps,
            message,
        });
        Ok(Step(index as u32, self.builder))
    }

    /// Stores the flow and sends its steps that run after nothing, in one write; resolves once
    /// it is durable in the broker's [`Durability`](crate::Durability) sense.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyBatch`] for a flow without steps; [`Error::InvalidOption`] if a step was
    /// refused for belonging to another broker; [`Error::Unsupported`] on the etcd engine for a
    /// flow larger than one etcd transaction with a step message over 32 KiB or over 8,000
    /// dependencies and first steps (nothing written);
    /// [`Error::QueueDeleted`] if a step's queue was deleted since it was added;
    /// [`Error::MessageTooLarge`]-style refusals were given by the step calls.
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`]. Nothing is written.
    ///
    /// # Cancel safety
    ///
    /// Cancelled before the writer has it, nothing is written; after, the flow is stored (its
    /// id is lost to the caller: [`Broker::flows`](crate::Broker::flows) lists it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// flow.job(&group, "one")?;
    /// let id = flow.submit().await?.id;
    /// println!("{:?}", broker.flow_status(id).await?.state);
    /// # Ok(()) }
    /// ```
    pub async fn submit(self) -> Result<Submitted, Error> {
        if self.foreign {
            return Err(Error::InvalidOption("a flow step's work group belongs to another broker".into()));
        }
        if self.steps.is_empty() {
            return Err(Error::EmptyBatch);
        }
        if self.steps.iter().any(|s| s.message.priority > 0) {
            self.shared.check(crate::engine::boundary::Capability::Priority)?;
        }
        let builder = self.builder;
        let mut submitted = self.shared.submit_flow(self.steps).await?;
        // The writer numbers steps by index only: give them back this builder's number.
        for (step, _) in &mut submitted.sent {
            step.1 = builder;
        }
        Ok(submitted)
    }
}
