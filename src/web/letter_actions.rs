//! The per-letter buttons of a dead-letter queue: redrive this one (to its origin queue), and
//! delete it (after a confirmation). Each calls `DeadLetters::redrive_one` / `delete`.

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
use super::tables::button;

/// The buttons of letter `seq` of `dlq` (an operator's page only).
pub(crate) fn buttons(ctx: &Ctx, dlq: &str, seq: u64) -> String {
    let Some(csrf) = ctx.csrf() else { return "-".into() };
    let path = |verb: &str| format!("/dlq/{dlq}/letters/{seq}/{verb}");
    format!(
        "{} {}",
        button(&ctx.base, csrf, &path("redrive"), "Redrive", &format!("redrive-letter-{seq}")),
        button(&ctx.base, csrf, &path("delete"), "Delete…", &format!("delete-letter-{seq}")),
    )
}

/// POST `/dlq/{queue}/letters/{seq}/redrive` and `/delete`.
pub(crate) async fn act(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((dlq, seq, verb)): Path<(String, String, String)>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let dlq = input::name("dead-letter queue", &dlq)?;
        let seq = input::seq("letter", &seq)?;
        // `Broker::dead_letters` would create a missing queue: a typo must create nothing.
        if !broker.queue_names().iter().any(|n| n == dlq) {
            return Err(Failure::not_found(format!("queue {dlq:?} does not exist")));
        }
        st.source.check_dead_letter_queue(dlq).await?;
        let letters = broker.dead_letters(dlq).await?;
        let back = format!("/dlq/{dlq}");
        match verb.as_str() {
            "redrive" => {
                let (queue, to) = letters.redrive_one(seq, None).await?;
                Ok(done(&ctx, &back, json!({ "dlq": dlq, "seq": seq, "queue": queue, "new_seq": to })))
            }
            "delete" => {
                let question = format!(
                    "Delete dead letter <b>#{seq}</b> of <b>{}</b>? It is no longer listed, counted or redriven; the letters around it stay.",
                    esc(dlq)
                );
                let action = format!("/dlq/{dlq}/letters/{seq}/delete");
                if let Some(page) = confirmed(&ctx, &f, &action, &[], &question, "Yes, delete the letter", &back) {
                    return Ok(page);
                }
                letters.delete(seq).await?;
                Ok(done(&ctx, &back, json!({ "dlq": dlq, "seq": seq, "deleted": true })))
            }
            other => Err(Failure::not_found(format!(
                "no dead-letter action {:?} (redrive, delete)",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }
    .await;
    ctx.render(r)
}
