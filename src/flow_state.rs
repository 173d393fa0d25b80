//! Flows of dependent jobs as values: the steps a [`Flow`](crate::Flow) is built from, what the
//! store keeps of each step, and the status a flow reports ([`FlowStatus`]).
//!
//! A flow is a set of work-queue jobs, each for one work group, where a step may run only
//! after others: a parent after its children, a chain of steps, a batch's callbacks after its
//! jobs. The writer keeps every step's record and moves the flow on **in the write that
//! finishes a step's job**, so a crash between "child done" and "parent sent" cannot happen.

use std::time::SystemTime;

use bytes::Bytes;

use crate::stats::OutcomeKind;

/// The header every flow step's message carries: `"<flow id>/<step>"`. The writer reads it
/// when a dead letter is redriven (the step runs again), and [`FlowStep`] is parsed from it.
pub const FLOW_HEADER: &str = "rockq-flow";

/// Most steps in one flow.
pub const MAX_FLOW_STEPS: usize = 100_000;

/// Most bytes of a flow step's result ([`Task::set_result`](crate::Task::set_result)) on the
/// etcd engine: a flow moves in one etcd transaction that may rewrite every step's record, its
/// result included, and a flow's records are read in one answer. Embedded, a step's result may
/// be up to [`MAX_RESULT_BYTES`](crate::stats::MAX_RESULT_BYTES).
pub const MAX_ETCD_STEP_RESULT_BYTES: usize = 16 << 10;

/// Most dependencies of one step (its `after` list).
pub const MAX_STEP_DEPENDENCIES: usize = MAX_FLOW_STEPS;

/// A step of a flow being built, returned by [`Flow::job`](crate::Flow::job),
/// [`Flow::then`](crate::Flow::then) and [`Flow::finally`](crate::Flow::finally), and given to
/// later steps as a dependency. Its number is its index in the flow (the order steps were
/// added), as [`StepStatus::step`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Step(pub(crate) u32, pub(crate) u64);

/// Numbers each `Flow` built in this process, so a step of another flow is refused rather
/// than taken for this one's step of the same index.
pub(crate) static NEXT_BUILDER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Step {
    /// Its index in the flow, in the order steps were added (0 first).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// let first = flow.job(&group, "a")?;
    /// assert_eq!(first.index(), 0);
    /// # Ok(()) }
    /// ```
    pub fn index(self) -> u32 {
        self.0
    }
}

/// When a step that has dependencies runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunWhen {
    /// Once every dependency succeeded (its job acked). A dependency that is dead-lettered or
    /// deleted **blocks** the step (and, in turn, every step that needs it to succeed) until
    /// that dead letter is redriven and succeeds. [`Flow::then`](crate::Flow::then).
    AllSucceeded,
    /// Once every dependency finished, succeeded or not (dead-lettered, deleted, or blocked
    /// behind one that was): a batch's "on complete" callback.
    /// [`Flow::finally`](crate::Flow::finally).
    AllFinished,
}

impl RunWhen {
    /// `"all_succeeded"` or `"all_finished"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RunWhen::AllFinished.as_str(), "all_finished");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            RunWhen::AllSucceeded => "all_succeeded",
            RunWhen::AllFinished => "all_finished",
        }
    }
}

/// Which step of which flow a job is, read from its message's [`FLOW_HEADER`]
/// ([`Job::flow_step`](crate::Job::flow_step)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowStep {
    /// The flow's id ([`FlowStatus::id`]).
    pub flow: u64,
    /// The step's index in the flow.
    pub step: u32,
}

impl FlowStep {
    /// Parses a [`FLOW_HEADER`] value, `"<flow>/<step>"`.
    ///
    /// # Examples
    ///
    /// ```
    /// let s = rockq::FlowStep::parse(b"42/3").unwrap();
    /// assert_eq!((s.flow, s.step), (42, 3));
    /// assert!(rockq::FlowStep::parse(b"42").is_none());
    /// ```
    pub fn parse(value: &[u8]) -> Option<FlowStep> {
        let s = std::str::from_utf8(value).ok()?;
        let (flow, step) = s.split_once('/')?;
        Some(FlowStep { flow: flow.parse().ok()?, step: step.parse().ok()? })
    }

    /// The step a message's headers name (its first [`FLOW_HEADER`]).
    pub(crate) fn in_headers(headers: &[(String, Bytes)]) -> Option<FlowStep> {
        headers.iter().find(|(k, _)| k == FLOW_HEADER).and_then(|(_, v)| FlowStep::parse(v))
    }

    /// The header value, `"<flow>/<step>"`.
    pub(crate) fn header_value(self) -> String {
        format!("{}/{}", self.flow, self.step)
    }
}

/// A flow as it stands ([`Broker::flow_status`](crate::Broker::flow_status)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowStatus {
    /// The flow's id, as [`Flow::submit`](crate::Flow::submit) returned it.
    pub id: u64,
    /// When it was submitted (the broker's wall clock).
    pub created_at: SystemTime,
    /// Running, succeeded or failed, from its steps.
    pub state: FlowState,
    /// Every step, in index order.
    pub steps: Vec<StepStatus>,
}

/// Where a flow stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlowState {
    /// Some step is queued, or waiting on dependencies that may still succeed.
    Running,
    /// Every step succeeded.
    Succeeded,
    /// Nothing can run any more without an operator: some step failed (dead-lettered or
    /// deleted) and every other one finished or is blocked behind it. Redriving the dead
    /// letter makes the flow run again.
    Failed,
}

impl FlowState {
    /// `"running"`, `"succeeded"` or `"failed"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::FlowState::Failed.as_str(), "failed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::Running => "running",
            FlowState::Succeeded => "succeeded",
            FlowState::Failed => "failed",
        }
    }
}

/// One step of a [`FlowStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepStatus {
    /// Its index in the flow.
    pub step: u32,
    /// The queue its job is sent to.
    pub queue: String,
    /// The work group whose outcome counts (other groups of the queue may process the message
    /// too; only this one's ack or dead letter moves the flow).
    pub group: String,
    /// When it runs, if it has dependencies.
    pub when: RunWhen,
    /// The steps it runs after (indexes), empty for a step sent at once.
    pub after: Vec<u32>,
    /// Where it stands.
    pub state: StepState,
}

/// Where one step of a flow stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepState {
    /// Not sent yet: `succeeded` and `failed` of its `of` dependencies have finished.
    Waiting {
        /// Dependencies that succeeded.
        succeeded: u32,
        /// Dependencies that failed (dead-lettered, deleted, or blocked).
        failed: u32,
        /// How many it has.
        of: u32,
    },
    /// Not sent, and will not be unless a failed dependency is redriven and succeeds (it runs
    /// [`RunWhen::AllSucceeded`] and `failed` of its dependencies failed).
    Blocked {
        /// Dependencies that failed.
        failed: u32,
        /// How many it has.
        of: u32,
    },
    /// Sent as job `seq` of its queue: waiting, running or retrying there
    /// ([`WorkGroup::job`](crate::WorkGroup::job) says which).
    Queued {
        /// The job's sequence in its queue.
        seq: u64,
    },
    /// Its job was acked by its group.
    Succeeded {
        /// The job's sequence.
        seq: u64,
        /// When the writer recorded it.
        finished_at: SystemTime,
        /// What the handler returned ([`Task::set_result`](crate::Task::set_result)), if it did.
        result: Option<Bytes>,
    },
    /// Its job was dead-lettered or deleted by an operator. A redrive of the dead letter
    /// queues it again.
    Failed {
        /// The job's sequence.
        seq: u64,
        /// When the writer recorded it.
        finished_at: SystemTime,
        /// How it ended: [`OutcomeKind::DeadLettered`] (with the dead letter's place) or
        /// [`OutcomeKind::Deleted`].
        how: OutcomeKind,
    },
}

impl StepState {
    /// `"waiting"`, `"blocked"`, `"queued"`, `"succeeded"` or `"failed"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::StepState::Queued { seq: 1 }.as_str(), "queued");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            StepState::Waiting { .. } => "waiting",
            StepState::Blocked { .. } => "blocked",
            StepState::Queued { .. } => "queued",
            StepState::Succeeded { .. } => "succeeded",
            StepState::Failed { .. } => "failed",
        }
    }

    /// The handler's result, for a step that succeeded with one.
    ///
    /// # Examples
    ///
    /// ```
    /// let s = rockq::StepState::Queued { seq: 1 };
    /// assert!(s.result().is_none());
    /// ```
    pub fn result(&self) -> Option<&Bytes> {
        match self {
            StepState::Succeeded { result, .. } => result.as_ref(),
            _ => None,
        }
    }
}

impl FlowStatus {
    /// The steps that step `step` runs after, with their states (what a parent's handler reads:
    /// its children's results). Empty for an unknown step.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let status = broker.flow_status(7).await?;
    /// for child in status.dependencies(3) {
    ///     println!("{}: {:?}", child.step, child.state.result());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn dependencies(&self, step: u32) -> Vec<&StepStatus> {
        let Some(s) = self.steps.get(step as usize) else { return Vec::new() };
        s.after.iter().filter_map(|&d| self.steps.get(d as usize)).collect()
    }

    /// How many of its steps stand in each state (which of a batch of 10,000 failed is in
    /// [`steps`](FlowStatus::steps); how many, here).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let t = broker.flow_status(7).await?.tally();
    /// println!("{} of {} done, {} failed", t.succeeded + t.failed, t.total(), t.failed);
    /// # Ok(()) }
    /// ```
    pub fn tally(&self) -> StepTally {
        let mut t = StepTally::default();
        for s in &self.steps {
            match s.state {
                StepState::Waiting { .. } => t.waiting += 1,
                StepState::Blocked { .. } => t.blocked += 1,
                StepState::Queued { .. } => t.queued += 1,
                StepState::Succeeded { .. } => t.succeeded += 1,
                StepState::Failed { .. } => t.failed += 1,
            }
        }
        t
    }
}

/// The steps of a flow counted by state: [`FlowStatus::tally`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct StepTally {
    /// Not sent, waiting for dependencies.
    pub waiting: usize,
    /// Not sent, and will not be unless a failed dependency is redriven.
    pub blocked: usize,
    /// Sent: waiting, running or retrying in their group.
    pub queued: usize,
    /// Acked by their group.
    pub succeeded: usize,
    /// Dead-lettered or deleted.
    pub failed: usize,
}

impl StepTally {
    /// Every step counted.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::StepTally::default().total(), 0);
    /// ```
    pub fn total(&self) -> usize {
        self.waiting + self.blocked + self.queued + self.succeeded + self.failed
    }
}

/// What the store keeps of one step: its place in the flow and its state. The counts are of
/// its dependencies, kept as they finish (and revive), so readiness is O(1) per change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepRecord {
    pub queue: String,
    pub group: String,
    pub when: RunWhen,
    /// How many dependencies it has (their list is kept apart: it never changes).
    pub deps: u32,
    /// Steps that run after this one.
    pub dependents: Vec<u32>,
    /// Dependencies that succeeded.
    pub succeeded: u32,
    /// Dependencies that failed or are blocked.
    pub failed: u32,
    pub state: StoredStep,
}

/// A stored step's state (`Waiting` covers blocked: that follows from the counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredStep {
    Waiting,
    Queued { seq: u64 },
    Succeeded { seq: u64, at_micros: u64, result: Option<Bytes> },
    Failed { seq: u64, at_micros: u64, how: OutcomeKind },
}

impl StepRecord {
    /// Not sent, and a dependency it needs to succeed failed.
    pub fn is_blocked(&self) -> bool {
        matches!(self.state, StoredStep::Waiting) && self.when == RunWhen::AllSucceeded && self.failed > 0
    }

    /// Not sent, and its dependencies are where it runs.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, StoredStep::Waiting)
            && match self.when {
                RunWhen::AllSucceeded => self.succeeded >= self.deps,
                RunWhen::AllFinished => self.succeeded.saturating_add(self.failed) >= self.deps,
            }
    }

    /// The public view of it, as step `step` with dependencies `after`.
    pub fn status(&self, step: u32, after: Vec<u32>) -> StepStatus {
        let at = |micros: u64| std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
        let state = match &self.state {
            StoredStep::Waiting if self.is_blocked() => {
                StepState::Blocked { failed: self.failed, of: self.deps }
            }
            StoredStep::Waiting => {
                StepState::Waiting { succeeded: self.succeeded, failed: self.failed, of: self.deps }
            }
            StoredStep::Queued { seq } => StepState::Queued { seq: *seq },
            StoredStep::Succeeded { seq, at_micros, result } => {
                StepState::Succeeded { seq: *seq, finished_at: at(*at_micros), result: result.clone() }
            }
            StoredStep::Failed { seq, at_micros, how } => {
                StepState::Failed { seq: *seq, finished_at: at(*at_micros), how: how.clone() }
            }
        };
        StepStatus {
            step,
            queue: self.queue.clone(),
            group: self.group.clone(),
            when: self.when,
            after,
            state,
        }
    }
}

/// A flow's own record: when it was made and how many steps it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowHeader {
    pub created_micros: u64,
    pub steps: u32,
}

/// The state of a flow from its steps' states.
pub(crate) fn flow_state(steps: &[StepStatus]) -> FlowState {
    if steps.iter().all(|s| matches!(s.state, StepState::Succeeded { .. })) {
        return FlowState::Succeeded;
    }
    let moving =
        steps.iter().any(|s| matches!(s.state, StepState::Queued { .. } | StepState::Waiting { .. }));
    if moving { FlowState::Running } else { FlowState::Failed }
}

/// What [`Flow::submit`](crate::Flow::submit) stored: the flow's id and where its first steps
/// (those that run after nothing) went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Submitted {
    /// The flow's id ([`Broker::flow_status`](crate::Broker::flow_status)).
    pub id: u64,
    /// Each step sent at once, with its sequence in its queue, in step order.
    pub sent: Vec<(Step, u64)>,
}

impl Submitted {
    /// The sequence step `step` was sent as, if it was sent at submission.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let mut flow = broker.flow();
    /// let first = flow.job(&group, "a")?;
    /// let submitted = flow.submit().await?;
    /// println!("step 0 is job {:?}", submitted.seq_of(first));
    /// # Ok(()) }
    /// ```
    pub fn seq_of(&self, step: Step) -> Option<u64> {
        self.sent.iter().find(|(s, _)| *s == step).map(|(_, seq)| *seq)
    }
}

/// How a dependency's change moves the steps after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// It succeeded.
    Succeeded,
    /// It failed, or became blocked.
    Failed,
    /// It failed or was blocked before, and no longer is (a redrive).
    Revived,
    /// None: the step is sent if it is ready (a flow's first steps, sent after its submit).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // a large flow's submit on etcd
    Start,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // stored worklists are the etcd engine's
impl Change {
    /// Its byte in a stored worklist.
    pub(crate) fn code(self) -> u8 {
        match self {
            Change::Succeeded => 0,
            Change::Failed => 1,
            Change::Revived => 2,
            Change::Start => 3,
        }
    }

    /// The change stored as `code` (`None`: not one).
    pub(crate) fn from_code(code: u8) -> Option<Change> {
        Some(match code {
            0 => Change::Succeeded,
            1 => Change::Failed,
            2 => Change::Revived,
            3 => Change::Start,
            _ => return None,
        })
    }
}
