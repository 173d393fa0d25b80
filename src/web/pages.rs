//! The HTML pages (GET, read-only): overview with charts, queue detail, dead letters, a
//! redrive's progress, and the login form. Forms for actions are rendered only for a
//! logged-in operator of a writable console, each with the session's CSRF token.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, Query, State as AxState};
use axum::response::Response;

use super::charts;
use super::ctx::Ctx;
use super::failure::Failure;
use super::fmt;
use super::html::{self, View, esc};
use super::input;
use super::messages;
use super::state::State;
use super::tables::{self, GROUP_HEADERS, QUEUE_HEADERS, button};

type Params = Query<HashMap<String, String>>;

/// GET `/`.
pub(crate) async fn overview(AxState(st): AxState<Arc<State>>, ctx: Ctx) -> Response {
    ctx.render(overview_page(&st, &ctx).await)
}

async fn overview_page(st: &State, ctx: &Ctx) -> Result<Response, Failure> {
    let stats = st.source.stats().await?;
    let depths = tables::dlq_depths(&stats);
    let (queues, groups): (Vec<_>, Vec<_>) = {
        let h = st.history.lock().unwrap_or_else(|p| p.into_inner());
        (
            stats.queues.iter().map(|q| tables::queue_row(ctx, q, &h, &depths)).collect(),
            stats.groups.iter().map(|g| tables::group_row(ctx, g, &h)).collect(),
        )
    };
    let problems = stats.groups.iter().filter(|g| g.dlq_depth > 0 || g.paused).count();
    let delayed: u64 = stats.queues.iter().map(|q| q.scheduled).sum();
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<p class="summary">{} queues · {} groups{} · <a href="{}/delayed">{delayed} delayed</a> · database <span id="db-bytes">{}</span></p>"#,
        stats.queues.len(),
        stats.groups.len(),
        if problems > 0 {
            format!(r#" · <span class="bad" id="problems">{problems} need attention</span>"#)
        } else {
            String::new()
        },
        esc(&ctx.base),
        fmt::bytes(stats.bytes_on_disk),
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
    body.push_str(&charts::render(st, &stats, None, None));
    if let Some(csrf) = ctx.csrf() {
        body.push_str("<h2>Maintenance</h2><p>Run a retention pass now (deletes what the retention policies allow, then compacts; a confirmation and a report follow): ");
        body.push_str(&button(&ctx.base, csrf, "/trim", "Trim now…", "trim"));
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
    let stats = st.source.stats().await?;
    let q = super::source::queue_in(&stats, name)?;
    let groups: Vec<_> = stats.groups.iter().filter(|g| g.queue == name).collect();
    let depths = tables::dlq_depths(&stats);
    let mut body = String::new();
    {
        let h = st.history.lock().unwrap_or_else(|p| p.into_inner());
        body.push_str(&html::table("queue", QUEUE_HEADERS, &[tables::queue_row(ctx, q, &h, &depths)]));
        body.push_str("<h2>Groups</h2>");
        let rows: Vec<_> = groups.iter().map(|g| tables::group_row(ctx, g, &h)).collect();
        body.push_str(&html::table("groups", GROUP_HEADERS, &rows));
    }
    if let Some(csrf) = ctx.csrf() {
        let n = esc(name);
        let b = esc(&ctx.base);
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
        let _ = write!(
            body,
            r#"<p class="danger-zone">{} {}</p>"#,
            button(&ctx.base, csrf, &format!("/queues/{name}/purge"), "Purge messages…", "purge-queue"),
            button(&ctx.base, csrf, &format!("/queues/{name}/delete"), "Delete queue…", "delete-queue"),
        );
    }
    body.push_str(&charts::render(st, &stats, Some(name), None));
    body.push_str(&messages::section(st, ctx, &stats, q, p).await?);
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
    let now = std::time::SystemTime::now();
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
                fmt::when(d.enqueued_at, now),
                fmt::when(d.dead_lettered_at, now),
                if d.headers.is_empty() {
                    html::payload(&d.payload, view, 4096)
                } else {
                    format!("{}{}", html::headers(&d.headers), html::payload(&d.payload, view, 4096))
                },
                super::letter_actions::buttons(ctx, name, d.dlq_seq),
            ]
        })
        .collect();
    let headers = [
        "DLQ seq",
        "Origin",
        "Group",
        "Attempts",
        "Reason",
        "Enqueued",
        "Dead-lettered",
        "Payload",
        "Actions",
    ];
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
