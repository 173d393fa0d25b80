//! The queue and group tables the overview and the queue page share: figures from
//! `Broker::stats`, rates from the sampled history, and each group's problems as coloured
//! badges, so that a dead-letter queue with letters does not look like any other number.

use std::fmt::Write as _;

use super::ctx::Ctx;
use super::fmt;
use super::history::{History, lag_growing, last_rate};
use super::html::{self, esc};
use crate::retention::Retention;
use crate::stats::{GroupMode, GroupStats, QueueStats, Stats};

/// `until-acked`, `max-age 1h00m`, `max-len 1000`, `forever`.
pub(crate) fn retention(r: &Retention) -> String {
    match r {
        Retention::UntilAcked => "until-acked".into(),
        Retention::MaxAge(d) => format!("max-age {}", html::duration(*d)),
        Retention::MaxLen(n) => format!("max-len {n}"),
        Retention::Forever => "forever".into(),
    }
}

/// A POST button (rendered only with a CSRF token).
pub(crate) fn button(base: &str, csrf: &str, path: &str, label: &str, id: &str) -> String {
    format!(
        r#"<form class="inline" method="post" action="{}{}">{}<button id="{}">{}</button></form>"#,
        esc(base),
        esc(path),
        html::csrf_field(csrf),
        esc(id),
        esc(label)
    )
}

pub(crate) const QUEUE_HEADERS: &[&str] =
    &["Queue", "Len", "First", "Last", "Bytes", "Oldest", "Enqueued/s", "Retention", "Delayed"];

/// One queue's row. A dead-letter queue says how many letters are not yet redriven
/// (`dlq_depths`): its length counts redriven letters too, until retention deletes them.
pub(crate) fn queue_row(
    ctx: &Ctx,
    q: &QueueStats,
    history: &History,
    dlq_depths: &[(&str, u64)],
) -> Vec<String> {
    let (b, name) = (esc(&ctx.base), esc(&q.name));
    let mut link = format!(r#"<a href="{b}/queues/{name}">{name}</a>"#);
    if let Some((_, depth)) = dlq_depths.iter().find(|(d, _)| *d == q.name) {
        let cls = if *depth > 0 { "badge bad" } else { "badge" };
        let _ = write!(
            link,
            r#" <a class="{cls}" href="{b}/dlq/{name}" title="dead letters not yet redriven">{depth} to redrive</a>"#
        );
    }
    let rate = history.queues.get(&q.name).and_then(|r| last_rate(r, |p| (p.at, p.wall, p.last_seq)));
    let delayed = if q.scheduled > 0 {
        format!(r#"<a href="{b}/delayed?queue={name}">{}</a>"#, q.scheduled)
    } else {
        "0".into()
    };
    vec![
        link,
        q.len.to_string(),
        q.first_seq.to_string(),
        q.last_seq.to_string(),
        fmt::bytes(q.bytes),
        html::opt_duration(q.oldest_age),
        fmt::rate(rate),
        esc(&retention(&q.retention)),
        delayed,
    ]
}

pub(crate) const GROUP_HEADERS: &[&str] = &[
    "Queue",
    "Group",
    "Mode",
    "Status",
    "Committed",
    "Lag",
    "Lag age",
    "Acked/s",
    "In flight",
    "Waiting retry",
    "Paused",
    "DLQ",
    "DLQ depth",
    "Actions",
];

/// A group's problems, worst first: dead letters waiting, paused, lag growing; or `ok`.
pub(crate) fn status(g: &GroupStats, history: &History) -> String {
    let mut out = String::new();
    if g.dlq_depth > 0 {
        let _ = write!(out, r#"<span class="badge bad">{} dead</span> "#, g.dlq_depth);
    }
    if g.paused {
        out.push_str(r#"<span class="badge warn">paused</span> "#);
    }
    if history.groups.get(&(g.queue.clone(), g.group.clone())).is_some_and(lag_growing) {
        out.push_str(r#"<span class="badge warn">lag growing</span> "#);
    }
    if g.waiting_retry > 0 {
        let _ = write!(out, r#"<span class="badge warn">{} retrying</span> "#, g.waiting_retry);
    }
    if g.limited > 0 {
        // Held back on purpose (a rate or concurrency limit), not stuck: shown, not alarmed.
        let _ = write!(out, r#"<span class="badge">{} limited</span> "#, g.limited);
    }
    if out.is_empty() {
        out.push_str(r#"<span class="badge ok">ok</span>"#);
    }
    out.trim_end().to_owned()
}

pub(crate) fn group_row(ctx: &Ctx, g: &GroupStats, history: &History) -> Vec<String> {
    let b = esc(&ctx.base);
    let (q, gn) = (esc(&g.queue), esc(&g.group));
    let actions = match ctx.csrf() {
        Some(csrf) => {
            let path =
                format!("/groups/{}/{}/{}", g.queue, g.group, if g.paused { "resume" } else { "pause" });
            let label = if g.paused { "Resume" } else { "Pause" };
            let id = format!("{}-{}-{}", label.to_ascii_lowercase(), g.queue, g.group);
            button(&ctx.base, csrf, &path, label, &id)
        }
        None => "-".into(),
    };
    let ring = history.groups.get(&(g.queue.clone(), g.group.clone()));
    let acked = ring.and_then(|r| last_rate(r, |p| (p.at, p.wall, p.committed)));
    let depth =
        if g.dlq_depth > 0 { format!(r#"<span class="bad">{}</span>"#, g.dlq_depth) } else { "0".into() };
    vec![
        format!(r#"<a href="{b}/queues/{q}">{q}</a>"#),
        format!(r#"<a href="{b}/groups/{q}/{gn}">{gn}</a>"#),
        g.mode.as_str().into(),
        status(g, history),
        g.committed.to_string(),
        g.lag.to_string(),
        html::opt_duration(g.oldest_unacked_age),
        fmt::rate(acked),
        g.in_flight.to_string(),
        g.waiting_retry.to_string(),
        if g.paused { r#"<span class="paused">paused</span>"#.into() } else { "no".into() },
        g.dead_letter_queue
            .as_ref()
            .map_or_else(|| "-".into(), |d| format!(r#"<a href="{b}/dlq/{d}">{d}</a>"#, d = esc(d))),
        depth,
        actions,
    ]
}

/// Each dead-letter queue with the letters not yet redriven: the depth its group reports, or
/// (for a `*.dlq` no group names) its length.
pub(crate) fn dlq_depths(stats: &Stats) -> Vec<(&str, u64)> {
    super::source::dead_letter_queues(stats)
        .into_iter()
        .map(|d| {
            let depth = stats
                .groups
                .iter()
                .find(|g| g.mode == GroupMode::WorkQueue && g.dead_letter_queue.as_deref() == Some(d))
                .map(|g| g.dlq_depth)
                .or_else(|| stats.queues.iter().find(|q| q.name == d).map(|q| q.len))
                .unwrap_or(0);
            (d, depth)
        })
        .collect()
}
