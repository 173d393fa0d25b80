//! The gate in front of every route, before any handler runs:
//!
//! 1. **Host allow-list** (DNS rebinding): a page on `evil.test` whose name an attacker points
//!    at 127.0.0.1 reaches a loopback console with `Host: evil.test`. Only the names the
//!    console answers to pass — `localhost`, `127.0.0.1`, `::1`, the address it was bound to,
//!    and those the operator adds ([`Console::allowed_host`](super::Console::allowed_host)) —
//!    compared without the port. Another name gets 421, no `Host` at all 400.
//! 2. **Private by default**: with a token configured, reading needs it too (message payloads
//!    are usually the most sensitive data in a system) — a session or the bearer token —
//!    unless the console was built with [`public_reads`](super::Console::public_reads). Pages
//!    redirect to the login form; the API and `/metrics` answer 401 with `WWW-Authenticate`.
//!    The login form and the favicon are open.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State as AxState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Caller;
use super::ctx::Ctx;
use super::state::State;

/// Routes anyone may reach even when reads are private.
const OPEN: &[&str] = &["/login", "/favicon.ico"];

pub(crate) async fn guard(AxState(st): AxState<Arc<State>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned()));
    let Some(host) = host else {
        return plain(StatusCode::BAD_REQUEST, "a Host header is required".into());
    };
    let name = host_name(&host);
    if !st.config.allowed_hosts.contains(&name) {
        tracing::warn!(host = %host, "rockq console: refused a request for a host it does not answer to");
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this console does not answer to host {name:?} (DNS rebinding protection); \
                 allow it with Console::allowed_host or `rockq serve --allowed-host {name}`"
            ),
        );
    }
    let private = st.auth.has_token() && !st.config.public_reads;
    if private && !OPEN.contains(&parts.uri.path()) {
        let ctx = match Ctx::from_request_parts(&mut parts, &st).await {
            Ok(ctx) => ctx,
            Err(refused) => return refused,
        };
        if ctx.caller == Caller::Anonymous {
            let api = ctx.api || parts.uri.path() == "/metrics";
            if !api {
                let to = format!("{}/login", ctx.base);
                return (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
            }
            let mut r = plain(
                StatusCode::UNAUTHORIZED,
                "this console is private: send Authorization: Bearer <token>".into(),
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(r#"Bearer realm="rockq""#));
            return r;
        }
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The host name of a `Host` value, lowercased, without its port or IPv6 brackets.
pub(crate) fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_owned();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_owned(),
        _ => host,
    }
}

fn plain(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names_lose_their_port_and_brackets_and_case() {
        assert_eq!(host_name("LocalHost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("evil.test:8080"), "evil.test");
        assert_eq!(host_name("console.example.com"), "console.example.com");
    }
}
