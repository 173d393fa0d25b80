//! One try of an append, planned: which messages a call writes (`DedupPlan`, from the
//! idempotency keys' records, `dedup.rs`), which of them are appended now and which delayed
//! (`Split`, `delayed.rs`), and what else the append carries (`Extra`). Plain values: the
//! writer, the dedup and the delayed-message rooms all use them.

use crate::sent::Original;
use crate::store::etcd::DedupWrite;
use crate::store::etcd::{DelayedPut, Fired, ScheduleWrite};

/// What one try of an append writes and reports.
#[derive(Default)]
pub(super) struct DedupPlan {
    /// The indexes (in the call's envelopes) of the messages written, in order.
    pub written: Vec<usize>,
    /// The keys recorded, by position in `written`.
    pub records: Vec<DedupWrite>,
    /// Duplicates: the envelope's index and its original (`Ok`), or the position in `written`
    /// of the message of this append it duplicates (`Err`).
    pub duplicates: Vec<(usize, Result<Original, usize>)>,
}

impl DedupPlan {
    /// Every message written, nothing keyed.
    pub fn plain(n: usize) -> DedupPlan {
        DedupPlan { written: (0..n).collect(), ..DedupPlan::default() }
    }

    /// The duplicates' originals, once the append stored its messages from `first`.
    pub fn originals(&self, first: u64) -> Vec<(usize, Original)> {
        self.duplicates
            .iter()
            .map(|&(i, o)| (i, o.unwrap_or_else(|pos| Original::Appended(first + pos as u64))))
            .collect()
    }
}

/// What an append carries besides its messages (`Writer::append_with`).
pub(super) enum Extra<'a> {
    Nothing,
    /// Per message of the call: `(schedule id, due)` if it is delayed.
    Delays(&'a [Option<(u64, u64)>]),
    /// The append fires these delayed messages (its envelopes, in order).
    Fired(&'a [Fired]),
    /// The append is a recurring schedule's firing (its messages), rewriting its record.
    Schedule(&'a ScheduleWrite<'a>),
}

/// How an append ended.
pub(super) enum Done {
    /// Written: the first sequence appended, and each duplicate's original.
    Stored { first: u64, originals: Vec<(usize, Original)> },
    /// A fired message's record (or the firing schedule's) changed meanwhile: nothing written.
    Changed,
}

/// One try's plan split into what is appended now and what is delayed.
pub(super) struct Split {
    /// The messages appended now (indexes in the call).
    pub now: Vec<usize>,
    /// The delayed ones: index in the call, schedule id, due time.
    pub delayed: Vec<(usize, u64, u64)>,
    /// The keys' records, each naming its appended message or its delayed one.
    pub records: Vec<DedupWrite>,
}

impl Split {
    pub fn of(plan: &DedupPlan, extra: &Extra<'_>) -> Split {
        let Extra::Delays(delays) = extra else {
            return Split { now: plan.written.clone(), delayed: Vec::new(), records: plan.records.clone() };
        };
        let (mut now, mut delayed) = (Vec::new(), Vec::new());
        // Where each written message went: its position among those appended now, or its id.
        let mut place = Vec::with_capacity(plan.written.len());
        for &i in &plan.written {
            match delays.get(i).copied().flatten() {
                Some((id, due)) => {
                    place.push(Err(id));
                    delayed.push((i, id, due));
                }
                None => {
                    place.push(Ok(now.len()));
                    now.push(i);
                }
            }
        }
        let records = plan
            .records
            .iter()
            .map(|r| match place[r.index] {
                Ok(pos) => DedupWrite { index: pos, ..r.clone() },
                Err(id) => DedupWrite { index: 0, scheduled: Some(id), ..r.clone() },
            })
            .collect();
        Split { now, delayed, records }
    }

    /// The delayed messages' records to write.
    pub fn puts<'e>(&self, envs: &[&'e [u8]]) -> Vec<DelayedPut<'e>> {
        self.delayed.iter().map(|&(i, id, due)| DelayedPut { id, due, env: envs[i] }).collect()
    }

    /// The duplicates' originals once the messages appended now start at `first`.
    pub fn originals(&self, plan: &DedupPlan, first: u64) -> Vec<(usize, Original)> {
        plan.duplicates
            .iter()
            .map(|&(i, o)| {
                let o = o.unwrap_or_else(|pos| {
                    let msg = plan.written[pos];
                    match self.delayed.iter().find(|d| d.0 == msg) {
                        Some(&(_, id, _)) => Original::Scheduled(id),
                        None => Original::Appended(
                            first + self.now.iter().position(|&n| n == msg).unwrap_or(0) as u64,
                        ),
                    }
                });
                (i, o)
            })
            .collect()
    }
}
