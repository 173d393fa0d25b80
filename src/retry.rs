//! [`RetryPolicy`]: how often and how late a failed message is tried again.

use std::time::Duration;

/// Retry policy of a work-queue group: at most `max_attempts` deliveries, with exponential
/// backoff and jitter between them. It is stored with the group (see
/// [`WorkGroup::retry_policy`](crate::WorkGroup::retry_policy)). After the last attempt fails (or its lease expires, or the
/// process crashes during it) the message goes to the dead-letter queue.
///
/// The delay before attempt `n + 1` is `min(max_backoff, initial_backoff · multiplier^(n-1))`,
/// then reduced by a random fraction of up to `jitter` (0 = none, 1 = "full jitter"), so that
/// messages that failed together do not all come back together.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let policy = rockq::RetryPolicy::default()
///     .max_attempts(3)
///     .backoff(Duration::from_millis(100), Duration::from_secs(10))
///     .jitter(0.0);
/// assert_eq!(policy.delay_after(1), Duration::from_millis(100));
/// assert_eq!(policy.delay_after(2), Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) multiplier: f64,
    pub(crate) jitter: f64,
}

// Its two floats are never NaN: the builder maps non-finite input to a finite value and the
// stored record's decoder refuses one, so `==` is reflexive and `Eq` holds (which lets
// `GroupStats` carry a policy and stay `Eq`).
impl Eq for RetryPolicy {}

impl Default for RetryPolicy {
    /// 5 attempts, backoff from 1 s doubling up to 5 min, 20 % jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// Most deliveries of one message, counting the first. At least 1. Default 5.
    ///
    /// # Examples
    ///
    /// ```
    /// let policy = rockq::RetryPolicy::default().max_attempts(3);
    /// assert_eq!(policy.attempts(), 3);
    /// assert_eq!(rockq::RetryPolicy::default().max_attempts(0).attempts(), 1);
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// First delay and the cap. Default 1 s and 5 min. Each is clamped to 100 years (so
    /// `Duration::MAX` means "effectively never"), and the cap is at least the first delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = rockq::RetryPolicy::default().backoff(Duration::from_millis(100), Duration::from_secs(10));
    /// assert_eq!(policy.initial_delay(), Duration::from_millis(100));
    /// assert_eq!(policy.max_delay(), Duration::from_secs(10));
    /// ```
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = crate::clock::clamp_delay(initial);
        self.max_backoff = crate::clock::clamp_delay(max).max(self.initial_backoff);
        self
    }

    /// Growth factor per attempt, at least 1. Default 2.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = rockq::RetryPolicy::default().backoff(Duration::from_secs(1), Duration::from_secs(60)).multiplier(3.0);
    /// assert_eq!(policy.delay_after(3), Duration::from_secs(9));
    /// ```
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = if m.is_finite() { m.max(1.0) } else { 1.0 };
        self
    }

    /// Fraction of each delay that is randomised away, in `0.0..=1.0`. Default 0.2.
    ///
    /// # Examples
    ///
    /// ```
    /// let exact = rockq::RetryPolicy::default().jitter(0.0);
    /// assert_eq!(exact.jitter_fraction(), 0.0);
    /// assert_eq!(rockq::RetryPolicy::default().jitter(7.0).jitter_fraction(), 1.0); // clamped
    /// ```
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = if j.is_finite() { j.clamp(0.0, 1.0) } else { 0.0 };
        self
    }

    /// The configured maximum number of attempts.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RetryPolicy::default().attempts(), 5);
    /// ```
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The first delay of the backoff.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(rockq::RetryPolicy::default().initial_delay(), Duration::from_secs(1));
    /// ```
    pub fn initial_delay(&self) -> Duration {
        self.initial_backoff
    }

    /// The cap of the backoff.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(rockq::RetryPolicy::default().max_delay(), Duration::from_secs(300));
    /// ```
    pub fn max_delay(&self) -> Duration {
        self.max_backoff
    }

    /// The growth factor per attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RetryPolicy::default().growth(), 2.0);
    /// assert_eq!(rockq::RetryPolicy::default().multiplier(0.5).growth(), 1.0); // at least 1
    /// ```
    pub fn growth(&self) -> f64 {
        self.multiplier
    }

    /// The fraction of each delay that is randomised away.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::RetryPolicy::default().jitter_fraction(), 0.2);
    /// ```
    pub fn jitter_fraction(&self) -> f64 {
        self.jitter
    }

    /// A policy with exactly these values, unchecked: the stored record's decoder builds it,
    /// then refuses it unless [`is_valid`](RetryPolicy::is_valid).
    pub(crate) fn from_parts(
        max_attempts: u32,
        initial_backoff: Duration,
        max_backoff: Duration,
        multiplier: f64,
        jitter: f64,
    ) -> Self {
        RetryPolicy { max_attempts, initial_backoff, max_backoff, multiplier, jitter }
    }

    /// Whether a policy read back from storage is one the builder can make: a record that
    /// breaks these bounds is corrupt, and would otherwise reach `Duration` and float
    /// arithmetic unchecked.
    pub(crate) fn is_valid(&self) -> bool {
        let max = crate::clock::clamp_delay(Duration::MAX);
        self.max_attempts >= 1
            && self.initial_backoff <= max
            && self.max_backoff <= max
            && self.max_backoff >= self.initial_backoff
            && self.multiplier.is_finite()
            && self.multiplier >= 1.0
            && self.jitter.is_finite()
            && (0.0..=1.0).contains(&self.jitter)
    }

    /// The delay after failed attempt `attempt` (1-based), before jitter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = rockq::RetryPolicy::default(); // 1 s, doubling, capped at 5 min
    /// assert_eq!(policy.delay_after(1), Duration::from_secs(1));
    /// assert_eq!(policy.delay_after(4), Duration::from_secs(8));
    /// assert_eq!(policy.delay_after(20), Duration::from_secs(300));
    /// ```
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let exp = self.multiplier.powi(attempt.saturating_sub(1).min(1000) as i32);
        let secs = self.initial_backoff.as_secs_f64() * exp;
        let max = self.max_backoff.as_secs_f64();
        // `max` is at most 100 years, so this converts; the fallback only guards a future
        // change of that bound (`from_secs_f64` panics on overflow).
        Duration::try_from_secs_f64(if secs.is_finite() { secs.min(max) } else { max })
            .unwrap_or(self.max_backoff)
    }

    /// The delay after failed attempt `attempt`, with jitter applied.
    pub(crate) fn jittered_delay(&self, attempt: u32) -> Duration {
        let d = self.delay_after(attempt);
        if self.jitter == 0.0 {
            return d;
        }
        d.mul_f64(1.0 - self.jitter * fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped_and_jitter_only_shortens() {
        let p = RetryPolicy::default().backoff(Duration::from_secs(1), Duration::from_secs(10)).jitter(0.5);
        assert_eq!(p.delay_after(1), Duration::from_secs(1));
        assert_eq!(p.delay_after(4), Duration::from_secs(8));
        assert_eq!(p.delay_after(5), Duration::from_secs(10));
        assert_eq!(p.delay_after(u32::MAX), Duration::from_secs(10));
        for _ in 0..100 {
            let j = p.jittered_delay(3);
            assert!(j <= Duration::from_secs(4) && j >= Duration::from_secs(2), "{j:?}");
        }
        assert_eq!(RetryPolicy::default().max_attempts(0).attempts(), 1);
    }
}
