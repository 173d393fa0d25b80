//! Where the console reads from: a live [`Broker`] (which it may also change, given a token),
//! a read-only [`Inspector`] for a database another process holds, or an inspector given by
//! the caller (an etcd namespace's, `Inspector::connect_etcd`: live, never reopened).
//!
//! An `Inspector` sees the database as it was when opened, so the read-only source reopens it
//! when its view is older than [`INSPECTOR_MAX_AGE`]: pages stay current without paying a
//! read-only open on every request of a burst.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::failure::Failure;
use crate::broker::Broker;
use crate::dead_letter::DeadLetter;
use crate::flow_state::FlowStatus;
use crate::inspector::Inspector;
use crate::schedule::{DelayedInfo, ScheduleInfo};
use crate::stats::{GroupStats, JobStatus, PendingClaim, QueueStats, Stats, StoredMessage};

/// How stale the read-only view may get before it is reopened.
const INSPECTOR_MAX_AGE: Duration = Duration::from_secs(1);

pub(crate) enum Source {
    Broker(Broker),
    ReadOnly { path: PathBuf, view: Mutex<Option<(Instant, Inspector)>> },
    Inspector(Inspector),
}

impl Source {
    /// The broker, when the console may change things.
    pub(crate) fn broker(&self) -> Option<&Broker> {
        match self {
            Source::Broker(b) => Some(b),
            Source::ReadOnly { .. } | Source::Inspector(_) => None,
        }
    }

    /// Whether the source is gone for good (the broker was shut down).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self, Source::Broker(b) if b.is_shut_down())
    }

    async fn inspector(&self) -> Result<Option<Inspector>, Failure> {
        let (path, view) = match self {
            Source::ReadOnly { path, view } => (path, view),
            Source::Inspector(i) => return Ok(Some(i.clone())),
            Source::Broker(_) => return Ok(None),
        };
        let mut view = view.lock().await;
        if let Some((at, i)) = view.as_ref()
            && at.elapsed() < INSPECTOR_MAX_AGE
        {
            return Ok(Some(i.clone()));
        }
        let i = Inspector::open(path).await.map_err(|e| {
            Failure::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the database: {e}"),
            )
        })?;
        *view = Some((Instant::now(), i.clone()));
        Ok(Some(i))
    }

    pub(crate) async fn stats(&self) -> Result<Stats, Failure> {
        match self {
            Source::Broker(b) => Ok(b.stats().await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.stats().await?),
                None => Ok(Stats::default()),
            },
        }
    }

    pub(crate) async fn pending(&self, queue: &str, group: &str) -> Result<Vec<PendingClaim>, Failure> {
        match self {
            Source::Broker(b) => Ok(b.pending(queue, group).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.pending(queue, group).await?),
                None => Ok(Vec::new()),
            },
        }
    }

    pub(crate) async fn job(&self, queue: &str, group: &str, seq: u64) -> Result<JobStatus, Failure> {
        match self {
            Source::Broker(b) => Ok(b.job(queue, group, seq).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.job(queue, group, seq).await?),
                None => Err(Failure::not_found(format!("no job {seq}: the database does not exist yet"))),
            },
        }
    }

    /// Flow `id` with every step.
    pub(crate) async fn flow(&self, id: u64) -> Result<FlowStatus, Failure> {
        match self {
            Source::Broker(b) => Ok(b.flow_status(id).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.flow(id).await?),
                None => Err(Failure::not_found(format!("no flow {id}: the database does not exist yet"))),
            },
        }
    }

    /// Up to `limit` flow ids from `from`, in id order.
    pub(crate) async fn flows(&self, from: u64, limit: usize) -> Result<Vec<u64>, Failure> {
        match self {
            Source::Broker(b) => Ok(b.flows(from, limit).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.flows(from, limit).await?),
                None => Ok(Vec::new()),
            },
        }
    }

    pub(crate) async fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, Failure> {
        match self {
            Source::Broker(b) => Ok(b.peek(queue, from, limit).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.peek(queue, from, limit).await?),
                None => Ok(Vec::new()),
            },
        }
    }

    /// Delayed messages waiting to fall due (of `queue`, or every queue), at most `limit`.
    pub(crate) async fn delayed(
        &self,
        queue: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DelayedInfo>, Failure> {
        match self {
            Source::Broker(b) => Ok(b.delayed(queue, limit).await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.delayed(queue, limit).await?),
                None => Ok(Vec::new()),
            },
        }
    }

    /// Every recurring schedule.
    pub(crate) async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Failure> {
        match self {
            Source::Broker(b) => Ok(b.schedules().await?),
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.schedules().await?),
                None => Ok(Vec::new()),
            },
        }
    }

    /// How many dead letters of `dlq` are not yet redriven: exact over a broker; over the
    /// read-only view, what a group storing it as its dead-letter queue reports (`None` if
    /// none does).
    pub(crate) async fn dlq_depth(&self, dlq: &str) -> Result<Option<u64>, Failure> {
        match self {
            Source::Broker(b) => Ok(Some(b.dead_letters(dlq).await?.len().await?)),
            Source::ReadOnly { .. } | Source::Inspector(_) => {
                let stats = self.stats().await?;
                Ok(stats
                    .groups
                    .iter()
                    .find(|g| g.dead_letter_queue.as_deref() == Some(dlq))
                    .map(|g| g.dlq_depth))
            }
        }
    }

    /// Refuses `name` unless it is a dead-letter queue: one a group dead-letters into, or named
    /// as the default ones are (`<queue>.dlq`). Redrive moves messages out of the queue it acts
    /// on: on a live queue it would move live work (issue 31).
    pub(crate) async fn check_dead_letter_queue(&self, name: &str) -> Result<(), Failure> {
        let stats = self.stats().await?;
        if dead_letter_queues(&stats).contains(&name) {
            return Ok(());
        }
        Err(Failure::not_found(format!(
            "queue {name:?} is not a dead-letter queue (no group dead-letters into it): \
             dead-letter views and redrive act only on dead-letter queues"
        )))
    }

    /// Dead letters not yet redriven. The queue must exist: `Broker::dead_letters` would
    /// create it, and reading must change nothing.
    pub(crate) async fn dead_letters(&self, dlq: &str, limit: usize) -> Result<Vec<DeadLetter>, Failure> {
        match self {
            Source::Broker(b) => {
                if !b.queue_names().iter().any(|q| q == dlq) {
                    return Err(Failure::not_found(format!("queue {dlq:?} does not exist")));
                }
                Ok(b.dead_letters(dlq).await?.list(limit).await?)
            }
            Source::ReadOnly { .. } | Source::Inspector(_) => match self.inspector().await? {
                Some(i) => Ok(i.dead_letters(dlq, limit).await?),
                None => Ok(Vec::new()),
            },
        }
    }
}

/// The dead-letter queues of `stats`: those a group dead-letters into, and those named as the
/// default ones are (`<queue>.dlq`), sorted.
pub(crate) fn dead_letter_queues(stats: &Stats) -> Vec<&str> {
    let mut out: Vec<&str> = stats.groups.iter().filter_map(|g| g.dead_letter_queue.as_deref()).collect();
    out.extend(stats.queues.iter().map(|q| q.name.as_str()).filter(|n| n.ends_with(".dlq")));
    out.sort_unstable();
    out.dedup();
    out
}

/// Queue `q` in `stats`, or a 404 naming it.
pub(crate) fn queue_in<'a>(stats: &'a Stats, q: &str) -> Result<&'a QueueStats, Failure> {
    stats
        .queues
        .iter()
        .find(|s| s.name == q)
        .ok_or_else(|| Failure::not_found(format!("queue {q:?} does not exist")))
}

/// Group `g` of queue `q` in `stats`, or a 404 naming it.
pub(crate) fn group_in<'a>(stats: &'a Stats, q: &str, g: &str) -> Result<&'a GroupStats, Failure> {
    stats
        .groups
        .iter()
        .find(|s| s.queue == q && s.group == g)
        .ok_or_else(|| Failure::not_found(format!("group {g:?} does not exist on queue {q:?}")))
}
