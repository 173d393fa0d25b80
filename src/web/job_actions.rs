//! The per-job buttons of a work group: retry now, delete, dead-letter (the last two after a
//! confirmation). Each calls the public `Broker` method of the same name; a job held by a live
//! lease is refused there (409), never taken from its holder.

use std::sync::Arc;

use axum::extract::{Path, State as AxState};
use axum::response::Response;
use serde_json::json;

use super::actions::{Fields, authorized, done};
use super::confirm::confirmed;
use super::ctx::Ctx;
use super::failure::Failure;
use super::html::esc;
use super::input;
use super::state::State;

/// The buttons for one job in `state` (`retrying`, `expired`, `open`, `parked`...): retry now
/// only for one waiting for a retry; delete and dead-letter for any not held by a lease.
pub(crate) fn buttons(ctx: &Ctx, queue: &str, group: &str, seq: u64, state: &str) -> String {
    let Some(csrf) = ctx.csrf() else { return String::new() };
    if matches!(state, "leased" | "done" | "dead") {
        return String::new();
    }
    let path = |verb: &str| format!("/groups/{queue}/{group}/jobs/{seq}/{verb}");
    let mut out = String::new();
    if matches!(state, "retrying" | "waiting") {
        out.push_str(&super::tables::button(
            &ctx.base,
            csrf,
            &path("retry"),
            "Retry now",
            &format!("retry-{seq}"),
        ));
        out.push(' ');
    }
    out.push_str(&super::tables::button(
        &ctx.base,
        csrf,
        &path("delete"),
        "Delete…",
        &format!("delete-{seq}"),
    ));
    out.push(' ');
    out.push_str(&super::tables::button(
        &ctx.base,
        csrf,
        &path("dead-letter"),
        "Dead-letter…",
        &format!("dead-letter-{seq}"),
    ));
    out
}

/// POST `/groups/{queue}/{group}/jobs/{seq}/{verb}`: `retry`, `delete`, `dead-letter`
/// (`reason` optional).
pub(crate) async fn act(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((queue, group, seq, verb)): Path<(String, String, String, String)>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let (q, g) = (input::name("queue", &queue)?, input::name("group", &group)?);
        let seq = input::seq("job", &seq)?;
        let back = format!("/groups/{q}/{g}");
        let action = format!("/groups/{q}/{g}/jobs/{seq}/{verb}");
        match verb.as_str() {
            "retry" => broker.retry_job_now(q, g, seq).await?,
            "delete" => {
                let question = format!(
                    "Delete job <b>#{seq}</b> of group <b>{}</b> on <b>{}</b>? The group moves past it without running it (as if it were acked); the message stays in the queue for other groups.",
                    esc(g),
                    esc(q)
                );
                if let Some(page) = confirmed(&ctx, &f, &action, &[], &question, "Yes, delete the job", &back) {
                    return Ok(page);
                }
                broker.delete_job(q, g, seq).await?;
            }
            "dead-letter" => {
                let reason = f.get("reason").map(|r| r.trim()).filter(|r| !r.is_empty());
                let reason = reason.map_or_else(|| "dead-lettered by an operator from the console".to_owned(), str::to_owned);
                if reason.len() > 4096 {
                    return Err(Failure::bad_request("the reason is longer than 4096 bytes"));
                }
                if !ctx.api && f.get("confirm").map(String::as_str) != Some("yes") {
                    let body = format!(
                        r#"<p id="confirm-text" class="confirm">Move job <b>#{seq}</b> of group <b>{g}</b> on <b>{q}</b> to its dead-letter queue now?</p>
<form method="post" action="{b}{a}">{csrf}<input type="hidden" name="confirm" value="yes"><label>Reason <input name="reason" id="reason" size="50" value="{r}"></label> <button id="confirm" class="danger">Yes, dead-letter</button> <a id="cancel" href="{b}{back}">Cancel</a></form>"#,
                        g = esc(g),
                        q = esc(q),
                        b = esc(&ctx.base),
                        a = esc(&action),
                        csrf = super::html::csrf_field(f.get("csrf").map(String::as_str).unwrap_or("")),
                        r = esc(&reason),
                        back = esc(&back),
                    );
                    return Ok(ctx.page("Confirm", None, &body));
                }
                broker.dead_letter_job(q, g, seq, reason).await?;
            }
            other => {
                return Err(Failure::not_found(format!(
                    "no job action {:?} (retry, delete, dead-letter)",
                    other.chars().take(40).collect::<String>()
                )));
            }
        }
        Ok(done(&ctx, &back, json!({ "queue": q, "group": g, "seq": seq, "done": verb })))
    }
    .await;
    ctx.render(r)
}
