//! Recurring schedules as values: [`Recurrence`] (a cron expression or a fixed interval, and what
//! to do about firings missed while the process was down) and [`ScheduleInfo`].

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;

/// How often a recurring schedule fires, and what happens to firings missed while the broker was
/// not running (or too busy to fire them on time).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rockq::{Missed, Recurrence};
///
/// let hourly = Recurrence::cron("0 0 * * * *")?; // sec min hour day-of-month month day-of-week
/// let every_5_min = Recurrence::cron("*/5 * * * *")?; // five fields: seconds are 0
/// let tick = Recurrence::every(Duration::from_secs(30)).on_missed(Missed::Skip);
/// # drop((hourly, every_5_min, tick));
/// # Ok::<(), rockq::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurrence {
    pub(crate) kind: RecurrenceKind,
    pub(crate) missed: Missed,
    pub(crate) grace: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecurrenceKind {
    /// A cron expression (normalised to six or seven fields), in UTC.
    Cron(String),
    /// A fixed interval from the schedule's creation.
    Every(Duration),
}

/// What a recurring schedule does with firings that were due while it could not fire (the
/// process was down, or the firing came more than its grace late).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Deliver one message for all the missed firings, then continue with the next firing after
    /// now (the default: a daily report after an outage is sent once, not skipped and not
    /// sent once per missed day).
    #[default]
    CatchUpOnce,
    /// Drop the missed firings: continue with the next firing after now.
    Skip,
}

impl Recurrence {
    /// A cron expression, evaluated in UTC. Six fields (`sec min hour day-of-month month
    /// day-of-week`) or seven (with a year); five fields are the classic form, firing at second 0.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCron`] if it does not parse or has no future firing.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::Recurrence;
    /// let nightly = Recurrence::cron("0 0 2 * * *")?; // 02:00:00 UTC every day
    /// let hourly = Recurrence::cron("15 * * * *")?; // five fields: minute 15 of every hour
    /// assert!(Recurrence::cron("not a cron").is_err());
    /// # Ok::<(), rockq::Error>(())
    /// ```
    pub fn cron(expr: &str) -> Result<Self, Error> {
        let fields = expr.split_whitespace().count();
        let normal = if fields == 5 { format!("0 {}", expr.trim()) } else { expr.trim().to_owned() };
        let bad = |reason: String| Error::InvalidCron { expr: expr.to_owned(), reason };
        let parsed = cron::Schedule::from_str(&normal).map_err(|e| bad(e.to_string()))?;
        if parsed.upcoming(chrono::Utc).next().is_none() {
            return Err(bad("it never fires again".into()));
        }
        Ok(Recurrence { kind: RecurrenceKind::Cron(normal), missed: Missed::default(), grace: DEFAULT_GRACE })
    }

    /// Every `interval`, the first firing one interval after the schedule is created.
    /// Intervals are kept in whole microseconds (the stored resolution; the rest is dropped)
    /// and clamped to 100 years.
    ///
    /// # Errors
    ///
    /// None here; an interval under one microsecond (zero at the stored resolution) is refused
    /// by [`Broker::schedule`](crate::Broker::schedule) with [`Error::ZeroInterval`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// use rockq::Recurrence;
    /// broker.schedule("heartbeat", Recurrence::every(Duration::from_secs(30)), "pings", "ping").await?;
    /// # Ok(()) }
    /// ```
    pub fn every(interval: Duration) -> Self {
        Recurrence {
            kind: RecurrenceKind::Every(whole_micros(crate::clock::clamp_delay(interval))),
            missed: Missed::default(),
            grace: DEFAULT_GRACE,
        }
    }

    /// What to do with missed firings (default [`Missed::CatchUpOnce`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use rockq::{Missed, Recurrence};
    /// // A ping is worthless late: drop the firings missed while the broker was down.
    /// let pings = Recurrence::every(Duration::from_secs(30)).on_missed(Missed::Skip);
    /// # drop(pings);
    /// ```
    pub fn on_missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// How late a firing may come and still count as on time (default 60 s). A firing later than
    /// this is *missed* and follows [`on_missed`](Recurrence::on_missed).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use rockq::Recurrence;
    /// let report = Recurrence::cron("0 0 2 * * *")?.grace(Duration::from_secs(15 * 60));
    /// # drop(report);
    /// # Ok::<(), rockq::Error>(())
    /// ```
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = crate::clock::clamp_delay(grace);
        self
    }

    /// The first firing strictly after `after_micros` (µs since the Unix epoch); `None` if
    /// there is none (a cron expression whose last year has passed).
    pub(crate) fn next_after(&self, after_micros: u64, anchor_micros: u64) -> Option<u64> {
        match &self.kind {
            RecurrenceKind::Every(d) => {
                let step = d.as_micros().min(u128::from(u64::MAX)) as u64;
                if step == 0 {
                    return None;
                }
                // Firings are anchor + k·step; the first one after `after_micros`.
                let k = after_micros.saturating_sub(anchor_micros) / step + 1;
                Some(anchor_micros.saturating_add(k.saturating_mul(step)))
            }
            RecurrenceKind::Cron(expr) => {
                let parsed = cron::Schedule::from_str(expr).ok()?;
                let next = parsed.after(&to_datetime(after_micros)?).next()?;
                u64::try_from(next.timestamp_micros()).ok()
            }
        }
    }

    /// How many firings fall in `(after, through]` (counting at most `cap`), and the last of
    /// those counted (`after` if none).
    pub(crate) fn firings_between(
        &self,
        after: u64,
        through: u64,
        anchor_micros: u64,
        cap: u64,
    ) -> (u64, u64) {
        if through <= after {
            return (0, after);
        }
        match &self.kind {
            RecurrenceKind::Every(d) => {
                let step = (d.as_micros().min(u128::from(u64::MAX)) as u64).max(1);
                let k = |t: u64| t.saturating_sub(anchor_micros) / step;
                let n = k(through) - k(after);
                let last = if n == 0 {
                    after
                } else {
                    anchor_micros.saturating_add(k(through).saturating_mul(step))
                };
                (n.min(cap), last)
            }
            RecurrenceKind::Cron(expr) => {
                let Ok(parsed) = cron::Schedule::from_str(expr) else { return (0, after) };
                let Some(start) = to_datetime(after) else { return (0, after) };
                let (mut n, mut last) = (0, after);
                for t in parsed.after(&start) {
                    let Ok(t) = u64::try_from(t.timestamp_micros()) else { break };
                    if n >= cap || t > through {
                        break;
                    }
                    n += 1;
                    last = t;
                }
                (n, last)
            }
        }
    }

    /// The firings in `[from, through]`, at most `cap` of them, in order.
    pub(crate) fn firings_from(&self, from: u64, through: u64, anchor_micros: u64, cap: usize) -> Vec<u64> {
        let mut out = Vec::new();
        if from > through || cap == 0 {
            return out;
        }
        match &self.kind {
            RecurrenceKind::Every(_) => {
                // `next_after` is O(1) here: anchor + k·step.
                let mut t = from.checked_sub(1).and_then(|f| self.next_after(f, anchor_micros));
                while let Some(at) = t.filter(|&at| at <= through && out.len() < cap) {
                    out.push(at);
                    t = self.next_after(at, anchor_micros);
                }
            }
            RecurrenceKind::Cron(expr) => {
                let Ok(parsed) = cron::Schedule::from_str(expr) else { return out };
                let Some(start) = from.checked_sub(1).and_then(to_datetime) else { return out };
                for t in parsed.after(&start) {
                    let Ok(t) = u64::try_from(t.timestamp_micros()) else { break };
                    if t > through || out.len() >= cap {
                        break;
                    }
                    out.push(t);
                }
            }
        }
        out
    }

    /// The cron expression, if this is one.
    pub(crate) fn cron_expr(&self) -> Option<&str> {
        match &self.kind {
            RecurrenceKind::Cron(e) => Some(e),
            RecurrenceKind::Every(_) => None,
        }
    }

    /// The fixed interval, if this is one.
    pub(crate) fn interval(&self) -> Option<Duration> {
        match &self.kind {
            RecurrenceKind::Every(d) => Some(*d),
            RecurrenceKind::Cron(_) => None,
        }
    }

    /// The expression as shown in listings (`cron: …` or `every …`).
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            RecurrenceKind::Cron(e) => format!("cron {e}"),
            RecurrenceKind::Every(d) => format!("every {d:?}"),
        }
    }
}

fn to_datetime(micros: u64) -> Option<chrono::DateTime<chrono::Utc>> {
    let secs = i64::try_from(micros / 1_000_000).ok()?;
    chrono::DateTime::from_timestamp(secs, ((micros % 1_000_000) * 1000) as u32)
}

impl From<Duration> for Recurrence {
    fn from(interval: Duration) -> Self {
        Recurrence::every(interval)
    }
}

/// `d` truncated to whole microseconds, as it is stored (an interval of 999 ns is zero).
fn whole_micros(d: Duration) -> Duration {
    Duration::from_micros(d.as_micros().min(u128::from(u64::MAX)) as u64)
}

/// How late a firing may be and still count as on time, unless set.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// A recurring schedule, as listed by [`Broker::schedules`](crate::Broker::schedules).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The queue it sends to.
    pub queue: String,
    /// Its recurrence as text (`cron …` or `every …`).
    pub recurrence: String,
    /// Its cron expression, as normalised (six or seven fields), if it is one.
    pub cron: Option<String>,
    /// Its interval, if it is a fixed one (kept in whole microseconds).
    pub interval: Option<Duration>,
    /// How late a firing may come and still count as on time ([`Recurrence::grace`]).
    pub grace: Duration,
    /// What it does with missed firings.
    pub missed: Missed,
    /// When it fires next (`None` while paused, or if it never fires again).
    pub next: Option<SystemTime>,
    /// Whether it is paused.
    pub paused: bool,
    /// Messages it has delivered.
    pub fired: u64,
    /// Firings it dropped as missed ([`Missed::Skip`]) or folded into one catch-up.
    pub missed_firings: u64,
    /// When it last delivered, and the sequence of that message.
    pub last: Option<(SystemTime, u64)>,
}

/// A delayed message as listed by [`Broker::delayed`](crate::Broker::delayed).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelayedInfo {
    /// Its schedule id.
    pub id: u64,
    /// The queue it will be appended to.
    pub queue: String,
    /// When it is due.
    pub due: SystemTime,
    /// When it was sent.
    pub sent_at: SystemTime,
    /// Its payload size in bytes.
    pub payload_len: usize,
    /// Its ordering key, if any.
    pub key: Option<String>,
}

/// The old name of [`DelayedInfo`], one letter from the recurring [`ScheduleInfo`].
#[deprecated(since = "0.2.0", note = "renamed `DelayedInfo`")]
pub type ScheduledInfo = DelayedInfo;

/// What one due entry of a recurring schedule fires: how many firings are late (more than the
/// grace), how many are on time (each gets its own message), and where the schedule continues.
pub(crate) struct FiringPlan {
    pub late: u64,
    pub on_time: usize,
    /// The next firing to arm: after now, or the first on-time firing left for the next round.
    pub next: Option<u64>,
}

impl FiringPlan {
    /// The messages to send, each with how many late firings it stands for beyond its own (one
    /// catch-up for the late firings if the policy says so, then one per on-time firing), and
    /// how many late firings are skipped.
    pub(crate) fn sends(&self, policy: Missed) -> (Vec<u64>, u64) {
        let mut sends = Vec::with_capacity(self.on_time + 1);
        let mut skipped = 0;
        if self.late > 0 {
            match policy {
                Missed::CatchUpOnce => sends.push(self.late - 1),
                Missed::Skip => skipped = self.late,
            }
        }
        sends.extend(std::iter::repeat_n(0, self.on_time));
        (sends, skipped)
    }
}

/// Messages one round sends for one schedule's on-time firings. A 1 ms schedule after a 60 s
/// stall has 60,000 on-time firings: the rest fire in later rounds, so one schedule cannot fill
/// the writer's batch (nor hold it for long).
pub(crate) const ON_TIME_PER_ROUND: usize = 256;

/// Cap on late firings counted one by one (a cron expression is walked firing by firing): a
/// per-second cron after weeks down would otherwise walk millions of firings on the writer
/// thread. Past it, the missed count says "at least".
const LATE_COUNT_CAP: u64 = 10_000;

/// Splits the firings due by `now`, the first at `first`, into late ones (due more than `grace`
/// before `now`) and on-time ones, at most `per_round` of those (the rest are left for the next
/// round: `next` is the first of them).
pub(crate) fn plan_firings(
    rec: &Recurrence,
    first: u64,
    now: u64,
    grace: u64,
    anchor: u64,
    per_round: usize,
) -> FiringPlan {
    // Late means now − t > grace, that is t < now − grace.
    let cut = now.saturating_sub(grace);
    let late =
        if first < cut { 1 + rec.firings_between(first, cut - 1, anchor, LATE_COUNT_CAP - 1).0 } else { 0 };
    let on_time_from = if first >= cut { first } else { cut };
    let on_time = rec.firings_from(on_time_from, now, anchor, per_round + 1);
    let (next, on_time) = match on_time.get(per_round) {
        Some(&left) => (Some(left), per_round),
        None => (rec.next_after(now, anchor), on_time.len()),
    };
    FiringPlan { late, on_time, next }
}

pub(crate) fn time_of(micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros)
}
