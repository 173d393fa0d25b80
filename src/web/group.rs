//! A group's own page: its figures and problems, stored settings, chart, the claims of a
//! work group (attempts, holders, deadlines, last errors, with expired leases marked), one job
//! looked up by its sequence (`?job=N`: where it stands, as `Broker::job` tells) and the most
//! frequent last errors; for an operator, pause or resume, reset and delete.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::Response;

use super::ctx::Ctx;
use super::failure::Failure;
use super::fmt;
use super::html::{self, esc};
use super::input;
use super::state::State;
use super::tables::{self, GROUP_HEADERS};
use crate::stats::{GroupMode, JobState, PendingState};

/// Claims listed on the page (the JSON lists all).
const MAX_CLAIMS: usize = 200;

/// The console's name for a claim's state (the message list uses the same).
pub(crate) fn label(s: PendingState) -> &'static str {
    match s {
        PendingState::Leased => "leased",
        PendingState::Waiting => "retrying",
        _ => "expired",
    }
}

/// GET `/groups/{queue}/{group}`.
pub(crate) async fn page(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((queue, group)): Path<(String, String)>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    ctx.render(render(&st, &ctx, &queue, &group, p.get("job").map(String::as_str)).await)
}

/// The "Find a job" form, and the job asked for (`job`: its sequence as typed) if any: a job
/// that does not exist is said on the page, not as an error page.
async fn find_job(st: &State, b: &str, q: &str, g: &str, job: Option<&str>) -> Result<String, Failure> {
    let (qn, gn) = (esc(q), esc(g));
    let asked = job.map(str::trim).filter(|j| !j.is_empty());
    let mut out = format!(
        r#"<h2>Find a job</h2><form class="find-job" method="get" action="{b}/groups/{qn}/{gn}"><input name="job" placeholder="sequence" value="{v}"> <button id="find-job">Find</button></form>"#,
        v = esc(asked.unwrap_or("")),
    );
    let Some(asked) = asked else { return Ok(out) };
    let job = match input::seq("job", asked) {
        Ok(seq) => st.source.job(q, g, seq).await,
        Err(f) => Err(f),
    };
    let job = match job {
        Ok(job) => job,
        // Said beside the form (a typo keeps the page): not a sequence, or no such job.
        Err(f) if matches!(f.status, StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST) => {
            let _ = write!(out, r#"<p class="summary bad" id="job-missing">{}</p>"#, esc(&f.message));
            return Ok(out);
        }
        Err(f) => return Err(f),
    };
    let time_left = match job.state {
        JobState::Leased { lease_remaining } => format!("lease ends in {}", html::duration(lease_remaining)),
        JobState::RetryWaiting { due_in } => format!("retry in {}", html::duration(due_in)),
        _ => "-".into(),
    };
    let seq = job.seq;
    let row = vec![
        format!(r#"<a href="{b}/queues/{qn}?order=oldest&from={seq}&limit=1">{seq}</a>"#),
        format!(r#"<span class="state {0}">{0}</span>"#, job.state.as_str()),
        job.priority.to_string(),
        job.attempt.to_string(),
        esc(job.holder.as_deref().unwrap_or("-")),
        time_left,
        esc(job.last_error.as_deref().unwrap_or("-")),
        job.progress.as_deref().map_or_else(|| "-".into(), |p| html::payload(p, html::View::Text, 200)),
        job.outcome.as_ref().map_or_else(|| "-".into(), outcome),
    ];
    out.push_str(&html::table(
        "job",
        &["Seq", "State", "Priority", "Attempt", "Holder", "Time left", "Last error", "Progress", "Outcome"],
        &[row],
    ));
    Ok(out)
}

/// A kept outcome, escaped: its kind, attempt and time, where a dead letter went and why, and
/// the handler's result (as payloads are shown).
fn outcome(o: &crate::stats::JobOutcome) -> String {
    let mut s = format!(
        r#"<span class="outcome">{}</span> (attempt {}) at {}"#,
        o.kind.as_str(),
        o.attempt,
        html::time(o.finished_at)
    );
    if let crate::stats::OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } = &o.kind {
        let _ = write!(s, " to {}#{dead_letter_seq}: {}", esc(dead_letter_queue), esc(reason));
    }
    if let Some(r) = &o.result {
        let _ = write!(s, ", result {}", html::payload(r, html::View::Text, 200));
    }
    s
}

async fn render(
    st: &State,
    ctx: &Ctx,
    queue: &str,
    group: &str,
    job: Option<&str>,
) -> Result<Response, Failure> {
    let (q, g) = (input::name("queue", queue)?, input::name("group", group)?);
    let stats = st.source.stats().await?;
    let gs = super::source::group_in(&stats, q, g)?;
    let now = SystemTime::now();
    let (b, qn, gn) = (esc(&ctx.base), esc(q), esc(g));
    let mut body = String::new();
    {
        let h = st.history.lock().unwrap_or_else(|p| p.into_inner());
        body.push_str(&html::table("group", GROUP_HEADERS, &[tables::group_row(ctx, gs, &h)]));
    }
    // Stored settings.
    let mut settings = vec![vec!["Mode".to_owned(), gs.mode.as_str().to_owned()]];
    if gs.mode == GroupMode::WorkQueue {
        settings.push(vec!["Lease".into(), html::opt_duration(gs.lease)]);
        if let Some(p) = &gs.retry_policy {
            settings.push(vec![
                "Retries".into(),
                format!(
                    "up to {} attempts; backoff {} growing ×{} to {} (jitter {:.0} %)",
                    p.attempts(),
                    html::duration(p.initial_delay()),
                    p.growth(),
                    html::duration(p.max_delay()),
                    p.jitter_fraction() * 100.0
                ),
            ]);
        }
        settings.push(vec!["Ordered by key".into(), if gs.ordered_by_key { "yes" } else { "no" }.into()]);
        settings.push(vec![
            "Keeps outcomes".into(),
            gs.keep_outcomes.map_or_else(|| "no".into(), html::duration),
        ]);
        settings.push(vec![
            "Rate limit".into(),
            gs.rate_limit.map_or_else(
                || "none".into(),
                |r| match r.burst_size() {
                    1 => format!("{} per {}", r.jobs(), html::duration(r.per())),
                    n => format!("{} per {} (bursts of {n})", r.jobs(), html::duration(r.per())),
                },
            ),
        ]);
        settings.push(vec![
            "Concurrency limit".into(),
            gs.concurrency_limit.map_or_else(|| "none".into(), |n| format!("{n} at once")),
        ]);
        settings.push(vec![
            "Per-key limit".into(),
            gs.per_key_limit.map_or_else(|| "none".into(), |n| format!("{n} at once per key")),
        ]);
        settings.push(vec!["Held back by a limit".into(), gs.limited.to_string()]);
        settings.push(vec![
            "Dead-letter queue".into(),
            gs.dead_letter_queue
                .as_deref()
                .map_or_else(|| "-".into(), |d| format!(r#"<a href="{b}/dlq/{d}">{d}</a>"#, d = esc(d))),
        ]);
    }
    body.push_str("<h2>Settings</h2>");
    body.push_str(&html::table("settings", &["Setting", "Value"], &settings));
    body.push_str(&super::charts::render(st, &stats, Some(q), Some(g)));

    if gs.mode == GroupMode::WorkQueue {
        body.push_str(&find_job(st, &b, q, g, job).await?);
        let claims = st.source.pending(q, g).await?;
        let count = |s: PendingState| claims.iter().filter(|c| c.state == s).count();
        let _ = write!(
            body,
            r#"<h2>Claims</h2><p class="summary" id="claim-counts">{} leased · {} <span class="{}">expired</span> · {} waiting for a retry</p>"#,
            count(PendingState::Leased),
            count(PendingState::Expired),
            if count(PendingState::Expired) > 0 { "bad" } else { "" },
            count(PendingState::Waiting),
        );
        let rows: Vec<_> = claims
            .iter()
            .take(MAX_CLAIMS)
            .map(|c| {
                let state = format!(r#"<span class="state {0}">{0}</span>"#, label(c.state));
                vec![
                    format!(r#"<a href="{b}/queues/{qn}?order=oldest&from={s}&limit=1">{s}</a>"#, s = c.seq),
                    state,
                    c.attempt.to_string(),
                    esc(c.holder.as_deref().unwrap_or("-")),
                    fmt::opt_when(c.lease_deadline, now),
                    fmt::opt_when(c.retry_at, now),
                    esc(c.last_error.as_deref().unwrap_or("-")),
                    super::job_actions::buttons(ctx, q, g, c.seq, label(c.state)),
                ]
            })
            .collect();
        if claims.len() > MAX_CLAIMS {
            let _ = write!(
                body,
                r#"<p class="summary">Showing the first {MAX_CLAIMS} of {} (all of them: <a href="{b}/api/queues/{qn}/groups/{gn}/pending">JSON</a>).</p>"#,
                claims.len()
            );
        }
        let headers =
            ["Seq", "State", "Attempt", "Holder", "Lease deadline", "Retry at", "Last error", "Actions"];
        body.push_str(&html::table("claims", &headers, &rows));
        // The errors behind the retries, most frequent first.
        let mut errors: HashMap<&str, (usize, u32)> = HashMap::new();
        for c in &claims {
            if let Some(e) = c.last_error.as_deref() {
                let entry = errors.entry(e).or_default();
                entry.0 += 1;
                entry.1 = entry.1.max(c.attempt);
            }
        }
        let mut errors: Vec<_> = errors.into_iter().collect();
        errors.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
        let rows: Vec<_> = errors
            .iter()
            .take(10)
            .map(|(e, (n, max))| vec![esc(e), n.to_string(), max.to_string()])
            .collect();
        body.push_str("<h2>Last errors</h2>");
        body.push_str(&html::table("last-errors", &["Error", "Messages", "Highest attempt"], &rows));
    }

    if let Some(csrf) = ctx.csrf() {
        let _ = write!(
            body,
            r#"<h2>Actions</h2><p>{} {}</p><form class="reset" method="post" action="{b}/groups/{qn}/{gn}/reset">{csrf}<b>Reset</b> to
<select name="target"><option value="seq">sequence</option><option value="time">time</option><option value="earliest">earliest</option><option value="latest">latest</option></select>
<input name="value" placeholder="42, 2026-11-25T01:00:00Z, 1764032400 or 15m"> <button id="reset-{qn}-{gn}">Reset…</button></form>"#,
            tables::button(
                &ctx.base,
                csrf,
                &format!("/groups/{q}/{g}/{}", if gs.paused { "resume" } else { "pause" }),
                if gs.paused { "Resume" } else { "Pause" },
                if gs.paused { "group-resume" } else { "group-pause" },
            ),
            tables::button(
                &ctx.base,
                csrf,
                &format!("/groups/{q}/{g}/delete"),
                "Delete group…",
                "delete-group"
            ),
            csrf = html::csrf_field(csrf),
        );
    }
    Ok(ctx.page(&format!("Group {g} on {q}"), None, &body))
}
