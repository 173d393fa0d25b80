//! A worker pool's adaptive prefetch: how many jobs it claims ahead of its handlers when the
//! application did not fix the number with [`Workers::prefetch`](crate::Workers::prefetch).
//!
//! Why adapt: every claim is a writer round trip and a read, a fixed cost that a batch of
//! claimed jobs shares, and the jobs a pool may hold bound the batch. With handlers that take
//! a millisecond, `concurrency` jobs ahead keep every handler fed; with handlers that take a
//! microsecond, the pool spends its time claiming (an 8-worker pool drained ~300k jobs/s
//! with 64 ahead and ~550k/s with 1024). A fixed large number would make slow handlers' jobs
//! wait, leased, in the pool.
//!
//! The rule: hold about [`AHEAD`] of work ahead, measured by the pool's own completion rate —
//! `rate × AHEAD` jobs — between `concurrency` and [`MAX_AUTO_PREFETCH`]. A prefetched job so
//! waits about `AHEAD`; its lease is renewed when a handler starts it if more than a hundredth
//! of it ran meanwhile (`workers.rs`, `refresh_lease`).
//!
//! Or [`CLAIMS_AHEAD`] times a claim's own time, if that is longer (up to [`MAX_AHEAD`]): work
//! ahead for less than a claim takes runs out before the next claim is answered, and then the
//! rate that sets the prefetch is the claim's, not the handlers' — a fixed point far below what
//! the handlers and the storage can do. On etcd a claim waits for the writer's round of
//! transactions (milliseconds): with 2 ms ahead an 8-worker pool held ~8 jobs and drained ~2k
//! jobs/s, with 256 ahead ~15k. More than once, so that from any start the prefetch grows until
//! the claims, larger each time, take as long as the work they bring; four times, so that the
//! batches of two processes on one backlog are large enough to collide rarely. The pool's
//! subscription is opened with room for the maximum, and the permits above the current
//! prefetch are held back here, so growing and shrinking never reopen anything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most jobs an adaptive pool claims ahead of its handlers.
pub(crate) const MAX_AUTO_PREFETCH: usize = 1024;

/// How much work (at the measured rate) an adaptive pool keeps claimed ahead.
const AHEAD: Duration = Duration::from_millis(2);

/// The most work ahead a slow claim makes the pool hold (a prefetched job's lease runs while
/// it waits).
const MAX_AHEAD: Duration = Duration::from_millis(100);

/// Claims' worth of work an adaptive pool holds ahead when a claim takes longer than [`AHEAD`]
/// (the etcd engine's: milliseconds). Two made the prefetch grow from any start; four makes the
/// batches large enough that two processes claiming one backlog rarely collide (etcd, one
/// member, two brokers × 8 workers: 12.6–14.5k jobs/s with two, 18.5–18.7k with four).
const CLAIMS_AHEAD: u32 = 4;

/// How often the rate is measured (real time: a throughput estimate, not a lease).
const WINDOW: Duration = Duration::from_millis(10);

pub(super) struct Adapt {
    /// Permits of the subscription held back: `MAX_AUTO_PREFETCH - prefetch` of them.
    reserve: Option<OwnedSemaphorePermit>,
    permits: Arc<Semaphore>,
    floor: usize,
    max: usize,
    prefetch: usize,
    since: Instant,
    completed_then: u64,
}

impl Adapt {
    /// Starts at `floor` jobs ahead, holding back the rest of the subscription's `permits`
    /// (opened with room for `max` ahead, all free).
    pub fn new(permits: Arc<Semaphore>, floor: usize, max: usize) -> Self {
        let floor = floor.min(max);
        let held = u32::try_from(max - floor).unwrap_or(u32::MAX);
        let reserve = match held {
            0 => None,
            n => permits.clone().try_acquire_many_owned(n).ok(),
        };
        Adapt { reserve, permits, floor, max, prefetch: floor, since: Instant::now(), completed_then: 0 }
    }

    /// Looks at the completions so far at `now`, with claims taking `claim` each; returns the
    /// new prefetch if it changed.
    pub fn tick(&mut self, completed: u64, now: Instant, claim: Duration) -> Option<usize> {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < WINDOW {
            return None;
        }
        let rate = completed.saturating_sub(self.completed_then) as f64 / elapsed.as_secs_f64();
        self.since = now;
        self.completed_then = completed;
        let ahead = claim.saturating_mul(CLAIMS_AHEAD).clamp(AHEAD, MAX_AHEAD);
        let wanted = ((rate * ahead.as_secs_f64()) as usize).clamp(self.floor, self.max);
        // Grow at once; shrink by halves, so one slow window does not collapse the batch.
        let next = if wanted >= self.prefetch { wanted } else { wanted.max(self.prefetch / 2) };
        self.resize(next)
    }

    fn resize(&mut self, next: usize) -> Option<usize> {
        if next > self.prefetch {
            // Dropping the split-off permits returns them to the subscription.
            let given = self.reserve.as_mut().and_then(|r| r.split(next - self.prefetch))?;
            drop(given);
        } else if next < self.prefetch {
            // Only free permits can be taken back (jobs hold the rest): as many as are free
            // now, the rest at later ticks.
            let free = self.permits.available_permits().min(self.prefetch - next);
            let taken = u32::try_from(free).ok().filter(|&n| n > 0)?;
            let p = self.permits.clone().try_acquire_many_owned(taken).ok()?;
            match &mut self.reserve {
                Some(r) => r.merge(p),
                None => self.reserve = Some(p),
            }
            self.prefetch -= free;
            return Some(self.prefetch);
        } else {
            return None;
        }
        self.prefetch = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `floor` ahead with room for `max`: (adapt, permits, start).
    fn pool(floor: usize, max: usize) -> (Adapt, Arc<Semaphore>, Instant) {
        let permits = Arc::new(Semaphore::new(max));
        let a = Adapt::new(permits.clone(), floor, max);
        let start = a.since;
        (a, permits, start)
    }

    #[test]
    fn it_starts_at_the_floor_with_the_rest_held_back() {
        let (_a, permits, _) = pool(8, 1024);
        assert_eq!(permits.available_permits(), 8);
    }

    #[test]
    fn fast_handlers_grow_the_prefetch_to_two_milliseconds_of_work_capped_at_the_max() {
        let (mut a, permits, t0) = pool(8, 1024);
        // 100k jobs/s: 200 jobs in 2 ms.
        assert_eq!(a.tick(2_000, t0 + Duration::from_millis(20), Duration::ZERO), Some(200));
        assert_eq!(permits.available_permits(), 200);
        // 10M jobs/s: capped.
        assert_eq!(a.tick(2_000 + 200_000, t0 + Duration::from_millis(40), Duration::ZERO), Some(1024));
        assert_eq!(permits.available_permits(), 1024);
    }

    #[test]
    fn slow_claims_make_it_hold_four_claims_time_of_work_up_to_a_tenth_of_a_second() {
        let (mut a, permits, t0) = pool(8, 1024);
        let mut t = t0 + Duration::from_millis(20);
        // 4k jobs/s: 2 ms of work is 8 jobs, the floor; claims take 5 ms, so 20 ms: 80.
        assert_eq!(a.tick(80, t, Duration::from_millis(5)), Some(80));
        assert_eq!(permits.available_permits(), 80);
        // From that start the rate grows with the batch, and the prefetch with it.
        t += Duration::from_millis(20);
        assert_eq!(a.tick(80 + 400, t, Duration::from_millis(5)), Some(400));
        // Claims of a second: at most 100 ms of work ahead (3k jobs/s: 300, not 6,000).
        t += Duration::from_millis(20);
        assert_eq!(a.tick(480 + 60, t, Duration::from_secs(1)), Some(300), "3k/s × 100 ms");
        assert_eq!(permits.available_permits(), 300);
        // Fast claims again: 2 ms of work (the floor), reached by halves.
        t += Duration::from_millis(20);
        assert_eq!(a.tick(540 + 60, t, Duration::ZERO), Some(150));
    }

    #[test]
    fn a_window_shorter_than_ten_milliseconds_changes_nothing() {
        let (mut a, permits, t0) = pool(8, 1024);
        assert_eq!(a.tick(1_000_000, t0 + Duration::from_millis(5), Duration::ZERO), None);
        assert_eq!(permits.available_permits(), 8);
    }

    #[test]
    fn slow_or_stuck_handlers_shrink_it_by_halves_down_to_the_floor() {
        let (mut a, permits, t0) = pool(8, 1024);
        let mut t = t0 + Duration::from_millis(20);
        assert_eq!(a.tick(1_000_000, t, Duration::ZERO), Some(1024));
        for want in [512, 256, 128, 64, 32, 16, 8] {
            t += Duration::from_millis(20);
            // Nothing finished in this window.
            assert_eq!(a.tick(1_000_000, t, Duration::ZERO), Some(want));
            assert_eq!(permits.available_permits(), want);
        }
        t += Duration::from_millis(20);
        assert_eq!(a.tick(1_000_000, t, Duration::ZERO), None, "never below the floor");
    }

    #[test]
    fn it_shrinks_only_by_the_permits_no_job_holds() {
        let (mut a, permits, t0) = pool(8, 1024);
        assert_eq!(a.tick(1_000_000, t0 + Duration::from_millis(20), Duration::ZERO), Some(1024));
        // Jobs hold all but 100 of the 1024 permits: of the 512 to take back, 100 now.
        let held = permits.clone().try_acquire_many_owned(924).unwrap();
        assert_eq!(a.tick(1_000_000, t0 + Duration::from_millis(40), Duration::ZERO), Some(924));
        assert_eq!(permits.available_permits(), 0);
        drop(held);
        // Still slow: half of 924, all of it free now.
        assert_eq!(a.tick(1_000_000, t0 + Duration::from_millis(60), Duration::ZERO), Some(462));
        assert_eq!(permits.available_permits(), 462);
    }
}
