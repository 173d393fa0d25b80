//! Retention on etcd: a pass reads every queue's policy and every group's offset from the
//! namespace (not from this process's memory: other processes change them), computes each
//! queue's cut as the embedded pass does, and trims each queue in one transaction that
//! compares what the cut was computed from (`store/etcd/retention.rs`). Any process may run a
//! pass; two racing passes trim once (the second finds the queue record changed). Every process
//! learns the new first sequence through its watch (`watch.rs`).
//!
//! etcd keeps the history of deleted keys until it is compacted: a pass that compacts compacts
//! to the revision the namespace had [`COMPACT_WINDOW`](super::side::COMPACT_WINDOW) earlier (as this process's passes saw
//! it), so watches and in-doubt appends of the last minutes can still read it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::side::{EtcdSide, retrying};
use crate::engine::Engine;
use crate::error::Error;
use crate::events::Event;
use crate::model::{GroupMode, QueueMeta};
use crate::retention::{Retention, TrimReport};
use crate::store::etcd::retention::{GROUPS_PER_MOVE, TrimGroup, TrimPlan};
use crate::telemetry;

/// Most messages one pass scans to find a `MaxAge` cut (the rest waits for the next pass).
const AGE_SCAN: u64 = 64 * 1024;
/// A queue whose trim was refused (something it was computed from changed) is computed again
/// this many times in one pass.
const TRIES: usize = 5;

/// One retention pass over every queue of the namespace; compacts etcd's history (keeping
/// [`COMPACT_WINDOW`](super::side::COMPACT_WINDOW)) if `compact`, or if it deleted many messages.
pub(crate) async fn pass(
    engine: &Arc<Engine>,
    side: &EtcdSide,
    compact: Option<bool>,
) -> Result<TrimReport, Error> {
    let t = side.settings.request_timeout;
    let clock = engine.clock().clone();
    let mut report = TrimReport::default();
    let mut started_at = None;
    let mut pending: Option<Vec<String>> = None;
    for _ in 0..TRIES {
        let loaded = retrying(t, || side.store.load()).await?;
        started_at.get_or_insert(loaded.revision);
        let now = clock.wall_micros();
        let mut refused = Vec::new();
        for (i, (name, meta, last)) in loaded.queues.iter().enumerate() {
            if pending.as_ref().is_some_and(|p| !p.contains(name)) {
                continue;
            }
            let groups = loaded.trim_groups(name);
            let first = meta.first_seq;
            if *last < first {
                continue;
            }
            let to = match meta.retention {
                Retention::Forever => None,
                Retention::UntilAcked => groups.iter().map(|g| g.committed).min(),
                Retention::MaxLen(n) => last.checked_sub(n),
                Retention::MaxAge(age) => {
                    let cutoff = now.saturating_sub(age.as_micros().min(u64::MAX as u128) as u64);
                    retrying(t, || side.store.last_enqueued_before(meta.id, (first, *last), cutoff, AGE_SCAN))
                        .await?
                }
            };
            let Some(to) = to.filter(|&to| to >= first).map(|to| to.min(*last)) else { continue };
            let behind: Vec<TrimGroup> = groups.into_iter().filter(|g| g.committed < to).collect();
            let plan = TrimPlan {
                queue: name.clone(),
                meta: QueueMeta { first_seq: to + 1, ..*meta },
                queue_rev: loaded.queue_revs.get(i).copied().unwrap_or(0),
                to,
                behind,
                read_at: loaded.revision,
                purge: false,
            };
            if apply(engine, side, plan, first, Cut::Retention).await? {
                report.trimmed.push((name.clone(), to - first + 1, to + 1));
                report.deleted += to - first + 1;
            } else {
                refused.push(name.clone());
            }
        }
        if refused.is_empty() {
            break;
        }
        pending = Some(refused);
    }
    report.outcomes_expired = expire_outcomes(engine, side).await?;
    let window = started_at.and_then(|rev| side.revisions.note(clock.now(), rev));
    if compact.unwrap_or(report.deleted >= 64 * 1024)
        && let Some(rev) = window
    {
        retrying(t, || side.store.compact(rev)).await?;
        report.compacted = true;
    }
    Ok(report)
}

/// Deletes the kept job outcomes of every work group of the namespace whose retention
/// (`keep_outcomes`, as the group's settings record in etcd says now, read once per pass) has
/// passed on the broker's clock, as the embedded pass does; an outcome of a group that keeps
/// none any more goes at once. Each is compared with the revision it was read at. Returns how
/// many went.
async fn expire_outcomes(engine: &Engine, side: &EtcdSide) -> Result<u64, Error> {
    let t = side.settings.request_timeout;
    let now = engine.clock().wall_micros();
    let mut keeps: HashMap<(String, String), u64> = HashMap::new();
    let mut total = 0;
    let mut from = Vec::new();
    loop {
        let (page, next) = retrying(t, || side.store.scan_outcomes(&from)).await?;
        let mut expired: Vec<(Vec<u8>, i64)> = Vec::new();
        for o in page {
            let pair = (o.group, o.queue);
            let keep = match keeps.get(&pair) {
                Some(&k) => k,
                None => {
                    let (record, _) = retrying(t, || side.store.work_settings(&pair.0, &pair.1)).await?;
                    let keep = record.and_then(|r| r.work).map(|w| w.keep_outcomes).unwrap_or_default();
                    let k = u64::try_from(keep.as_micros()).unwrap_or(u64::MAX);
                    keeps.insert(pair, k);
                    k
                }
            };
            // Unreadable: left for an operator (the job's lookup reports the corruption).
            if o.finished_micros.is_some_and(|at| at.saturating_add(keep) <= now) {
                expired.push((o.key, o.rev));
            }
        }
        if !expired.is_empty() {
            total += retrying(t, || side.store.delete_outcomes(&expired)).await?;
        }
        match next {
            Some(n) => from = n,
            None => return Ok(total),
        }
    }
}

/// Why a queue's head is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    /// Its retention policy: groups moved past what they had not finished are reported
    /// skipped, and the trim is reported.
    Retention,
    /// A purge, which asked for it: nothing is reported skipped.
    Purge,
}

/// Carries out `plan` (the queue's first sequence was `first`): the work groups that do not fit
/// the trim's transaction are moved past the cut first, then the trim, then the marks of the
/// ordered groups that did not fit. `false`: something the plan was computed from changed, and
/// the trim was not made (compute it again).
pub(super) async fn apply(
    engine: &Engine,
    side: &EtcdSide,
    mut plan: TrimPlan,
    first: u64,
    cut: Cut,
) -> Result<bool, Error> {
    let t = side.settings.request_timeout;
    let to = plan.to;
    let (ahead, after) = plan.split();
    // Tests create a group here, after the cut was computed.
    crate::faults::reached("rockq-etcd-trim-planned");
    for chunk in ahead.chunks(GROUPS_PER_MOVE) {
        if !retrying(t, || side.store.move_past_cut(&plan, chunk)).await? {
            return Ok(false);
        }
        if cut == Cut::Retention {
            skipped(engine, &plan.queue, chunk, to);
        }
    }
    if !retrying(t, || side.store.trim(&plan)).await? {
        return Ok(false);
    }
    trimmed(engine, side, &plan, first, cut).await;
    if !after.is_empty() {
        retrying(t, || side.store.delete_marks(&plan.queue, &after, to)).await?;
    }
    Ok(true)
}

/// A trim landed: this process takes the new first sequence at once (others through their
/// watch), and reports it as the embedded writer does.
async fn trimmed(engine: &Engine, side: &EtcdSide, plan: &TrimPlan, first: u64, cut: Cut) {
    super::watch::learn_queue(engine, side, &plan.queue, &plan.meta).await;
    let (to, deleted) = (plan.to, plan.to - first + 1);
    // The watch may have brought the new record first and be moving the work groups on: this
    // waits for that (or does it), so the pass returns with the offsets moved.
    super::claims::trimmed(side, plan.meta.id, to).await;
    if cut == Cut::Purge {
        return;
    }
    let queue: Arc<str> = Arc::from(plan.queue.as_str());
    tracing::info!(queue = %queue, deleted, first_seq = to + 1, "rockq: trimmed");
    telemetry::queue_counter(telemetry::TRIMMED, &queue, deleted);
    skipped(engine, &plan.queue, &plan.behind, to);
    engine.emit(|| Event::Trimmed { queue, deleted, first_seq: to + 1 });
}

/// Work groups of `queue` moved past the cut `to`: reported as the embedded writer does.
fn skipped(engine: &Engine, queue: &str, groups: &[TrimGroup], to: u64) {
    let queue: Arc<str> = Arc::from(queue);
    for g in groups.iter().filter(|g| g.mode == GroupMode::WorkQueue) {
        let from = g.committed + 1;
        if let Some(state) = engine.registry.work.get(&crate::store::group_id(&g.group, &queue)) {
            state.skipped.fetch_add(to - from + 1, Ordering::Relaxed);
        }
        tracing::warn!(queue = %queue, group = %g.group, from, to, "rockq: retention skipped messages a group had not finished");
        let group: Arc<str> = Arc::from(g.group.as_str());
        engine.emit(|| Event::Skipped { queue: queue.clone(), group, from, to });
    }
}
