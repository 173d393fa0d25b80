//! [`Clock`]: the time source for leases, retry backoff and other delays.
//!
//! Production uses Tokio's clock (so `tokio::time::pause()` works too). Tests that must control
//! time exactly use a [`ManualClock`]: time moves only when the test calls
//! [`ManualClock::advance`], never because the runtime happened to be idle while a RocksDB
//! write ran on another thread (which is what Tokio's auto-advance would do).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// The longest delay rockq acts on: 100 years. Every duration a caller passes (a lease, a
/// retry delay, a lease extension, a backoff, an interval, a timeout) is clamped to it, so that
/// `Duration::MAX` means "effectively never" instead of overflowing `Instant` arithmetic (which
/// panics). A delay this long never fires in practice; clamping keeps the input's meaning.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How far a [`ManualClock`] may be advanced in total: far enough for any test, and with
/// [`MAX_DELAY`] added on top still within every platform's `Instant` and `SystemTime`.
const MAX_MANUAL_OFFSET: Duration = Duration::from_secs(1000 * 365 * 24 * 3600);

/// `d`, clamped to [`MAX_DELAY`].
pub(crate) fn clamp_delay(d: Duration) -> Duration {
    d.min(MAX_DELAY)
}

/// Where rockq reads the time for leases, backoff and delays. Chosen at open with
/// [`Options::clock`](crate::Options::clock); the default is Tokio's clock.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<ManualClock>,
}

/// A clock that moves only when told to: for deterministic tests of leases and backoff.
///
/// Wall-clock timestamps written to disk (lease deadlines, retry times) are the real time at
/// creation plus the manual offset.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let clock = rockq::ManualClock::new();
/// let options = rockq::Options::new().clock(clock.clone());
/// clock.advance(Duration::from_secs(30)); // every lease of 30 s or less has now expired
/// # drop(options);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    base: Instant,
    wall_base: SystemTime,
    offset: watch::Sender<Duration>,
}

impl ManualClock {
    /// A manual clock standing at the current time.
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = rockq::ManualClock::new();
    /// assert_eq!(clock.elapsed(), std::time::Duration::ZERO);
    /// ```
    pub fn new() -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                base: Instant::now(),
                wall_base: SystemTime::now(),
                offset: watch::Sender::new(Duration::ZERO),
            }),
        }
    }

    /// Moves the clock forward by `d`, firing every lease expiry and retry that falls due.
    /// `d` is clamped to 100 years (rockq's longest delay), and the clock stops 1,000 years
    /// after its start, so that no amount of advancing overflows `Instant` or `SystemTime`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = rockq::ManualClock::new();
    /// let before = clock.wall_time();
    /// clock.advance(Duration::from_secs(90));
    /// assert_eq!(clock.wall_time().duration_since(before).unwrap(), Duration::from_secs(90));
    /// ```
    pub fn advance(&self, d: Duration) {
        self.inner.offset.send_modify(|o| *o = o.saturating_add(clamp_delay(d)).min(MAX_MANUAL_OFFSET));
    }

    /// The wall-clock time this clock stands at (what the writer stamps messages with).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = rockq::ManualClock::new();
    /// let start = clock.wall_time();
    /// clock.advance(Duration::from_secs(1));
    /// assert!(clock.wall_time() > start);
    /// ```
    pub fn wall_time(&self) -> SystemTime {
        self.inner.wall_base + *self.inner.offset.borrow()
    }

    /// Time advanced so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let clock = rockq::ManualClock::new();
    /// clock.advance(Duration::from_secs(5));
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(clock.elapsed(), Duration::from_secs(10));
    /// ```
    pub fn elapsed(&self) -> Duration {
        *self.inner.offset.borrow()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl From<ManualClock> for Clock {
    fn from(m: ManualClock) -> Self {
        Clock { manual: Some(m) }
    }
}

impl Clock {
    /// Tokio's clock (the default).
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new().clock(rockq::Clock::tokio());
    /// # drop(options);
    /// ```
    pub fn tokio() -> Self {
        Clock { manual: None }
    }

    pub(crate) fn now(&self) -> Instant {
        match &self.manual {
            Some(m) => m.inner.base + *m.inner.offset.borrow(),
            None => tokio::time::Instant::now().into_std(),
        }
    }

    /// The instant `d` from now, with `d` clamped to [`MAX_DELAY`] (never panics on overflow).
    pub(crate) fn after(&self, d: Duration) -> Instant {
        let now = self.now();
        // 100 years fits every platform's `Instant`; the fallback only guards exotic ones.
        now.checked_add(clamp_delay(d))
            .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(now)
    }

    /// Wall-clock microseconds since the Unix epoch, for records written to disk.
    pub(crate) fn wall_micros(&self) -> u64 {
        let wall = match &self.manual {
            Some(m) => m.inner.wall_base + *m.inner.offset.borrow(),
            None => SystemTime::now(),
        };
        wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
    }

    /// The wall-clock time (µs) corresponding to `t` on this clock.
    pub(crate) fn wall_micros_at(&self, t: Instant) -> u64 {
        // A manual clock maps instants to wall times exactly, with no reading of the clock: two
        // readings (`now`, then `wall_micros`) could straddle an `advance` and be off by it.
        if let Some(m) = &self.manual {
            let wall_base = micros_since_epoch(m.inner.wall_base);
            return match t.checked_duration_since(m.inner.base) {
                Some(d) => wall_base.saturating_add(d.as_micros().min(u128::from(u64::MAX)) as u64),
                None => wall_base.saturating_sub(m.inner.base.duration_since(t).as_micros() as u64),
            };
        }
        let now = self.now();
        let wall = self.wall_micros();
        if t >= now {
            wall.saturating_add(t.duration_since(now).as_micros() as u64)
        } else {
            wall.saturating_sub(now.duration_since(t).as_micros() as u64)
        }
    }

    /// The instant on this clock corresponding to wall-clock `micros` (used to resume persisted
    /// retry times after a restart; past times map to now).
    pub(crate) fn instant_at_wall(&self, micros: u64) -> Instant {
        // Regression: computed from two readings of a manual clock (`wall_micros`, then `now`
        // inside `after`), an `advance` between them made the instant late by the whole advance:
        // the schedule's timer then slept past a due message until the next advance (the job
        // model test hung on a tick, rarely). A manual clock maps wall times exactly instead.
        if let Some(m) = &self.manual {
            let ahead = micros.saturating_sub(micros_since_epoch(m.inner.wall_base));
            let at =
                m.inner.base.checked_add(Duration::from_micros(ahead).min(MAX_MANUAL_OFFSET + MAX_DELAY));
            return at.unwrap_or(m.inner.base).max(self.now());
        }
        let wall = self.wall_micros();
        self.after(Duration::from_micros(micros.saturating_sub(wall)))
    }

    /// Waits until the clock reaches `deadline`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        match &self.manual {
            None => tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await,
            Some(m) => {
                let mut rx = m.inner.offset.subscribe();
                loop {
                    if m.inner.base + *rx.borrow_and_update() >= deadline {
                        return;
                    }
                    if rx.changed().await.is_err() {
                        // The clock is gone (cannot happen while we hold it); never fire.
                        return futures::future::pending().await;
                    }
                }
            }
        }
    }
}

/// Microseconds from the Unix epoch to `t` (0 before it).
fn micros_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_maps_wall_times_and_instants_exactly_both_ways() {
        let manual = ManualClock::new();
        let clock = Clock::from(manual.clone());
        manual.advance(Duration::from_secs(7));
        let (now, wall) = (clock.now(), clock.wall_micros());
        let due = wall + 5_000_000;
        assert_eq!(clock.instant_at_wall(due), now + Duration::from_secs(5));
        assert_eq!(clock.wall_micros_at(now + Duration::from_secs(3)), wall + 3_000_000);
        assert_eq!(clock.wall_micros_at(now - Duration::from_secs(2)), wall - 2_000_000);
        // The mapping does not depend on when it is computed: advancing in between (what a
        // concurrent `advance` does between two readings) changes nothing.
        let at = clock.instant_at_wall(due);
        manual.advance(Duration::from_secs(1));
        assert_eq!(clock.instant_at_wall(due), at);
        // Past wall times map to now.
        assert_eq!(clock.instant_at_wall(wall - 1), clock.now());
    }
}
