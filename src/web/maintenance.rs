//! The destructive actions: purge and delete of queues and groups, and a retention pass with
//! its report. Like a reset, a browser form first gets a confirmation page that says exactly
//! what will be removed (the form posts again with `confirm=yes`); the JSON API acts at once,
//! its caller having decided. Each goes through the public `Broker` calls only.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, State as AxState};
use axum::response::Response;
use serde_json::json;

use super::actions::{Fields, authorized, done};
use super::confirm::confirmed;
use super::ctx::Ctx;
use super::fmt;
use super::html::{self, esc};
use super::input;
use super::state::State;

/// POST `/queues/{queue}/purge`: deletes every stored message; groups move past them.
pub(crate) async fn purge_queue(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(queue): Path<String>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let q = input::name("queue", &queue)?;
        let stats = broker.stats().await?;
        let qs = super::source::queue_in(&stats, q)?;
        let groups = stats.groups.iter().filter(|g| g.queue == q).count();
        let question = format!(
            "Purge queue <b>{}</b>? Its {} stored messages (#{}..=#{}, {}) are deleted for good, and its {groups} groups move past them. New messages continue from #{}.",
            esc(q),
            qs.len,
            qs.first_seq,
            qs.last_seq,
            fmt::human_bytes(qs.bytes),
            qs.last_seq + 1,
        );
        if let Some(page) = confirmed(&ctx, &f, &format!("/queues/{q}/purge"), &[], &question, "Yes, purge", &format!("/queues/{q}")) {
            return Ok(page);
        }
        let purged = broker.purge_queue(q).await?;
        Ok(done(&ctx, &format!("/queues/{q}"), json!({ "queue": q, "purged": purged })))
    }
    .await;
    ctx.render(r)
}

/// POST `/queues/{queue}/delete`: the queue, its messages, groups and schedules.
pub(crate) async fn delete_queue(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(queue): Path<String>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let q = input::name("queue", &queue)?;
        let stats = broker.stats().await?;
        let qs = super::source::queue_in(&stats, q)?;
        let groups: Vec<_> = stats.groups.iter().filter(|g| g.queue == q).map(|g| esc(&g.group)).collect();
        let question = format!(
            "Delete queue <b>{}</b>? Its {} stored messages and {} delayed ones, and its groups ({}) with their offsets and claims, are deleted for good. Producers that still send to it create it anew.",
            esc(q),
            qs.len,
            qs.scheduled,
            if groups.is_empty() { "none".to_owned() } else { groups.join(", ") },
        );
        if let Some(page) = confirmed(&ctx, &f, &format!("/queues/{q}/delete"), &[], &question, "Yes, delete the queue", &format!("/queues/{q}")) {
            return Ok(page);
        }
        let deleted = broker.delete_queue(q).await?;
        Ok(done(&ctx, "/", json!({ "queue": q, "deleted": deleted })))
    }
    .await;
    ctx.render(r)
}

/// POST `/groups/{queue}/{group}/delete`: the group's offset, claims and settings.
pub(crate) async fn delete_group(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((queue, group)): Path<(String, String)>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let (q, g) = (input::name("queue", &queue)?, input::name("group", &group)?);
        let stats = broker.stats().await?;
        let gs = super::source::group_in(&stats, q, g)?;
        let question = format!(
            "Delete group <b>{}</b> of <b>{}</b>? Its offset (committed at {}, lag {}), its {} claims in flight and {} waiting for a retry are forgotten; the queue's messages stay. Its running subscriptions and pools end.",
            esc(g),
            esc(q),
            gs.committed,
            gs.lag,
            gs.in_flight,
            gs.waiting_retry,
        );
        let action = format!("/groups/{q}/{g}/delete");
        if let Some(page) = confirmed(&ctx, &f, &action, &[], &question, "Yes, delete the group", &format!("/groups/{q}/{g}")) {
            return Ok(page);
        }
        let deleted = broker.delete_group(q, g).await?;
        Ok(done(&ctx, &format!("/queues/{q}"), json!({ "queue": q, "group": g, "deleted": deleted })))
    }
    .await;
    ctx.render(r)
}

/// POST `/trim`: a retention pass now, after a confirmation; the browser gets a report of
/// what it deleted.
pub(crate) async fn trim(AxState(st): AxState<Arc<State>>, ctx: Ctx, f: Fields) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let question = "Run a retention pass now? Each queue's retention policy decides what is deleted (until-acked: what every group has finished; max-age; max-len); expired idempotency keys are forgotten, then the database is compacted.";
        if let Some(page) = confirmed(&ctx, &f, "/trim", &[], question, "Yes, trim now", "/") {
            return Ok(page);
        }
        let mut report = broker.trim().await?;
        // By queue name: the report reads like the overview, and the same pass reads the same.
        report.trimmed.sort();
        if ctx.api {
            return Ok(done(
                &ctx,
                "/",
                json!({
                    "deleted": report.deleted, "bytes_before": report.bytes_before,
                    "bytes_after": report.bytes_after, "compacted": report.compacted,
                    "dedup_expired": report.dedup_expired,
                    "trimmed": report.trimmed.iter().map(|(q, n, first)| json!({ "queue": q, "deleted": n, "first_seq": first })).collect::<Vec<_>>(),
                }),
            ));
        }
        let rows: Vec<_> = report
            .trimmed
            .iter()
            .map(|(q, deleted, first)| {
                vec![
                    format!(r#"<a href="{}/queues/{q}">{q}</a>"#, esc(&ctx.base), q = esc(q)),
                    deleted.to_string(),
                    format!("#{first}"),
                ]
            })
            .collect();
        let mut body = format!(
            r#"<p id="trim-report">Deleted <b id="trim-deleted">{}</b> messages; {} expired idempotency keys forgotten. Database {} → {}{}.</p>"#,
            report.deleted,
            report.dedup_expired,
            fmt::bytes(report.bytes_before),
            fmt::bytes(report.bytes_after),
            if report.compacted { " (compacted)" } else { "" },
        );
        body.push_str(&html::table("trimmed", &["Queue", "Deleted", "First now"], &rows));
        let _ = write!(body, r#"<p><a href="{}">Back to the overview</a></p>"#, esc(ctx.home()));
        Ok(ctx.page("Trim report", None, &body))
    }
    .await;
    ctx.render(r)
}
