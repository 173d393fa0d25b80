//! What both engines' inspection shares: a claim record as `Broker::pending` shows it, and this
//! process's live leases laid over the records (a lease extended in memory is later than the
//! one its record holds). The embedded engine reads the records from RocksDB (`inspect.rs`),
//! the etcd engine from etcd (`etcd/inspect.rs`, `etcd/stats.rs`); both show them the same way.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Engine;
use crate::model::Claim;
use crate::stats::{PendingClaim, PendingState};

/// A live broker's in-memory leases, by group and queue: sequence → (attempt, deadline in
/// wall-clock µs). Empty for a read-only [`Inspector`](crate::Inspector).
pub(crate) type LiveLeases = HashMap<(String, String), HashMap<u64, (u32, u64)>>;

/// Wall-clock microseconds as a `SystemTime`.
pub(crate) fn micros_to_time(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

/// The lease deadline of claim `c` on `seq`: the live one if this process holds that very
/// attempt (it may have been extended since the record was written), else the record's.
pub(crate) fn deadline_of(
    live: Option<&HashMap<u64, (u32, u64)>>,
    seq: u64,
    attempt: u32,
    deadline_micros: u64,
) -> u64 {
    match live.and_then(|l| l.get(&seq)) {
        Some(&(live_attempt, deadline)) if live_attempt == attempt => deadline,
        _ => deadline_micros,
    }
}

/// A claim record as [`Broker::pending`](crate::Broker::pending) shows it (`None`: finished).
/// `live`: this process's leases of the group, whose extensions the record may not show yet.
pub(crate) fn pending_claim(
    seq: u64,
    claim: Claim,
    now_micros: u64,
    live: Option<&HashMap<u64, (u32, u64)>>,
) -> Option<PendingClaim> {
    Some(match claim {
        Claim::Done => return None,
        Claim::Leased { attempt, deadline_micros, holder, .. } => {
            let deadline = deadline_of(live, seq, attempt, deadline_micros);
            let state = if deadline > now_micros { PendingState::Leased } else { PendingState::Expired };
            PendingClaim {
                seq,
                state,
                attempt,
                holder: (!holder.is_empty()).then(|| holder.to_string()),
                lease_deadline: Some(micros_to_time(deadline)),
                retry_at: None,
                last_error: None,
            }
        }
        Claim::Waiting { attempt, not_before_micros, last_error, .. } => PendingClaim {
            seq,
            state: PendingState::Waiting,
            attempt,
            holder: None,
            lease_deadline: None,
            retry_at: Some(micros_to_time(not_before_micros)),
            last_error: (!last_error.is_empty()).then_some(last_error),
        },
    })
}

/// This process's live leases of every work group (or of `only`), in wall-clock µs.
///
/// Why an overlay rather than a write: [`Job::extend`](crate::Job::extend) and the pool's
/// heartbeat move only the in-memory deadline, which is what fencing checks. Persisting each
/// extension would put a write per heartbeat on the writer and either make `extend` wait (it is
/// synchronous) or make the record lag when the writer's queue is full; and a persisted
/// deadline is never used again anyway (after a restart every lease is void, see
/// `WorkGroupState::restore`). So the live broker reports the deadlines fencing enforces; a
/// read-only [`Inspector`](crate::Inspector) sees the claim-time deadlines on disk.
pub(crate) fn live_leases(engine: &Engine, only: Option<(&str, &str)>) -> LiveLeases {
    let clock = engine.clock();
    let mut out = LiveLeases::new();
    for entry in engine.registry.work.iter() {
        let g = entry.value();
        if only.is_some_and(|(group, queue)| *g.name != *group || *g.queue.name != *queue) {
            continue;
        }
        let leases = g.live_leases();
        if leases.is_empty() {
            continue;
        }
        let map =
            leases.into_iter().map(|(seq, attempt, t)| (seq, (attempt, clock.wall_micros_at(t)))).collect();
        out.insert((g.name.to_string(), g.queue.name.to_string()), map);
    }
    out
}
