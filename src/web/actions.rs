//! The mutating routes (POST only): pause, resume, reset (after a confirmation), redrive,
//! and the login and logout of browser sessions. Each handler, in this order: checks
//! the caller may act (token, CSRF, same site), validates every input, and only then changes
//! anything — so a refused or invalid request changes nothing. Browser forms get a redirect
//! or a page; `/api/...` gets JSON.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State as AxState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::auth::{self, COOKIE_NAME};
use super::ctx::Ctx;
use super::failure::Failure;
use super::html::{self, esc};
use super::input;
use super::state::State;
use crate::broker::Broker;
use crate::retention::ResetTo;

pub(super) type Fields = Result<Form<HashMap<String, String>>, FormRejection>;

/// The form's fields, or a 400 naming what was wrong with the body.
pub(super) fn fields(f: Fields) -> Result<HashMap<String, String>, Failure> {
    f.map(|Form(m)| m).map_err(|e| Failure::bad_request(format!("the request's form cannot be read: {e}")))
}

/// The common prefix of every action: read-only mode and anonymous callers are refused before
/// the body is even read; then the form, then its CSRF token.
pub(super) fn authorized<'a>(
    st: &'a State,
    ctx: &Ctx,
    f: Fields,
) -> Result<(&'a Broker, HashMap<String, String>), Failure> {
    let broker = st.source.broker().filter(|_| st.auth.has_token()).ok_or_else(auth::read_only)?;
    if ctx.caller == auth::Caller::Anonymous {
        st.auth.authorize(&ctx.caller, &ctx.headers, None)?;
    }
    let f = fields(f)?;
    st.auth.authorize(&ctx.caller, &ctx.headers, f.get("csrf").map(String::as_str))?;
    Ok((broker, f))
}

/// What an action answers: a redirect for forms, JSON for the API.
pub(super) fn done(ctx: &Ctx, back: &str, value: serde_json::Value) -> Response {
    match (ctx.api, back) {
        (true, _) => axum::Json(value).into_response(),
        (false, "/") => ctx.redirect_home(),
        (false, _) => ctx.redirect(back),
    }
}

/// Answers any method other than POST on a mutating route: 405 with an explanation.
pub(crate) async fn post_only(ctx: Ctx) -> Response {
    let mut r = ctx.fail(Failure::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route changes the database and answers POST only (use the page's button)",
    ));
    r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    r
}

/// POST `/groups/{queue}/{group}/pause` and `/resume`.
pub(crate) async fn pause(
    st: AxState<Arc<State>>,
    ctx: Ctx,
    path: Path<(String, String)>,
    f: Fields,
) -> Response {
    set_paused(st, ctx, path, f, true).await
}

/// See [`pause`].
pub(crate) async fn resume(
    st: AxState<Arc<State>>,
    ctx: Ctx,
    path: Path<(String, String)>,
    f: Fields,
) -> Response {
    set_paused(st, ctx, path, f, false).await
}

async fn set_paused(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((queue, group)): Path<(String, String)>,
    f: Fields,
    paused: bool,
) -> Response {
    let r = async {
        let (broker, _) = authorized(&st, &ctx, f)?;
        let (q, g) = (input::name("queue", &queue)?, input::name("group", &group)?);
        match paused {
            true => broker.pause_group(q, g).await?,
            false => broker.resume_group(q, g).await?,
        }
        Ok(done(&ctx, &format!("/queues/{q}"), json!({ "queue": q, "group": g, "paused": paused })))
    }
    .await;
    ctx.render(r)
}

/// POST `/groups/{queue}/{group}/reset`: `target` = `seq` | `time` | `earliest` | `latest`,
/// `value` for the first two. A browser form without `confirm=yes` gets a confirmation page
/// showing exactly what will happen; the API acts at once (its caller already decided).
pub(crate) async fn reset(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path((queue, group)): Path<(String, String)>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let (q, g) = (input::name("queue", &queue)?, input::name("group", &group)?);
        let stats = broker.stats().await?;
        let qs = super::source::queue_in(&stats, q)?;
        let gs = super::source::group_in(&stats, q, g)?;
        let target = f.get("target").map(String::as_str).unwrap_or("");
        let value = f.get("value").map(String::as_str).unwrap_or("");
        let (to, what) = match target {
            "seq" => {
                let s = input::seq("sequence", value)?;
                (ResetTo::Sequence(s), format!("sequence {s}"))
            }
            "time" => {
                let t = input::time(value, SystemTime::now())?;
                (ResetTo::Time(t), format!("the first message sent at or after {}", html::time(t)))
            }
            "earliest" => (ResetTo::Sequence(qs.first_seq), format!("the oldest stored message (#{})", qs.first_seq)),
            "latest" => (ResetTo::Sequence(qs.last_seq + 1), format!("after the last message (#{})", qs.last_seq + 1)),
            other => {
                return Err(Failure::bad_request(format!(
                    "reset target {:?} is not one of seq, time, earliest, latest",
                    other.chars().take(40).collect::<String>()
                )));
            }
        };
        if let ResetTo::Sequence(s) = to
            && (s < qs.first_seq || s > qs.last_seq + 1)
        {
            return Err(Failure::bad_request(format!(
                "sequence {s} is outside the retained range {}..={} of queue {q:?}",
                qs.first_seq,
                qs.last_seq + 1
            )));
        }
        if !ctx.api && f.get("confirm").map(String::as_str) != Some("yes") {
            let csrf = f.get("csrf").map(String::as_str).unwrap_or("");
            let body = format!(
                r#"<p id="confirm-text">Reset group <b>{g}</b> on <b>{q}</b> (committed at {c}, lag {lag}) to {what}?
Messages before it are skipped, messages after it are delivered again. The group's subscriptions and worker pools must be stopped first.</p>
<form method="post" action="{b}/groups/{q}/{g}/reset">{csrf}<input type="hidden" name="target" value="{t}"><input type="hidden" name="value" value="{v}"><input type="hidden" name="confirm" value="yes"><button id="confirm">Yes, reset</button> <a href="{b}/queues/{q}">Cancel</a></form>"#,
                g = esc(g),
                q = esc(q),
                c = gs.committed,
                lag = gs.lag,
                what = esc(&what),
                b = esc(&ctx.base),
                csrf = html::csrf_field(csrf),
                t = esc(target),
                v = esc(&confirmed_value(to, value)),
            );
            return Ok(ctx.page("Confirm reset", None, &body));
        }
        let next = broker.reset_group(q, g, to).await?;
        Ok(done(&ctx, &format!("/queues/{q}"), json!({ "queue": q, "group": g, "next_seq": next })))
    }
    .await;
    ctx.render(r)
}

/// The value the confirmation form sends back: a time as the absolute instant shown on the
/// page (to the microsecond), so that "15m" means 15 minutes before the question, not before
/// the answer.
fn confirmed_value(to: ResetTo, typed: &str) -> String {
    match to {
        ResetTo::Time(t) => {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            chrono::DateTime::<chrono::Utc>::from_timestamp(d.as_secs() as i64, d.subsec_nanos())
                .map_or_else(|| typed.to_owned(), |dt| dt.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
        }
        _ => typed.to_owned(),
    }
}

/// POST `/dlq/{queue}/redrive`: `to` (optional, an existing queue), `limit` (optional).
/// A browser form gets a confirmation page first; then a background redrive in chunks starts
/// and its progress page is shown.
pub(crate) async fn redrive(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(dlq): Path<String>,
    f: Fields,
) -> Response {
    let r = async {
        let (broker, f) = authorized(&st, &ctx, f)?;
        let dlq = input::name("dead-letter queue", &dlq)?;
        let names = broker.queue_names();
        if !names.iter().any(|n| n == dlq) {
            return Err(Failure::not_found(format!("queue {dlq:?} does not exist")));
        }
        st.source.check_dead_letter_queue(dlq).await?;
        let to = match f.get("to").map(|s| s.trim()).filter(|s| !s.is_empty()) {
            None => None,
            Some(t) => {
                let t = input::name("target queue", t)?;
                // A typo must not create a queue and strand the dead letters in it.
                if !names.iter().any(|n| n == t) {
                    return Err(Failure::bad_request(format!("target queue {t:?} does not exist")));
                }
                if t == dlq {
                    return Err(Failure::bad_request("a dead-letter queue cannot be redriven into itself"));
                }
                Some(t.to_owned())
            }
        };
        let limit = input::limit("limit", f.get("limit").map(String::as_str), 1_000_000_000)?;
        let depth = st.source.dlq_depth(dlq).await?.unwrap_or(0);
        let question = format!(
            "Redrive {} of the {depth} dead letters of <b>{}</b> to {}? Each is sent again as a new message; the group retries it from attempt 1.",
            limit.map_or_else(|| "all".to_owned(), |l| l.min(depth).to_string()),
            esc(dlq),
            to.as_deref().map_or_else(|| "the queues they came from".to_owned(), |t| format!("<b>{}</b>", esc(t))),
        );
        let action = format!("/dlq/{dlq}/redrive");
        let cancel = format!("/dlq/{dlq}");
        if let Some(page) =
            super::confirm::confirmed(&ctx, &f, &action, &["to", "limit"], &question, "Yes, redrive", &cancel)
        {
            return Ok(page);
        }
        let id = st.jobs.start(broker.clone(), dlq.to_owned(), to, limit);
        Ok(done(&ctx, &format!("/jobs/{id}"), json!({ "job": id, "dlq": dlq })))
    }
    .await;
    ctx.render(r)
}

/// POST `/login`: the token from the form; a session cookie on success.
pub(crate) async fn login(AxState(st): AxState<Arc<State>>, ctx: Ctx, f: Fields) -> Response {
    let r = async {
        let f = fields(f)?;
        // A login from another site would log the victim into the attacker's session.
        auth::same_site(&ctx.headers)?;
        let id = match st.auth.login(f.get("token").map(String::as_str).unwrap_or("")) {
            Ok(id) => id,
            Err(refused) => {
                st.auth.throttle_failure().await;
                return Err(refused);
            }
        };
        let path = if ctx.base.is_empty() { "/" } else { ctx.base.as_str() };
        let cookie = format!("{COOKIE_NAME}={id}; Path={path}; HttpOnly; SameSite=Strict; Max-Age=43200");
        let mut resp = ctx.redirect_home();
        let value =
            header::HeaderValue::from_str(&cookie).map_err(|e| Failure::bad_request(e.to_string()))?;
        resp.headers_mut().insert(header::SET_COOKIE, value);
        Ok(resp)
    }
    .await;
    ctx.render(r)
}

/// POST `/logout`.
pub(crate) async fn logout(AxState(st): AxState<Arc<State>>, ctx: Ctx, f: Fields) -> Response {
    let r = async {
        let f = fields(f)?;
        st.auth.check_form(&ctx.caller, &ctx.headers, f.get("csrf").map(String::as_str))?;
        st.auth.logout(&ctx.headers);
        let path = if ctx.base.is_empty() { "/" } else { ctx.base.as_str() };
        let mut resp = ctx.redirect_home();
        let cookie = format!("{COOKIE_NAME}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0");
        if let Ok(v) = header::HeaderValue::from_str(&cookie) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
        Ok(resp)
    }
    .await;
    ctx.render(r)
}
