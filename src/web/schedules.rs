//! Delayed messages and recurring schedules: what is due when, and for an operator, pause,
//! resume and delete of a schedule (after a confirmation for the delete).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Query, State as AxState};
use axum::response::Response;
use serde_json::json;

use super::actions::{Fields, authorized, done};
use super::ctx::Ctx;
use super::failure::Failure;
use super::fmt;
use super::html::{self, esc};
use super::input;
use super::state::State;
use super::tables::button;
use crate::schedule::Missed;

/// GET `/delayed?queue=Q`: delayed messages (of one queue, or all) and every schedule.
pub(crate) async fn page(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    ctx.render(render(&st, &ctx, &p).await)
}

async fn render(st: &State, ctx: &Ctx, p: &HashMap<String, String>) -> Result<Response, Failure> {
    let queue = p
        .get("queue")
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .map(|q| input::name("queue", q))
        .transpose()?;
    let limit = input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?
        .unwrap_or(100) as usize;
    let now = SystemTime::now();
    let b = esc(&ctx.base);
    let mut body = String::new();

    let schedules = st.source.schedules().await?;
    let rows: Vec<_> = schedules
        .iter()
        .filter(|s| queue.is_none_or(|q| q == s.queue))
        .map(|s| {
            let mut actions = String::new();
            if let Some(csrf) = ctx.csrf() {
                let n = &s.name;
                let (verb, label) = if s.paused { ("resume", "Resume") } else { ("pause", "Pause") };
                actions.push_str(&button(
                    &ctx.base,
                    csrf,
                    &format!("/schedules/{n}/{verb}"),
                    label,
                    &format!("{verb}-schedule-{n}"),
                ));
                actions.push(' ');
                actions.push_str(&button(
                    &ctx.base,
                    csrf,
                    &format!("/schedules/{n}/delete"),
                    "Delete…",
                    &format!("delete-schedule-{n}"),
                ));
            } else {
                actions.push('-');
            }
            vec![
                esc(&s.name),
                format!(r#"<a href="{b}/queues/{q}">{q}</a>"#, q = esc(&s.queue)),
                format!("<code>{}</code>", esc(&s.recurrence)),
                if s.paused {
                    r#"<span class="badge warn">paused</span>"#.into()
                } else {
                    fmt::opt_when(s.next, now)
                },
                s.last.map_or_else(|| "-".into(), |(t, seq)| format!("{} → #{seq}", fmt::when(t, now))),
                s.fired.to_string(),
                if s.missed_firings > 0 {
                    format!(r#"<span class="warn">{}</span>"#, s.missed_firings)
                } else {
                    "0".into()
                },
                format!(
                    "{} (grace {})",
                    match s.missed {
                        Missed::Skip => "skip",
                        _ => "catch up once",
                    },
                    html::duration(s.grace)
                ),
                actions,
            ]
        })
        .collect();
    body.push_str("<h2>Recurring schedules</h2>");
    body.push_str(&html::table(
        "schedules",
        &[
            "Schedule",
            "Queue",
            "Recurrence",
            "Next",
            "Last firing",
            "Fired",
            "Missed",
            "When missed",
            "Actions",
        ],
        &rows,
    ));

    let delayed = st.source.delayed(queue, limit).await?;
    let _ = write!(
        body,
        r#"<h2>Delayed messages{}</h2><p class="summary">Showing {} (at most {limit}), in the order they were sent; each is appended to its queue when due.</p>"#,
        queue.map_or_else(String::new, |q| format!(" of {}", esc(q))),
        delayed.len()
    );
    let rows: Vec<_> = delayed
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                format!(r#"<a href="{b}/queues/{q}">{q}</a>"#, q = esc(&d.queue)),
                fmt::when(d.due, now),
                fmt::when(d.sent_at, now),
                esc(d.key.as_deref().unwrap_or("-")),
                fmt::bytes(d.payload_len as u64),
            ]
        })
        .collect();
    body.push_str(&html::table("delayed", &["Id", "Queue", "Due", "Sent", "Key", "Payload"], &rows));
    Ok(ctx.page("Delayed and scheduled", None, &body))
}

/// POST `/schedules/{name}/pause`, `/resume` and `/delete` (the delete after a confirmation).
pub(crate) async fn act(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((name, verb)): Path<(String, String)>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let n = input::name("schedule", &name)?;
        match verb.as_str() {
            "pause" => broker.pause_schedule(n).await?,
            "resume" => broker.resume_schedule(n).await?,
            "delete" => {
                let question = format!(
                    "Delete schedule <b>{}</b>? It fires no more; the messages it already sent stay in their queue.",
                    esc(n)
                );
                let action = format!("/schedules/{n}/delete");
                if let Some(page) =
                    super::confirm::confirmed(&ctx, &f, &action, &[], &question, "Yes, delete", "/delayed")
                {
                    return Ok(page);
                }
                let deleted = broker.delete_schedule(n).await?;
                return Ok(done(&ctx, "/delayed", json!({ "schedule": n, "deleted": deleted })));
            }
            other => {
                return Err(Failure::not_found(format!(
                    "no schedule action {:?} (pause, resume, delete)",
                    other.chars().take(40).collect::<String>()
                )));
            }
        }
        Ok(done(&ctx, "/delayed", json!({ "schedule": n, "paused": verb == "pause" })))
    }
    .await;
    ctx.render(r)
}
