//! `/api/...`: JSON for everything the pages show. Objects carry the fields of the library's
//! types under the same names ([`QueueStats`], [`GroupStats`], [`PendingClaim`],
//! [`StoredMessage`], [`DeadLetter`]); durations are seconds (`*_secs`), times microseconds
//! since the Unix epoch (`*_micros`), payloads `{"text": ...}` when UTF-8 or `{"hex": ...}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, Query, State as AxState};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ctx::Ctx;
use super::failure::Failure;
use super::history::rates;
use super::input;
use super::state::State;

fn secs(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_secs_f64()))
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A report in the library's one JSON shape (`Serialize` on the stats types, shared with the
/// CLI's `--json`).
fn to_json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn answer(ctx: &Ctx, r: Result<Value, Failure>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(f) => ctx.fail(f),
    }
}

/// GET `/api/stats`.
pub(crate) async fn get_stats(AxState(st): AxState<Arc<State>>, ctx: Ctx) -> Response {
    answer(&ctx, st.source.stats().await.map(|s| to_json(&s)))
}

/// GET `/api/history`: the sampled series behind the charts.
pub(crate) async fn history(AxState(st): AxState<Arc<State>>, ctx: Ctx) -> Response {
    let h = st.history.lock().unwrap_or_else(|p| p.into_inner());
    let queues: Vec<_> = h
        .queues
        .iter()
        .map(|(name, ring)| {
            let rate = rates(ring, |p| (p.at, p.wall, p.last_seq));
            json!({
                "queue": name,
                "samples": ring.iter().map(|p| json!({ "at_micros": micros(p.wall), "last_seq": p.last_seq, "len": p.len })).collect::<Vec<_>>(),
                "enqueued_per_sec": rate.iter().map(|(t, r)| json!({ "at_micros": micros(*t), "rate": r })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let groups: Vec<_> = h
        .groups
        .iter()
        .map(|((q, g), ring)| {
            let rate = rates(ring, |p| (p.at, p.wall, p.committed));
            json!({
                "queue": q, "group": g,
                "samples": ring.iter().map(|p| json!({
                    "at_micros": micros(p.wall), "lag": p.lag, "oldest_unacked_age_secs": secs(p.lag_age), "committed": p.committed,
                })).collect::<Vec<_>>(),
                "acked_per_sec": rate.iter().map(|(t, r)| json!({ "at_micros": micros(*t), "rate": r })).collect::<Vec<_>>(),
            })
        })
        .collect();
    answer(&ctx, Ok(json!({ "queues": queues, "groups": groups })))
}

/// GET `/api/queues/{queue}/messages?from=&limit=`.
pub(crate) async fn messages(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(q): Path<String>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let r = async {
        let q = input::name("queue", &q)?;
        let from = p.get("from").filter(|s| !s.is_empty()).map(|s| input::seq("from", s)).transpose()?;
        let limit =
            input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?.unwrap_or(20);
        let msgs = st.source.peek(q, from, limit as usize).await?;
        Ok(to_json(&msgs))
    }
    .await;
    answer(&ctx, r)
}

/// GET `/api/queues/{queue}/groups/{group}/pending`.
pub(crate) async fn pending(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((q, g)): Path<(String, String)>,
) -> Response {
    let r = async {
        let (q, g) = (input::name("queue", &q)?, input::name("group", &g)?);
        Ok(to_json(&st.source.pending(q, g).await?))
    }
    .await;
    answer(&ctx, r)
}

/// GET `/api/queues/{queue}/groups/{group}/jobs/{seq}`: where one job of a work group stands
/// (`Broker::job`; not a redrive job, which is `/api/jobs/{id}`).
pub(crate) async fn work_job(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((q, g, seq)): Path<(String, String, String)>,
) -> Response {
    let r = async {
        let (q, g) = (input::name("queue", &q)?, input::name("group", &g)?);
        let seq = input::seq("job", &seq)?;
        Ok(to_json(&st.source.job(q, g, seq).await?))
    }
    .await;
    answer(&ctx, r)
}

/// GET `/api/dlq/{queue}?limit=`.
pub(crate) async fn dead_letters(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(q): Path<String>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let r = async {
        let q = input::name("queue", &q)?;
        let limit =
            input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?.unwrap_or(50);
        let letters = st.source.dead_letters(q, limit as usize).await?;
        st.source.check_dead_letter_queue(q).await?;
        Ok(to_json(&letters))
    }
    .await;
    answer(&ctx, r)
}

/// GET `/api/jobs/{id}` (`?wait=1`: answer once the redrive has finished, for scripts and
/// tests that must not poll on a timer).
pub(crate) async fn job(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(id): Path<String>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let r = async {
        let id = input::seq("job id", &id)?;
        let mut rx = st.jobs.get(id).ok_or_else(|| Failure::not_found(format!("no redrive job {id}")))?;
        if p.get("wait").is_some_and(|w| w == "1" || w == "true") {
            // Ends when the job is done, or when its task is gone (the runtime shut down).
            let _ = rx.wait_for(|p| p.done).await;
        }
        let p = rx.borrow().clone();
        Ok(json!({
            "job": id, "dlq": p.dlq, "to": p.to, "total": p.total, "moved": p.moved, "done": p.done, "error": p.error,
        }))
    }
    .await;
    answer(&ctx, r)
}

/// GET `/metrics`.
pub(crate) async fn metrics(AxState(st): AxState<Arc<State>>, ctx: Ctx) -> Response {
    match st.source.stats().await {
        Ok(s) => ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], super::metrics::render(&s))
            .into_response(),
        Err(f) => ctx.fail(f),
    }
}
