//! The HTML pages (GET, read-only): overview with charts, queue detail, dead letters, a
//! redrive's progress, and the login form. Forms for actions are rendered only for a
//! logged-in operator of a writable console, each with the session's CSRF token.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, Query, State as AxState};
use axum::response::Response;

use super::chart::{self, Series};
use super::ctx::Ctx;
use super::failure::Failure;
use super::history::rates;
use super::html::{self, View, esc};
use super::input;
use super::state::State;
use crate::retention::Retention;
use crate::stats::{GroupMode, GroupStats, QueueStats, Stats};

type Params = Query<HashMap<String, String>>;

/// Pending claims shown per group on a queue page (a pool of thousands would bury the page;
/// the JSON lists all).
const MAX_CLAIMS: usize = 200;

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
fn button(base: &str, csrf: &str, path: &str, label: &str, id: &str) -> String {
    format!(
        r#"<form class="inline" method="post" action="{}{}">{}<button id="{}">{}</button></form>"#,
        esc(base),
        esc(path),
        html::csrf_field(csrf),
        esc(id),
        esc(label)
    )
}

fn queue_row(base: &str, q: &QueueStats, dlqs: &[&str]) -> Vec<String> {
    let name = esc(&q.name);
    let link = if dlqs.contains(&q.name.as_str()) {
        format!(
            r#"<a href="{b}/queues/{name}">{name}</a> <a class="tag" href="{b}/dlq/{name}">dead letters</a>"#,
            b = esc(base)
        )
    } else {
        format!(r#"<a href="{}/queues/{name}">{name}</a>"#, esc(base))
    };
    vec![
        link,
        q.len.to_string(),
        q.first_seq.to_string(),
        q.last_seq.to_string(),
        q.bytes_on_disk.to_string(),
        html::opt_duration(q.oldest_age),
        esc(&retention(&q.retention)),
        q.scheduled.to_string(),
    ]
}

const QUEUE_HEADERS: &[&str] =
    &["Queue", "Len", "First", "Last", "Bytes", "Oldest", "Retention", "Scheduled"];
const GROUP_HEADERS: &[&str] = &[
    "Queue",
    "Group",
    "Mode",
    "Committed",
    "Lag",
    "Lag age",
    "In flight",
    "Waiting retry",
    "Paused",
    "DLQ",
    "DLQ depth",
    "Actions",
];

fn group_row(ctx: &Ctx, g: &GroupStats) -> Vec<String> {
    let b = esc(&ctx.base);
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
    vec![
        format!(r#"<a href="{b}/queues/{q}">{q}</a>"#, q = esc(&g.queue)),
        esc(&g.group),
        g.mode.as_str().into(),
        g.committed.to_string(),
        g.lag.to_string(),
        html::opt_duration(g.oldest_unacked_age),
        g.in_flight.to_string(),
        g.waiting_retry.to_string(),
        if g.paused { r#"<span class="paused">paused</span>"#.into() } else { "no".into() },
        g.dead_letter_queue
            .as_ref()
            .map_or_else(|| "-".into(), |d| format!(r#"<a href="{b}/dlq/{d}">{d}</a>"#, d = esc(d))),
        g.dlq_depth.to_string(),
        actions,
    ]
}

/// Names of dead-letter queues: those stored with a group, and any `*.dlq`.
fn dlq_names(stats: &Stats) -> Vec<&str> {
    super::source::dead_letter_queues(stats)
}

/// Charts of every queue (enqueued per second) and group (lag, and acknowledged per second).
fn charts(state: &State, stats: &Stats, only_queue: Option<&str>) -> String {
    let h = state.history.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::from(r#"<div class="charts" id="charts">"#);
    for q in stats.queues.iter().filter(|q| only_queue.is_none_or(|o| o == q.name)) {
        let Some(ring) = h.queues.get(&q.name) else { continue };
        let rate = rates(ring, |p| (p.at, p.wall, p.last_seq));
        let len = ring.iter().map(|p| (p.wall, p.len as f64)).collect();
        let series = [
            Series { label: "enqueued/s", class: "rate", points: rate },
            Series { label: "length", class: "len", points: len },
        ];
        let _ = write!(out, "<figure>{}</figure>", chart::render(&format!("queue {}", q.name), &series));
    }
    for g in stats.groups.iter().filter(|g| only_queue.is_none_or(|o| o == g.queue)) {
        let Some(ring) = h.groups.get(&(g.queue.clone(), g.group.clone())) else { continue };
        let lag = ring.iter().map(|p| (p.wall, p.lag as f64)).collect();
        let acked = rates(ring, |p| (p.at, p.wall, p.committed));
        let age = ring.iter().map(|p| (p.wall, p.lag_age.map_or(0.0, |d| d.as_secs_f64()))).collect();
        let series = [
            Series { label: "lag", class: "lag", points: lag },
            Series { label: "acked/s", class: "rate", points: acked },
            Series { label: "lag age (s)", class: "age", points: age },
        ];
        let title = format!("group {}/{}", g.queue, g.group);
        let _ = write!(out, "<figure>{}</figure>", chart::render(&title, &series));
    }
    out.push_str("</div>");
    out
}

/// GET `/`.
pub(crate) async fn overview(AxState(st): AxState<Arc<State>>, ctx: Ctx) -> Response {
    ctx.render(overview_page(&st, &ctx).await)
}

async fn overview_page(st: &State, ctx: &Ctx) -> Result<Response, Failure> {
    let stats = st.source.stats().await?;
    let dlqs = dlq_names(&stats);
    let queues: Vec<_> = stats.queues.iter().map(|q| queue_row(&ctx.base, q, &dlqs)).collect();
    let groups: Vec<_> = stats.groups.iter().map(|g| group_row(ctx, g)).collect();
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<p class="summary">{} queues · {} groups · database <span id="db-bytes">{}</span> bytes</p>"#,
        stats.queues.len(),
        stats.groups.len(),
        stats.bytes_on_disk
    );
    body.push_str("<h2>Queues</h2>");
    body.push_str(&html::table("queues", QUEUE_HEADERS, &queues));
    body.push_str("<h2>Groups</h2>");
    body.push_str(&html::table("groups", GROUP_HEADERS, &groups));
    if !stats.keyspaces.is_empty() {
        let rows: Vec<_> =
            stats.keyspaces.iter().map(|k| vec![html::esc(&k.name), k.keys.to_string()]).collect();
        body.push_str("<h2>Keyspaces</h2>");
        body.push_str(&html::table("keyspaces", &["Keyspace", "Keys"], &rows));
    }
    body.push_str("<h2>Throughput and lag</h2>");
    body.push_str(&charts(st, &stats, None));
    if let Some(csrf) = ctx.csrf() {
        body.push_str("<h2>Maintenance</h2><p>Run a retention pass now (deletes what the retention policies allow, then compacts): ");
        body.push_str(&button(&ctx.base, csrf, "/trim", "Trim now", "trim"));
        body.push_str("</p>");
    }
    let refresh = (st.config.refresh > 0).then_some(st.config.refresh);
    Ok(ctx.page("Overview", refresh, &body))
}

/// GET `/queues/{queue}`.
pub(crate) async fn queue(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(name): Path<String>,
    Query(p): Params,
) -> Response {
    ctx.render(queue_page(&st, &ctx, &name, &p).await)
}

async fn queue_page(
    st: &State,
    ctx: &Ctx,
    name: &str,
    p: &HashMap<String, String>,
) -> Result<Response, Failure> {
    let name = input::name("queue", name)?;
    let from = p
        .get("from")
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .map(|s| input::seq("from", s))
        .transpose()?;
    let limit = input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?
        .unwrap_or(20) as usize;
    let view = View::parse(p.get("view").map(String::as_str));
    let stats = st.source.stats().await?;
    let q = stats
        .queues
        .iter()
        .find(|q| q.name == name)
        .ok_or_else(|| Failure::not_found(format!("queue {name:?} does not exist")))?;
    let b = esc(&ctx.base);
    let n = esc(name);
    let mut body = String::new();
    body.push_str(&html::table("queue", QUEUE_HEADERS, &[queue_row(&ctx.base, q, &dlq_names(&stats))]));
    body.push_str(&charts(st, &stats, Some(name)));

    body.push_str("<h2>Groups</h2>");
    let groups: Vec<_> = stats.groups.iter().filter(|g| g.queue == name).collect();
    body.push_str(&html::table(
        "groups",
        GROUP_HEADERS,
        &groups.iter().map(|g| group_row(ctx, g)).collect::<Vec<_>>(),
    ));
    if let Some(csrf) = ctx.csrf() {
        for g in &groups {
            let _ = write!(
                body,
                r#"<form class="reset" method="post" action="{b}/groups/{n}/{gn}/reset">{csrf}<b>Reset {gn}</b> to
<select name="target"><option value="seq">sequence</option><option value="time">time</option><option value="earliest">earliest</option><option value="latest">latest</option></select>
<input name="value" placeholder="42, 2026-11-25T01:00:00Z, 1764032400 or 15m"> <button id="reset-{n}-{gn}">Reset…</button></form>"#,
                gn = esc(&g.group),
                csrf = html::csrf_field(csrf),
            );
        }
    }

    for g in groups.iter().filter(|g| g.mode == GroupMode::WorkQueue) {
        let claims = st.source.pending(name, &g.group).await?;
        let rows: Vec<_> = claims
            .iter()
            .take(MAX_CLAIMS)
            .map(|c| {
                vec![
                    c.seq.to_string(),
                    c.state.as_str().into(),
                    c.attempt.to_string(),
                    esc(c.holder.as_deref().unwrap_or("-")),
                    html::opt_time(c.lease_deadline),
                    html::opt_time(c.retry_at),
                    esc(c.last_error.as_deref().unwrap_or("-")),
                ]
            })
            .collect();
        let _ = write!(body, "<h2>Pending claims of {}</h2>", esc(&g.group));
        if claims.len() > MAX_CLAIMS {
            let _ = write!(
                body,
                r#"<p class="summary">Showing the first {MAX_CLAIMS} of {} (all of them: <a href="{b}/api/queues/{n}/groups/{g}/pending">JSON</a>).</p>"#,
                claims.len(),
                g = esc(&g.group)
            );
        }
        let headers = ["Seq", "State", "Attempt", "Holder", "Lease deadline", "Retry at", "Last error"];
        body.push_str(&html::table(&format!("pending-{}", g.group), &headers, &rows));
    }

    let msgs = st.source.peek(name, from, limit).await?;
    let _ = write!(body, r#"<h2>Messages</h2><p class="views">Payload as "#);
    let from_q = from.map_or_else(String::new, |f| format!("&from={f}"));
    for v in [View::Text, View::Json, View::Hex] {
        let cls = if v == view { r#" class="current""# } else { "" };
        let _ = write!(
            body,
            r#"<a{cls} href="{b}/queues/{n}?view={}&limit={limit}{from_q}">{}</a> "#,
            v.as_str(),
            v.as_str()
        );
    }
    body.push_str("</p>");
    let rows: Vec<_> = msgs
        .iter()
        .map(|m| {
            vec![
                m.seq.to_string(),
                html::time(m.enqueued_at),
                html::headers(&m.headers),
                html::payload(&m.payload, view, 4096),
            ]
        })
        .collect();
    body.push_str(&html::table("messages", &["Seq", "Enqueued", "Headers", "Payload"], &rows));
    if let Some(last) = msgs.last().filter(|_| msgs.len() == limit) {
        let _ = write!(
            body,
            r#"<p><a href="{b}/queues/{n}?view={}&limit={limit}&from={}">Next {limit} →</a></p>"#,
            view.as_str(),
            last.seq + 1
        );
    }
    Ok(ctx.page(&format!("Queue {name}"), None, &body))
}

/// GET `/dlq/{queue}`.
pub(crate) async fn dead_letters(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(name): Path<String>,
    Query(p): Params,
) -> Response {
    ctx.render(dlq_page(&st, &ctx, &name, &p).await)
}

async fn dlq_page(
    st: &State,
    ctx: &Ctx,
    name: &str,
    p: &HashMap<String, String>,
) -> Result<Response, Failure> {
    let name = input::name("queue", name)?;
    let limit = input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?
        .unwrap_or(50) as usize;
    let view = View::parse(p.get("view").map(String::as_str));
    let letters = st.source.dead_letters(name, limit).await?;
    st.source.check_dead_letter_queue(name).await?;
    // After the listing, which checked that the queue exists (`dead_letters` would create it).
    let depth = st.source.dlq_depth(name).await?;
    let (b, n) = (esc(&ctx.base), esc(name));
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<p>Dead letters not yet redriven: <b id="dlq-depth">{}</b> (showing the oldest {}). <a href="{b}/queues/{n}">The queue itself</a></p><p class="views">Payload as "#,
        depth.map_or_else(|| "?".into(), |d| d.to_string()),
        letters.len()
    );
    for v in [View::Text, View::Json, View::Hex] {
        let cls = if v == view { r#" class="current""# } else { "" };
        let _ = write!(
            body,
            r#"<a{cls} href="{b}/dlq/{n}?view={}&limit={limit}">{}</a> "#,
            v.as_str(),
            v.as_str()
        );
    }
    body.push_str("</p>");
    if let Some(csrf) = ctx.csrf() {
        let _ = write!(
            body,
            r#"<form class="redrive" method="post" action="{b}/dlq/{n}/redrive">{}<b>Redrive</b> to <input name="to" placeholder="origin queue (default)"> at most <input name="limit" size="8" placeholder="all"> <button id="redrive">Redrive</button></form>"#,
            html::csrf_field(csrf)
        );
    }
    let rows: Vec<_> = letters
        .iter()
        .map(|d| {
            let origin = match (&d.queue, d.seq) {
                (Some(q), Some(s)) => {
                    format!(r#"<a href="{b}/queues/{q}?from={s}&limit=1">{q}#{s}</a>"#, q = esc(q))
                }
                (Some(q), None) => esc(q),
                _ => "-".into(),
            };
            vec![
                d.dlq_seq.to_string(),
                origin,
                esc(d.group.as_deref().unwrap_or("-")),
                d.attempts.to_string(),
                esc(&d.reason),
                html::time(d.enqueued_at),
                html::time(d.dead_lettered_at),
                if d.headers.is_empty() {
                    html::payload(&d.payload, view, 4096)
                } else {
                    format!("{}{}", html::headers(&d.headers), html::payload(&d.payload, view, 4096))
                },
            ]
        })
        .collect();
    let headers =
        ["DLQ seq", "Origin", "Group", "Attempts", "Reason", "Enqueued", "Dead-lettered", "Payload"];
    body.push_str(&html::table("dead-letters", &headers, &rows));
    Ok(ctx.page(&format!("Dead letters of {name}"), None, &body))
}

/// GET `/jobs/{id}`: a redrive's progress; reloads itself every second until done.
pub(crate) async fn job(AxState(st): AxState<Arc<State>>, ctx: Ctx, Path(id): Path<String>) -> Response {
    let r = async {
        let id = input::seq("job id", &id)?;
        let p = st.jobs.get(id).ok_or_else(|| Failure::not_found(format!("no redrive job {id} (only the last 32 are kept)")))?.borrow().clone();
        let state = match (&p.error, p.done) {
            (Some(e), _) => format!(r#"<span class="error">failed: {}</span> (the chunks before the error stay moved)"#, esc(e)),
            (None, true) => "done".into(),
            (None, false) => "running…".into(),
        };
        let body = format!(
            r#"<p>Redrive of <a href="{b}/dlq/{d}">{d}</a> to {to}: <span id="job-state">{state}</span></p>
<p><progress max="{t}" value="{m}"></progress> <span id="job-moved">{m}</span> of <span id="job-total">{t}</span> moved</p>"#,
            b = esc(&ctx.base),
            d = esc(&p.dlq),
            to = p.to.as_deref().map_or_else(|| "their origin queues".into(), esc),
            t = p.total,
            m = p.moved,
        );
        Ok(ctx.page(&format!("Redrive {id}"), (!p.done).then_some(1), &body))
    }
    .await;
    ctx.render(r)
}

/// GET `/login`.
pub(crate) async fn login_form(ctx: Ctx) -> Response {
    if !ctx.writable {
        return ctx.fail(super::auth::read_only());
    }
    let body = format!(
        r#"<form method="post" action="{}/login" class="login"><label>Console token <input type="password" name="token" id="token" autocomplete="current-password"></label> <button id="login">Log in</button></form>"#,
        esc(&ctx.base)
    );
    ctx.page("Log in", None, &body)
}
