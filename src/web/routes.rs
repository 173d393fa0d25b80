//! The route table, and the response headers every answer carries.

use std::sync::Arc;

use axum::Router;
use axum::handler::Handler;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use super::ctx::Ctx;
use super::failure::Failure;
use super::state::State;
use super::{actions, api, flows, group, job_actions, letter_actions, maintenance, pages, schedules};

/// Pages hold CSRF tokens and live figures: never cached. No script runs on any page, so the
/// policy forbids scripts outright (an injected `<script>` would not run even if escaping
/// failed); framing is refused (clickjacking on the action buttons).
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    r
}

/// A small mark, so that browsers stop logging a 404 for the favicon on every page.
async fn favicon() -> Response {
    const ICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#2f5d8a"/><path d="M4 4h8v2H4zm0 3h8v2H4zm0 3h5v2H4z" fill="#fff"/></svg>"##;
    ([(header::CONTENT_TYPE, "image/svg+xml")], ICON).into_response()
}

async fn not_found(ctx: Ctx) -> Response {
    ctx.fail(Failure::not_found("no such page"))
}

/// A mutating route: POST; any other method gets an explanation, not a bare 405.
fn action<H, T>(h: H) -> MethodRouter<Arc<State>>
where
    H: Handler<T, Arc<State>>,
    T: 'static,
{
    post(h).fallback(actions::post_only)
}

pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/queues/{queue}", get(pages::queue))
        .route("/dlq/{queue}", get(pages::dead_letters))
        .route("/groups/{queue}/{group}", get(group::page))
        .route("/delayed", get(schedules::page))
        .route("/jobs/{id}", get(pages::job))
        .route("/flows", get(flows::list))
        .route("/flows/{id}", get(flows::page))
        .route("/login", get(pages::login_form).post(actions::login))
        .route("/logout", action(actions::logout))
        .route("/groups/{queue}/{group}/pause", action(actions::pause))
        .route("/groups/{queue}/{group}/resume", action(actions::resume))
        .route("/groups/{queue}/{group}/reset", action(actions::reset))
        .route("/groups/{queue}/{group}/delete", action(maintenance::delete_group))
        .route("/groups/{queue}/{group}/jobs/{seq}/{verb}", action(job_actions::act))
        .route("/queues/{queue}/purge", action(maintenance::purge_queue))
        .route("/queues/{queue}/delete", action(maintenance::delete_queue))
        .route("/schedules/{name}/{verb}", action(schedules::act))
        .route("/dlq/{queue}/redrive", action(actions::redrive))
        .route("/dlq/{queue}/letters/{seq}/{verb}", action(letter_actions::act))
        .route("/trim", action(maintenance::trim))
        .route("/metrics", get(api::metrics))
        .route("/api/stats", get(api::get_stats))
        .route("/api/history", get(api::history))
        .route("/api/queues/{queue}/messages", get(api::messages))
        .route("/api/queues/{queue}/groups/{group}/pending", get(api::pending))
        .route("/api/queues/{queue}/groups/{group}/jobs/{seq}", get(api::work_job))
        .route("/api/dlq/{queue}", get(api::dead_letters))
        .route("/api/jobs/{id}", get(api::job))
        .route("/api/flows", get(flows::api_list))
        .route("/api/flows/{id}", get(flows::api_flow))
        .route("/api/groups/{queue}/{group}/pause", action(actions::pause))
        .route("/api/groups/{queue}/{group}/resume", action(actions::resume))
        .route("/api/groups/{queue}/{group}/reset", action(actions::reset))
        .route("/api/groups/{queue}/{group}/delete", action(maintenance::delete_group))
        .route("/api/groups/{queue}/{group}/jobs/{seq}/{verb}", action(job_actions::act))
        .route("/api/queues/{queue}/purge", action(maintenance::purge_queue))
        .route("/api/queues/{queue}/delete", action(maintenance::delete_queue))
        .route("/api/schedules/{name}/{verb}", action(schedules::act))
        .route("/api/dlq/{queue}/redrive", action(actions::redrive))
        .route("/api/dlq/{queue}/letters/{seq}/{verb}", action(letter_actions::act))
        .route("/api/trim", action(maintenance::trim))
        .route("/favicon.ico", get(favicon))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), super::guard::guard))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}
