//! The charts of a page, from the sampled history: per queue its length and enqueued/s, per
//! group its lag and acked/s. Series with nothing happening over the window (no traffic, a
//! flat count) are folded into one line of text instead of a dozen flat charts.

use std::fmt::Write as _;

use super::chart::{self, Axis, Series};
use super::history::rates;
use super::html::{self, esc};
use super::state::State;
use crate::stats::Stats;

/// Whether a window shows no change: every rate 0 and the count flat.
fn idle(rate: &[(std::time::SystemTime, f64)], count: &[(std::time::SystemTime, f64)]) -> bool {
    rate.iter().all(|p| p.1 == 0.0) && count.windows(2).all(|w| w[0].1 == w[1].1)
}

/// Charts of the queues (all, or `queue`) and their groups (all, or `group`).
pub(crate) fn render(st: &State, stats: &Stats, queue: Option<&str>, group: Option<&str>) -> String {
    let h = st.history.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::from(r#"<div class="charts" id="charts">"#);
    let mut folded: Vec<String> = Vec::new();
    // Series with a single sample so far (created since the sampler started).
    let mut young: Vec<String> = Vec::new();
    if group.is_none() {
        for q in stats.queues.iter().filter(|q| queue.is_none_or(|o| o == q.name)) {
            let Some(ring) = h.queues.get(&q.name) else { continue };
            let rate = rates(ring, |p| (p.at, p.wall, p.last_seq));
            let len: Vec<_> = ring.iter().map(|p| (p.wall, p.len as f64)).collect();
            if len.len() < 2 {
                young.push(format!("queue {}", esc(&q.name)));
                continue;
            }
            if idle(&rate, &len) {
                folded.push(format!("queue {} (length {})", esc(&q.name), q.len));
                continue;
            }
            let series = [
                Series { label: "length", class: "len", axis: Axis::Left, points: len },
                Series { label: "enqueued/s", class: "rate", axis: Axis::Right, points: rate },
            ];
            let title = format!("queue {}", q.name);
            let _ = write!(out, "<figure>{}</figure>", chart::render(&title, ("msgs", "msg/s"), &series));
        }
    }
    for g in stats
        .groups
        .iter()
        .filter(|g| queue.is_none_or(|o| o == g.queue) && group.is_none_or(|o| o == g.group))
    {
        let Some(ring) = h.groups.get(&(g.queue.clone(), g.group.clone())) else { continue };
        let lag: Vec<_> = ring.iter().map(|p| (p.wall, p.lag as f64)).collect();
        let acked = rates(ring, |p| (p.at, p.wall, p.committed));
        if lag.len() < 2 {
            young.push(format!("group {}/{}", esc(&g.queue), esc(&g.group)));
            continue;
        }
        if idle(&acked, &lag) {
            folded.push(format!("group {}/{} (lag {})", esc(&g.queue), esc(&g.group), g.lag));
            continue;
        }
        let series = [
            Series { label: "lag", class: "lag", axis: Axis::Left, points: lag },
            Series { label: "acked/s", class: "rate", axis: Axis::Right, points: acked },
        ];
        // The lag's age is told, not drawn: a steady age next to a steady lag is no alarm.
        let title = format!(
            "group {}/{} · oldest unacked {}",
            g.queue,
            g.group,
            html::opt_duration(g.oldest_unacked_age)
        );
        let _ = write!(out, "<figure>{}</figure>", chart::render(&title, ("msgs", "msg/s"), &series));
    }
    out.push_str("</div>");
    if !folded.is_empty() {
        // The longest sampled window: the one the folded series were idle over.
        let window = h.queues.values().filter_map(|r| Some(r.back()?.at.duration_since(r.front()?.at))).max();
        let _ = write!(
            out,
            r#"<p class="summary" id="idle-series">No change{}: {}.</p>"#,
            window.map_or_else(String::new, |w| format!(" in the last {}", html::duration(w))),
            folded.join(", ")
        );
    }
    if !young.is_empty() {
        let _ = write!(out, r#"<p class="summary">Waiting for a second sample: {}.</p>"#, young.join(", "));
    }
    out
}
