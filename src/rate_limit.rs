//! [`RateLimit`]: how many jobs a work group may start per interval, across its every pool and
//! across restarts.
//!
//! The limiter is a token bucket in its GCRA form (the "generic cell rate algorithm" of ATM
//! networks, as redis-cell and many API gateways use it): one timestamp, the *theoretical
//! arrival time* `tat` of the next claim if claims came exactly at the rate. A claim at `now`
//! conforms if `now ≥ tat − (burst − 1)·interval`, and moves `tat` to `max(tat, now) +
//! interval`. One number is the whole state, which is what makes it cheap to persist with the
//! claims it admitted (see `engine/registry/work.rs`).

use std::time::{Duration, Instant};

/// A work group's rate limit: at most `jobs` claims per `per`, evenly spread, with an optional
/// burst. Stored with the group ([`WorkGroup::rate_limit`](crate::WorkGroup::rate_limit)), so
/// every pool and subscription of the group, and every restart, shares one budget.
///
/// The guarantee, exactly: in **any** window of length `per`, at most `jobs + burst − 1`
/// claims start — with the default burst of 1, at most `jobs`. A restart does not refill the
/// bucket: its state is written with the claims it admitted, and read back at open. Claims are
/// counted, not completions: a job that fails and is retried takes another token for its next
/// attempt; a job moved to the dead-letter queue without running (its attempts used up by
/// expired leases) takes none.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let limit = rockq::RateLimit::per_second(10);
/// assert_eq!((limit.jobs(), limit.per(), limit.burst_size()), (10, Duration::from_secs(1), 1));
/// // 100 calls a minute, up to 20 of them at once after a quiet spell.
/// let limit = rockq::RateLimit::new(100, Duration::from_secs(60)).burst(20);
/// assert_eq!(limit.interval(), Duration::from_millis(600));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    pub(crate) jobs: u32,
    pub(crate) per: Duration,
    pub(crate) burst: u32,
}

impl RateLimit {
    /// At most `jobs` claims in any window of length `per`, one every `per / jobs`.
    /// A `jobs` of 0 or a `per` under a millisecond is refused when the group stores it
    /// ([`Error::InvalidOption`](crate::Error::InvalidOption)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let limit = rockq::RateLimit::new(3, Duration::from_secs(1));
    /// assert_eq!(limit.interval(), Duration::from_nanos(333_333_334)); // rounded up: never 4 in a second
    /// ```
    pub fn new(jobs: u32, per: Duration) -> Self {
        RateLimit { jobs, per, burst: 1 }
    }

    /// At most `jobs` claims in any second.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RateLimit::per_second(5).per(), std::time::Duration::from_secs(1));
    /// ```
    pub fn per_second(jobs: u32) -> Self {
        Self::new(jobs, Duration::from_secs(1))
    }

    /// At most `jobs` claims in any minute.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RateLimit::per_minute(600).interval(), std::time::Duration::from_millis(100));
    /// ```
    pub fn per_minute(jobs: u32) -> Self {
        Self::new(jobs, Duration::from_secs(60))
    }

    /// Lets up to `n` claims start at once after a quiet spell (default 1: evenly spread).
    /// The price is the window guarantee: `jobs + n − 1` in any window of `per`. 0 is refused
    /// when the group stores it.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RateLimit::per_second(10).burst(10).burst_size(), 10);
    /// ```
    pub fn burst(self, n: u32) -> Self {
        RateLimit { burst: n, ..self }
    }

    /// Claims per [`per`](RateLimit::per).
    pub fn jobs(&self) -> u32 {
        self.jobs
    }

    /// The window the rate is counted over.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// Claims that may start at once ([`burst`](RateLimit::burst)).
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The time between two claims at the steady rate: `per / jobs`, rounded up to the next
    /// nanosecond (rounded down, `jobs` intervals could fit in a window one nanosecond short of
    /// `per`, and admit one claim more).
    pub fn interval(&self) -> Duration {
        let per = self.per.as_nanos();
        let jobs = u128::from(self.jobs.max(1));
        Duration::from_nanos(per.div_ceil(jobs).min(u128::from(u64::MAX)) as u64)
    }

    /// Why this limit cannot be stored, if it cannot.
    pub(crate) fn invalid(&self) -> Option<String> {
        if self.jobs == 0 {
            return Some("a rate limit of 0 jobs would claim nothing, ever (pause the group instead)".into());
        }
        if self.burst == 0 {
            return Some("a rate limit's burst must be at least 1".into());
        }
        if self.per < MIN_PER {
            return Some(format!("a rate limit's window {:?} is shorter than {MIN_PER:?}", self.per));
        }
        if self.per > crate::clock::clamp_delay(Duration::MAX) {
            return Some(format!("a rate limit's window {:?} is longer than 100 years", self.per));
        }
        None
    }
}

/// The shortest window a rate limit may have.
pub(crate) const MIN_PER: Duration = Duration::from_millis(1);

/// The bucket's state (see the module docs): `tat`, the theoretical arrival time of the next
/// claim, and `last`, when the last claim was taken (or the bucket was read back at open);
/// `None`: never claimed, a full burst available.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub tat: Option<Instant>,
    pub last: Option<Instant>,
}

impl Bucket {
    /// The state as `limit` can have left it: under one limit a claim at `c` leaves `tat` at
    /// most `c + burst · interval` (a full burst taken at `c`). Farther is a tighter limit's
    /// leftover (loosened by an update) or a clock stepped back, and would hold claims back
    /// for as long as that limit's window, even across restarts: it is cut to the bound. The
    /// bound is anchored at the last claim, not at the time of asking, so it does not move on
    /// with the clock.
    fn tat_of(&self, limit: &RateLimit) -> Option<Instant> {
        let most = self.last.and_then(|c| c.checked_add(limit.interval().saturating_mul(limit.burst.max(1))));
        self.tat.map(|t| most.map_or(t, |m| t.min(m)))
    }

    /// When the next claim conforms (`None`: at once).
    pub fn next_at(&self, limit: &RateLimit) -> Option<Instant> {
        let tolerance = limit.interval().saturating_mul(limit.burst.saturating_sub(1));
        self.tat_of(limit).map(|t| t.checked_sub(tolerance).unwrap_or(t))
    }

    /// Takes a token at `now` if one is there.
    pub fn try_take(&mut self, limit: &RateLimit, now: Instant) -> bool {
        if self.next_at(limit).is_some_and(|at| at > now) {
            return false;
        }
        let from = self.tat_of(limit).map_or(now, |t| t.max(now));
        self.tat = Some(from.checked_add(limit.interval()).unwrap_or(from));
        self.last = Some(now);
        true
    }

    /// Another process's claims left the shared bucket at `tat` (learned at `now`): the later
    /// of the two states stands (each claim moves `tat` forward from the latest it knew).
    pub fn learn(&mut self, tat: Instant, now: Instant) {
        if self.tat.is_none_or(|t| t < tat) {
            self.tat = Some(tat);
            self.last = Some(self.last.map_or(now, |l| l.max(now)));
        }
    }

    /// The state read back at open, at `now`: the time of the last claim is not stored, and
    /// `now` is after it, so the bound (`tat_of`) only loosens by the downtime.
    pub fn restored(tat: Instant, now: Instant) -> Self {
        Bucket { tat: Some(tat), last: Some(now) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_even_rate_admits_one_claim_per_interval_and_a_burst_that_many_at_once() {
        let t0 = Instant::now();
        let limit = RateLimit::new(4, Duration::from_secs(1));
        let mut b = Bucket::default();
        assert!(b.try_take(&limit, t0));
        assert!(!b.try_take(&limit, t0));
        assert_eq!(b.next_at(&limit), Some(t0 + Duration::from_millis(250)));
        assert!(b.try_take(&limit, t0 + Duration::from_millis(250)));
        let burst = limit.burst(3);
        let mut b = Bucket::default();
        let admitted = (0..10).filter(|_| b.try_take(&burst, t0)).count();
        assert_eq!(admitted, 3);
    }

    #[test]
    fn a_tighter_limit_s_leftover_is_cut_to_what_the_new_limit_could_have_left() {
        let t0 = Instant::now();
        let day = RateLimit::new(1, Duration::from_secs(86_400));
        let mut b = Bucket::default();
        assert!(b.try_take(&day, t0));
        assert!(!b.try_take(&day, t0 + Duration::from_secs(3600)), "a day's limit holds for a day");
        // Loosened to 10 a second: the next claim waits one new interval at most, not a day.
        let fast = RateLimit::per_second(10);
        assert_eq!(b.next_at(&fast), Some(t0 + Duration::from_millis(100)));
        assert!(!b.try_take(&fast, t0 + Duration::from_millis(99)));
        assert!(b.try_take(&fast, t0 + Duration::from_millis(100)));
    }

    proptest! {
        /// The documented guarantee: whatever the claim attempts' times, any window of length
        /// `per` holds at most `jobs + burst - 1` admitted claims.
        #[test]
        fn no_window_of_per_holds_more_than_jobs_plus_burst_minus_one(
            jobs in 1u32..20,
            per_ms in 1u64..2_000,
            burst in 1u32..5,
            gaps in proptest::collection::vec(0u64..400, 1..300),
        ) {
            let limit = RateLimit::new(jobs, Duration::from_millis(per_ms)).burst(burst);
            let t0 = Instant::now();
            let mut b = Bucket::default();
            let mut at = t0;
            let mut admitted = Vec::new();
            for g in gaps {
                at += Duration::from_micros(g * 97);
                if b.try_take(&limit, at) {
                    admitted.push(at);
                }
            }
            let max = (jobs + burst - 1) as usize;
            for (i, &start) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().take_while(|&&t| t < start + limit.per()).count();
                prop_assert!(within <= max, "{within} claims in a window of {:?} (max {max})", limit.per());
            }
        }
    }
}
