//! Recurring schedules on etcd, the writer's side (the records: `store/etcd/schedules.rs`).
//!
//! A schedule's pending firing is a due-index entry like a delayed message's, so the timer of
//! every process finds it (`delayed.rs` hands such entries here). A firing plans what is due as
//! embedded (`schedule::plan_firings`: on-time firings each a message, late ones by the
//! schedule's `Missed` policy) and writes it in one transaction compared with the schedule's
//! record as read: the messages appended, the record rewritten with its counters and next
//! firing, the due entry moved. A second process firing the same occurrence, an upsert, a pause
//! or a delete in between fail the compare: each occurrence fires once, across processes and
//! crashes. Upserts, pauses and deletes are compare-and-sets on the record likewise.

use std::sync::Arc;
use std::time::Instant;

use super::plan::{Done, Extra};
use super::side::retrying;
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::error::{Error, StorageError};
use crate::events::Event;
use crate::model::ScheduleRecord;
use crate::schedule::plan_firings;
use crate::store::envelope;
use crate::store::etcd::delayed::DelayedRecord;
use crate::store::etcd::{MAX_TXN_BYTES, ScheduleWrite};
use crate::telemetry;

/// On-time firings one transaction sends at most: etcd's operation limit, less the tail's put
/// and the record's five operations (the rest fire at once after, from the next entry).
const ON_TIME_PER_TXN: usize = 100;

impl Writer {
    /// `Broker::schedule`: creates or replaces schedule `name` (a replaced one keeps its
    /// counters and pause, and starts its recurrence from now); returns its next firing.
    pub(super) async fn upsert_schedule(
        &mut self,
        name: &str,
        mut rec: ScheduleRecord,
    ) -> Result<Option<u64>, Error> {
        // A firing carries a catch-up message, an on-time one and the record (which holds the
        // message too) in one transaction at least.
        if rec.envelope.len() > MAX_TXN_BYTES / 4 {
            return Err(capability::refusal(Flavour::Etcd, Capability::HugeMessage));
        }
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        loop {
            let old = retrying(t, || store.schedule(name)).await?;
            let (rev, unarm) = match &old {
                Some((o, rev)) => {
                    (rec.paused, rec.fired, rec.missed_firings) = (o.paused, o.fired, o.missed_firings);
                    (rec.last_micros, rec.last_seq) = (o.last_micros, o.last_seq);
                    (*rev, (o.next_micros != 0).then_some((o.next_micros, o.id)))
                }
                None => (0, None),
            };
            let now = self.stamp();
            // A fresh id: a firing of the old version in flight can never match it.
            rec.id = self.scheduled_id(t).await?;
            rec.anchor_micros = now;
            rec.next_micros = match rec.paused {
                true => 0,
                false => rec.recurrence.next_after(now, now).unwrap_or(0),
            };
            let arm = (rec.next_micros != 0).then_some((rec.next_micros, rec.id));
            let w = ScheduleWrite { name, rev, record: &rec, unarm, arm };
            if retrying(t, || store.write_schedule(&w, false, None)).await? {
                if let Some((due, _)) = arm {
                    self.engine.timer.offer(due);
                }
                return Ok(arm.map(|(due, _)| due));
            }
        }
    }

    /// `Broker::pause_schedule` / `resume_schedule`. Firings while paused are not missed ones:
    /// a resumed schedule goes on with its next firing after now.
    pub(super) async fn pause_schedule(&mut self, name: &str, paused: bool) -> Result<(), Error> {
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        loop {
            let Some((mut rec, rev)) = retrying(t, || store.schedule(name)).await? else {
                return Err(Error::NoSuchSchedule { name: name.to_owned() });
            };
            if rec.paused == paused {
                return Ok(());
            }
            let unarm = (rec.next_micros != 0).then_some((rec.next_micros, rec.id));
            let now = self.stamp();
            rec.paused = paused;
            rec.next_micros = match paused {
                true => 0,
                false => rec.recurrence.next_after(now, rec.anchor_micros).unwrap_or(0),
            };
            let arm = (rec.next_micros != 0).then_some((rec.next_micros, rec.id));
            let w = ScheduleWrite { name, rev, record: &rec, unarm, arm };
            if retrying(t, || store.write_schedule(&w, false, None)).await? {
                if let Some((due, _)) = arm {
                    self.engine.timer.offer(due);
                }
                return Ok(());
            }
        }
    }

    /// `Broker::delete_schedule`: `false` if there is no such schedule.
    pub(super) async fn delete_schedule(&mut self, name: &str) -> Result<bool, Error> {
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        let marked = self.marked(t).await?;
        let mut sent = false;
        loop {
            let Some((rec, rev)) = retrying(t, || store.schedule(name)).await? else {
                // Gone: by this call's own delete if a try whose answer was lost landed.
                return Ok(sent && retrying(t, || store.marker_exists(marked.nonce)).await?);
            };
            let unarm = (rec.next_micros != 0).then_some((rec.next_micros, rec.id));
            let w = ScheduleWrite { name, rev, record: &rec, unarm, arm: None };
            sent = true;
            if retrying(t, || store.write_schedule(&w, true, Some(marked))).await? {
                return Ok(true);
            }
        }
    }

    /// Fires the recurring schedule whose due entry is `entry` (its value: the schedule's
    /// name). `false`: the schedule changed meanwhile (another process fired it, or it was
    /// replaced, paused or deleted), nothing written; the caller reads again.
    pub(super) async fn fire_recurring(
        &mut self,
        entry: &DelayedRecord,
        now: u64,
        deadline: Instant,
    ) -> Result<bool, StorageError> {
        let store = self.side.store.clone();
        let name = String::from_utf8_lossy(&entry.env).into_owned();
        let found = retrying(self.budget(), || store.schedule(&name)).await?;
        let (mut rec, rev) = match found {
            Some((rec, rev)) if rec.id == entry.id && rec.next_micros == entry.due && !rec.paused => {
                (rec, rev)
            }
            // Replaced, paused or deleted since the entry was written (those remove it in the
            // same transaction): only a foreign write leaves one. Dropped, compared as read.
            _ => return retrying(self.budget(), || store.cancel_delayed(entry, None)).await,
        };
        let grace = rec.recurrence.grace.as_micros().min(u128::from(u64::MAX)) as u64;
        // As many on-time firings as one transaction carries beside a catch-up message and the
        // record (by count and by bytes, a KiB left for keys and the record's other fields; an
        // upsert refused messages over a quarter of a transaction).
        let room = (MAX_TXN_BYTES - 1024) / rec.envelope.len().max(1);
        // A prioritised message's index entry is one more operation per firing.
        let per_firing = 1 + usize::from(envelope::priority(&rec.envelope) > 0);
        let per_txn = room.saturating_sub(2).clamp(1, ON_TIME_PER_TXN / per_firing);
        let plan = plan_firings(&rec.recurrence, entry.due, now, grace, rec.anchor_micros, per_txn);
        let (sends, skipped) = plan.sends(rec.recurrence.missed);
        let folded: u64 = sends.iter().sum();
        rec.fired += sends.len() as u64;
        rec.missed_firings += skipped + folded;
        rec.next_micros = plan.next.unwrap_or(0);
        if !sends.is_empty() {
            rec.last_micros = now;
        }
        // The same id goes on (`push_schedule` overwrites its entry).
        let arm = plan.next.map(|n| (n, rec.id));
        let w = ScheduleWrite { name: &name, rev, record: &rec, unarm: Some((entry.due, entry.id)), arm };
        let first = if sends.is_empty() {
            if !retrying(self.budget(), || store.write_schedule(&w, false, None)).await? {
                return Ok(false);
            }
            None
        } else {
            let queue = match self.create_queue(&rec.queue).await {
                Ok(q) => q,
                Err(Error::Storage(e)) => return Err(e),
                Err(Error::Corrupt(c)) => return Err(StorageError::corrupt(c)),
                Err(e) => return Err(StorageError::new(format!("schedule {name}: its queue: {e}"))),
            };
            let mut env = rec.envelope.clone();
            envelope::stamp(&mut env, now);
            let envs = vec![env.as_slice(); sends.len()];
            let done = self.append_with(&queue, &envs, &[], now, deadline, Extra::Schedule(&w)).await;
            self.note(&done);
            match done? {
                Done::Stored { first, .. } => {
                    queue.publish_max(first + sends.len() as u64 - 1);
                    telemetry::produced(&queue.produced, sends.len() as u64);
                    Some(first)
                }
                Done::Changed => return Ok(false),
            }
        };
        if let Some(next) = plan.next {
            self.engine.timer.offer(next);
        }
        self.report_firing(&name, &rec.queue, first, &sends, skipped);
        Ok(true)
    }

    /// Events and the counter of one firing: one event per message (with the late firings it
    /// stands for), or one without a message if late firings were only skipped.
    fn report_firing(&self, name: &str, queue: &str, first: Option<u64>, sends: &[u64], skipped: u64) {
        let (schedule, queue) = (Arc::<str>::from(name), Arc::<str>::from(queue));
        if !sends.is_empty() {
            metrics::counter!(telemetry::SCHEDULE_FIRED, "queue" => queue.clone(), "schedule" => schedule.clone())
                .increment(sends.len() as u64);
        }
        let events: Vec<(Option<u64>, u64)> = match first {
            Some(first) => {
                sends.iter().enumerate().map(|(i, &folded)| (Some(first + i as u64), folded)).collect()
            }
            None => vec![(None, skipped)],
        };
        for (seq, missed) in events {
            tracing::debug!(%schedule, %queue, ?seq, missed, "rockq: schedule fired");
            let (schedule, queue) = (schedule.clone(), queue.clone());
            self.engine.emit(|| Event::ScheduleFired { schedule, queue, seq, missed });
        }
    }
}
