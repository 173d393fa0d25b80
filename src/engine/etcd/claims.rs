//! Work groups' claim records as this process follows them, apart from the writer that writes
//! them (`work.rs`): loading a group with its records, moving the stored offset over a finished
//! run, a trim's jump past the deleted head, and the watch that teaches the claim state machine
//! what other processes wrote (into `known.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::known::{Known, WorkSide};
use super::side::{EtcdSide, retrying};
use crate::clock::Clock;
use crate::engine::Engine;
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::Request;
use crate::error::StorageError;
use crate::model::WorkSettings;
use crate::store::etcd::work::ClaimEvent;

/// Moves `g`'s stored offset over the finished run above it, if this process knows of one.
/// Safe from any task: the move compares the stored offset (it only goes forward) and the
/// group's last reset (`reset.rs`). Returns whether this call moved it.
pub(super) async fn advance(
    side: &EtcdSide,
    g: &WorkGroupState,
    known: &mut Known,
) -> Result<bool, StorageError> {
    let to = g.progress().offset;
    // An inspection writes nothing: the consuming processes move their offsets.
    if to <= known.stored_offset || side.settings.passive {
        return Ok(false);
    }
    // Tests hold an offset move back to a later round (a reset lands in between).
    crate::faults::check("rockq-etcd-offset-move")?;
    let (store, t) = (&side.store, side.settings.request_timeout);
    let reset_rev = known.reset_rev;
    let seen = side.seen(&g.name, &g.queue.name);
    let moved = retrying(t, || store.move_work_offset(&g.name, &g.queue.name, seen, to, reset_rev)).await?;
    // Not moved: another process moved it at least as far, or a reset this process has not
    // learned yet refused the move (its watch brings the reset, which replaces all of this).
    known.learn_offset(g, to);
    Ok(moved)
}

/// Loads work group `group` on `queue` (its offset record exists): its claim records into a new
/// state machine, its stored settings, and a watch on its records from the revision they were
/// read at. Registered in the engine (at connect for every group, else at first use). `None`:
/// deleted since it was found.
pub(super) async fn load(
    engine: &Arc<Engine>,
    side: &Arc<EtcdSide>,
    queue: Arc<QueueState>,
    group: &str,
    stop: &CancellationToken,
    nudge: &mpsc::WeakSender<Request>,
) -> Result<Option<Arc<WorkGroupState>>, StorageError> {
    let id = crate::store::group_id(group, &queue.name);
    let (store, t) = (&side.store, side.settings.request_timeout);
    let Some(loaded) = retrying(t, || store.load_claims(group, &queue.name)).await? else { return Ok(None) };
    let (offset, records, rev) = (loaded.offset, loaded.records, loaded.rev);
    let g = WorkGroupState::new(group, queue.clone(), offset);
    let clock = engine.clock().clone();
    let mut known = Known { stored_offset: offset, reset_rev: loaded.reset_rev, ..Known::default() };
    // The settings first: a group that needs its messages' keys (ordered by key, a per-key
    // limit) learns the records in order, the others put them ahead of the frontier.
    if let (Some(rec), _) = retrying(t, || store.work_settings(group, &queue.name)).await? {
        g.paused.store(rec.paused, std::sync::atomic::Ordering::SeqCst);
        if let Some(s) = WorkSettings::stored(&rec, &queue.name) {
            g.set_settings(Arc::new(s));
        }
    }
    for r in records {
        known.saw(&r);
        g.learn_claim(r.seq, &r.claim, &clock);
    }
    known.viewed(rev);
    if let Some(l) = loaded.limit {
        known.learn_limit(&g, l, &clock);
    }
    let ws = Arc::new(WorkSide { group: g.clone(), known: tokio::sync::Mutex::new(known) });
    // Before the registry: a deletion the watch brings later is judged by this revision.
    side.group_seen.insert(id.clone(), rev);
    side.work.insert(id.clone(), ws.clone());
    engine.registry.work.insert(id, g.clone());
    // A change the settings watch saw meanwhile (kept before it looks for the group).
    super::settings::adopt(engine, side, group, &queue.name);
    // A group created on a stale head (a trim landed between reading the head and creating
    // the group) would wait for ever on messages that are gone (review finding): the head as
    // etcd holds it now, read after the group is registered (a later trim reaches it through
    // the watch), moves it past them.
    if let Some((meta, _)) = retrying(t, || store.queue_record(&queue.name)).await?
        && meta.id == queue.id
        && meta.first_seq > offset + 1
    {
        queue.first_seq.fetch_max(meta.first_seq, Ordering::AcqRel);
        let mut known = ws.known.lock().await;
        known.learn_offset(&g, meta.first_seq - 1);
        advance(side, &g, &mut known).await?;
    }
    tokio::spawn(watch(side.clone(), Arc::downgrade(&ws), rev, clock, stop.clone(), nudge.clone()));
    // A deletion the watch applied while this group was read (before it was registered).
    super::forget::forget_if_deleted_since(engine, side, group, &queue.name, rev);
    Ok(Some(g))
}

/// Queue `qid` was trimmed through `to`: its work groups here jump past the deleted head (a
/// group behind the cut had its offset moved to `to` in the trim's transaction).
pub(super) async fn trimmed(side: &EtcdSide, qid: u32, to: u64) {
    let sides: Vec<Arc<WorkSide>> =
        side.work.iter().filter(|w| w.group.queue.id == qid).map(|w| w.clone()).collect();
    for ws in sides {
        let mut known = ws.known.lock().await;
        known.learn_offset(&ws.group, to);
        // Over the messages finished while the trimmed head waited, as embedded (they would
        // otherwise wait for the next message finished here).
        if let Err(e) = advance(side, &ws.group, &mut known).await {
            tracing::warn!(queue = %ws.group.queue.name, group = %ws.group.name, error = %e, "rockq: moving a work group's offset past a trim failed; trying again next round");
        }
    }
}

/// Teaches the group's state machine what other processes write, until the broker stops or the
/// group is gone. A broken watch (compacted, the member went away) is replaced after a reload
/// of every record: state is re-read, not replayed.
async fn watch(
    side: Arc<EtcdSide>,
    ws: Weak<WorkSide>,
    mut rev: i64,
    clock: Clock,
    stop: CancellationToken,
    nudge: mpsc::WeakSender<Request>,
) {
    let (gname, qname) = match ws.upgrade() {
        Some(w) => (w.group.name.to_string(), w.group.queue.name.to_string()),
        None => return,
    };
    loop {
        match side.store.watch_claims(&gname, &qname, rev).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return,
                        next = stream.next() => next,
                    };
                    let Some(ws) = ws.upgrade() else { return };
                    match next {
                        // Tests hold other processes' writes back from this process (a slow
                        // watch): etcd's compares alone must keep the guarantees. What it
                        // skipped is not known here: the view stops (`Known::view_gap`).
                        Some(Ok(_)) if crate::faults::check("rockq-etcd-claim-watch").is_err() => {
                            ws.known.lock().await.view_gap = true;
                        }
                        Some(Ok(events)) => {
                            // A range record's jobs, each as a record of its own would be.
                            let events: Vec<ClaimEvent> = events
                                .into_iter()
                                .flat_map(|e| match e {
                                    ClaimEvent::PutRun(rs) => rs.into_iter().map(ClaimEvent::Put).collect(),
                                    e => vec![e],
                                })
                                .collect();
                            // Tests hold a batch back here, to apply it after a reset.
                            crate::faults::reached("rockq-etcd-claim-watch-apply");
                            let mut known = ws.known.lock().await;
                            // A reset deletes every record in its revision: those deletions
                            // say nothing of the offset passing them.
                            let resets: Vec<i64> = events
                                .iter()
                                .filter_map(|e| match e {
                                    ClaimEvent::Reset { rev, .. } => Some(*rev),
                                    _ => None,
                                })
                                .collect();
                            // Learned after the batch's claims: the view then includes
                            // everything the limited claim that wrote it counted.
                            let mut limit = None;
                            for ev in events {
                                match ev {
                                    ClaimEvent::Reset { offset, rev: r } => {
                                        rev = rev.max(r);
                                        known.reset(&ws.group, offset, r);
                                    }
                                    ClaimEvent::Gone { rev: r, .. } if resets.contains(&r) => {
                                        rev = rev.max(r);
                                    }
                                    // Written before a reset this process knows already (its
                                    // own, applied when written, ahead of this watch): the
                                    // reset deleted it, so it says nothing now.
                                    ClaimEvent::Put(r) if r.rev <= known.reset_rev => {
                                        rev = rev.max(r.rev);
                                    }
                                    ClaimEvent::Gone { rev: r, .. } if r <= known.reset_rev => {
                                        rev = rev.max(r);
                                    }
                                    ClaimEvent::Put(r) => {
                                        rev = rev.max(r.rev);
                                        if r.seq > known.stored_offset
                                            && r.rev > known.expected(r.seq)
                                            && !known.adopt(&r)
                                        {
                                            known.saw(&r);
                                            ws.group.learn_claim(r.seq, &r.claim, &clock);
                                        }
                                    }
                                    ClaimEvent::Gone { seq, rev: r } => {
                                        rev = rev.max(r);
                                        known.learn_offset(&ws.group, seq);
                                    }
                                    ClaimEvent::Limit(l) => {
                                        rev = rev.max(l.rev);
                                        limit = Some(l);
                                    }
                                    // A move from before a reset this process knows says
                                    // nothing of the offset now.
                                    ClaimEvent::Moved { rev: r, .. } if r <= known.reset_rev => {
                                        rev = rev.max(r);
                                    }
                                    ClaimEvent::Moved { to, rev: r } => {
                                        rev = rev.max(r);
                                        known.learn_offset(&ws.group, to);
                                    }
                                    // (Expanded above.)
                                    ClaimEvent::PutRun(_) => {}
                                }
                            }
                            known.viewed(rev);
                            if let Some(l) = limit {
                                known.learn_limit(&ws.group, l, &clock);
                            }
                            let behind = ws.group.progress().offset > known.stored_offset;
                            drop(known);
                            crate::faults::reached("rockq-etcd-claim-watch-applied");
                            if behind && let Some(tx) = nudge.upgrade() {
                                // Another process finished the run's last message: move the offset.
                                let _ = tx.try_send(Request::Commit);
                            }
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, group = %gname, "rockq: claim watch broke; reloading");
                            break;
                        }
                        None => break,
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "rockq: claim watch did not start; retrying"),
        }
        loop {
            match side.store.load_claims(&gname, &qname).await {
                // Deleted: the deletion watch forgets the group, and this watch ends with it.
                Ok(None) => return,
                Ok(Some(loaded)) => {
                    let Some(ws) = ws.upgrade() else { return };
                    let mut known = ws.known.lock().await;
                    // A reset missed while the watch was down: start again from it.
                    if !known.reset(&ws.group, loaded.offset, loaded.reset_rev) {
                        known.learn_offset(&ws.group, loaded.offset);
                    }
                    let (records, at) = (loaded.records, loaded.rev);
                    for r in records {
                        if r.rev > known.expected(r.seq) && !known.adopt(&r) {
                            known.saw(&r);
                            ws.group.learn_claim(r.seq, &r.claim, &clock);
                        }
                    }
                    // Everything read again: a gap the watch left is closed.
                    known.view_gap = false;
                    known.viewed(at);
                    if let Some(l) = loaded.limit {
                        known.learn_limit(&ws.group, l, &clock);
                    }
                    rev = at;
                    break;
                }
                Err(_) => {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }
}
