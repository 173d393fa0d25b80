//! What every handler needs to know about the request besides its inputs: where the router is
//! mounted (for links), who is calling, and how to answer (an HTML page or JSON).

use std::sync::Arc;

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::auth::Caller;
use super::failure::Failure;
use super::html::{self, Frame, esc};
use super::state::State;

/// The request's context.
pub(crate) struct Ctx {
    /// The mount prefix, without a trailing slash (`""` at the root).
    pub base: String,
    /// Who is calling.
    pub caller: Caller,
    /// Whether the console may change things at all.
    pub writable: bool,
    /// The request's headers (for the CSRF checks of actions).
    pub headers: HeaderMap,
    /// Whether the answer is JSON (`/api/...`).
    pub api: bool,
}

impl FromRequestParts<Arc<State>> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Ctx, Response> {
        let inner = parts.uri.path().to_owned();
        let outer =
            parts.extensions.get::<OriginalUri>().map_or_else(|| inner.clone(), |o| o.0.path().to_owned());
        let base = mount_prefix(&outer, &inner);
        let api = inner.starts_with("/api/");
        let writable = state.auth.writable();
        let caller = state.auth.caller(&parts.headers);
        let ctx = Ctx { base, caller: Caller::Anonymous, writable, headers: parts.headers.clone(), api };
        match caller {
            Ok(caller) => Ok(Ctx { caller, ..ctx }),
            // A wrong bearer token is refused, even on a page anyone may read: a client that
            // sends one expects it to count. Refused as a failed login is, after the delay and
            // one at a time, so guessing the token over the API runs no faster than at the
            // login form.
            Err(f) => {
                state.auth.throttle_failure().await;
                Err(ctx.fail(f))
            }
        }
    }
}

/// `/rockq/queues/x` served as `/queues/x` → `/rockq`.
fn mount_prefix(outer: &str, inner: &str) -> String {
    let prefix = if inner == "/" { outer } else { outer.strip_suffix(inner).unwrap_or("") };
    prefix.trim_end_matches('/').to_owned()
}

impl Ctx {
    /// The CSRF token for this caller's forms (`None`: show no forms).
    pub(crate) fn csrf(&self) -> Option<&str> {
        match &self.caller {
            Caller::Session { csrf } if self.writable => Some(csrf),
            _ => None,
        }
    }

    /// The overview's address: the mount point itself (`/rockq`, not `/rockq/`, which a
    /// nesting router may not route), or `/` at the root.
    pub(crate) fn home(&self) -> &str {
        if self.base.is_empty() { "/" } else { &self.base }
    }

    /// `303 See Other` to the overview.
    pub(crate) fn redirect_home(&self) -> Response {
        (StatusCode::SEE_OTHER, [(header::LOCATION, self.home().to_owned())]).into_response()
    }

    /// The banner of every page: the mode, and the login or logout control.
    fn banner(&self) -> String {
        let base = esc(&self.base);
        if !self.writable {
            return r#"<span class="mode ro" id="mode">read-only</span>"#.into();
        }
        match self.csrf() {
            Some(csrf) => format!(
                r#"<form class="inline" method="post" action="{base}/logout">{}<span class="mode rw" id="mode">operator</span> <button>Log out</button></form>"#,
                html::csrf_field(csrf)
            ),
            None => format!(r#"<a class="mode" id="mode" href="{base}/login">log in to act</a>"#),
        }
    }

    /// A 200 page.
    pub(crate) fn page(&self, title: &str, refresh: Option<u32>, body: &str) -> Response {
        let frame = Frame { base: &self.base, title, refresh, banner: self.banner() };
        html_response(StatusCode::OK, html::page(&frame, body))
    }

    /// The error page (or JSON error) for `f`.
    pub(crate) fn fail(&self, f: Failure) -> Response {
        if self.api {
            return (
                f.status,
                axum::Json(serde_json::json!({ "error": f.message, "status": f.status.as_u16() })),
            )
                .into_response();
        }
        let frame = Frame { base: &self.base, title: "Error", refresh: None, banner: self.banner() };
        let body = format!(
            r#"<p class="error" id="error"><b>{} {}</b>: {}</p><p><a href="{}">Back to the overview</a></p>"#,
            f.status.as_u16(),
            esc(f.status.canonical_reason().unwrap_or("")),
            esc(&f.message),
            esc(self.home())
        );
        html_response(f.status, html::page(&frame, &body))
    }

    /// A page, or its error page.
    pub(crate) fn render(&self, r: Result<Response, Failure>) -> Response {
        r.unwrap_or_else(|f| self.fail(f))
    }

    /// `303 See Other` to `path` under the mount point (after a successful form).
    pub(crate) fn redirect(&self, path: &str) -> Response {
        let to = format!("{}{path}", self.base);
        (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
    }
}

pub(crate) fn html_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mount_prefix_is_what_nesting_stripped() {
        assert_eq!(super::mount_prefix("/rockq", "/"), "/rockq");
        assert_eq!(super::mount_prefix("/rockq/", "/"), "/rockq");
        assert_eq!(super::mount_prefix("/rockq/queues/a", "/queues/a"), "/rockq");
        assert_eq!(super::mount_prefix("/queues/a", "/queues/a"), "");
        assert_eq!(super::mount_prefix("/", "/"), "");
    }
}
