//! Who may change things: the configured token, browser sessions and CSRF protection.
//!
//! - Without a token the console is read-only: every mutating route answers 403; so does every
//!   one over a read-only source (a database held by another process), token or not.
//! - With a token, reading needs it too (private by default; `guard.rs`), unless the console
//!   was built with `public_reads`.
//! - API clients send `Authorization: Bearer <token>`. Browsers never attach that header on
//!   their own, so a bearer request cannot be forged cross-site and needs no CSRF token.
//! - Browsers log in with the token once (`POST /login`) and get a session cookie
//!   (`HttpOnly`, `SameSite=Strict`). Each session has its own random CSRF token, embedded in
//!   every form; a mutating request must carry it (double check: the cookie proves the browser,
//!   the field proves the page), and must not come from another site (`Origin` and
//!   `Sec-Fetch-Site`, when the browser sends them).
//!
//! Secrets are compared in constant time, the session store is bounded, and failed logins and
//! wrong bearer tokens are throttled alike: each waits [`LOGIN_FAILURE_DELAY`], one at a time,
//! so guessing runs at one try a second whatever the client's concurrency (`ctx.rs`, `actions.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use tokio::time::Instant;

use super::failure::Failure;

/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "rockq_session";
/// How long a browser session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most live sessions; the oldest goes first.
const MAX_SESSIONS: usize = 256;

/// How long a failed login waits before it is answered (failures wait one after another).
pub(crate) const LOGIN_FAILURE_DELAY: Duration = Duration::from_secs(1);

/// The token, if any, whether changes are possible at all, and the live sessions.
pub(crate) struct Auth {
    token: Option<String>,
    /// The source can be written (a live broker, not a read-only view).
    writable: bool,
    sessions: Mutex<HashMap<String, Session>>,
    /// Held by a failed login while it waits: failures are answered one at a time.
    failures: tokio::sync::Mutex<()>,
}

struct Session {
    csrf: String,
    created: Instant,
}

/// What the request proved about its sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Nothing: may read.
    Anonymous,
    /// A logged-in browser; its forms carry this CSRF token.
    Session { csrf: String },
    /// An API client with the right bearer token.
    Bearer,
}

impl Auth {
    pub(crate) fn new(token: Option<String>, writable: bool) -> Auth {
        Auth {
            token: token.filter(|t| !t.is_empty()),
            writable,
            sessions: Mutex::new(HashMap::new()),
            failures: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether a token is configured (reads then need it too, unless reads are public).
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether the console may change things at all: a token, over a live broker.
    pub(crate) fn writable(&self) -> bool {
        self.token.is_some() && self.writable
    }

    /// Waits out a failed login (see [`LOGIN_FAILURE_DELAY`]).
    pub(crate) async fn throttle_failure(&self) {
        let _one_at_a_time = self.failures.lock().await;
        tokio::time::sleep(LOGIN_FAILURE_DELAY).await;
    }

    /// Identifies the caller: a bearer token (wrong one: 401), a live session cookie, or nobody.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, Failure> {
        if let Some(given) = bearer(headers) {
            return match &self.token {
                Some(t) if ct_eq(t.as_bytes(), given.as_bytes()) => Ok(Caller::Bearer),
                _ => Err(Failure::unauthorized("the bearer token is not the console's token")),
            };
        }
        let Some(id) = cookie(headers, COOKIE_NAME) else { return Ok(Caller::Anonymous) };
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        // Looking a secret up in a HashMap leaks timing about its hash, not about the secret's
        // bytes; the ids are 256 random bits, so there is nothing to guess incrementally.
        Ok(match sessions.get(id) {
            Some(s) if s.created.elapsed() < SESSION_TTL => Caller::Session { csrf: s.csrf.clone() },
            _ => Caller::Anonymous,
        })
    }

    /// Checks the token typed into the login form and opens a session: `(cookie id, csrf)`.
    pub(crate) fn login(&self, given: &str) -> Result<String, Failure> {
        let Some(token) = &self.token else {
            return Err(Failure::forbidden("this console has no token: there is nothing to log in to"));
        };
        if !ct_eq(token.as_bytes(), given.as_bytes()) {
            return Err(Failure::unauthorized("wrong token"));
        }
        let (id, csrf) = (random_hex()?, random_hex()?);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, s| s.created.elapsed() < SESSION_TTL);
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                sessions.remove(&k);
            }
        }
        sessions.insert(id.clone(), Session { csrf, created: Instant::now() });
        Ok(id)
    }

    /// Ends the session of this request, if any.
    pub(crate) fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE_NAME) {
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
    }

    /// Whether `caller` may carry out a change: the console must be [writable](Auth::writable),
    /// and the caller must pass [`check_form`](Auth::check_form).
    pub(crate) fn authorize(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        csrf: Option<&str>,
    ) -> Result<(), Failure> {
        if !self.writable() {
            return Err(read_only());
        }
        self.check_form(caller, headers, csrf)
    }

    /// Whether `caller` holds the token (bearer), or is a session whose form carries its CSRF
    /// token and whose request comes from this site (what logging out needs, even read-only).
    pub(crate) fn check_form(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        csrf: Option<&str>,
    ) -> Result<(), Failure> {
        if !self.has_token() {
            return Err(read_only());
        }
        match caller {
            Caller::Bearer => Ok(()),
            Caller::Anonymous => Err(Failure::unauthorized(
                "log in with the console's token first (or send Authorization: Bearer <token>)",
            )),
            Caller::Session { csrf: expected } => {
                same_site(headers)?;
                match csrf {
                    Some(given) if ct_eq(expected.as_bytes(), given.as_bytes()) => Ok(()),
                    _ => Err(Failure::forbidden(
                        "the form's CSRF token is missing or wrong: reload the page and try again",
                    )),
                }
            }
        }
    }
}

/// The 403 of every mutating route in read-only mode.
pub(crate) fn read_only() -> Failure {
    Failure::forbidden(
        "this console is read-only (no token is configured, or the database is held by another process): \
         nothing was changed",
    )
}

/// Refuses a request a browser marks as coming from another site.
pub(crate) fn same_site(headers: &HeaderMap) -> Result<(), Failure> {
    let cross = || Failure::forbidden("cross-site request refused (CSRF protection): nothing was changed");
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return Err(cross());
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().map_err(|_| cross())?;
        let host = headers.get(HOST).and_then(|h| h.to_str().ok()).ok_or_else(cross)?;
        let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        if authority != Some(host) {
            return Err(cross());
        }
    }
    Ok(())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

/// The value of cookie `name`, from any `Cookie` header.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .flat_map(|h| h.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Equality whose time does not depend on where the inputs differ (only on their lengths).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// 256 random bits from the operating system, as hex.
fn random_hex() -> Result<String, Failure> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| {
        Failure::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("no randomness for a session: {e}"),
        )
    })?;
    Ok(super::html::hex(&b).replace([' ', '\n'], ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn constant_time_equality_is_equality() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT") && !ct_eq(b"secret", b"secret2") && !ct_eq(b"", b"x"));
    }

    #[tokio::test]
    async fn sessions_need_the_token_and_forms_their_csrf() {
        let auth = Auth::new(Some("tok".into()), true);
        assert!(auth.login("nope").is_err());
        let id = auth.login("tok").unwrap();
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_str(&format!("a=b; {COOKIE_NAME}={id}")).unwrap());
        let Caller::Session { csrf } = auth.caller(&h).unwrap() else { panic!("no session") };
        assert!(auth.authorize(&Caller::Session { csrf: csrf.clone() }, &h, Some(&csrf)).is_ok());
        assert!(auth.authorize(&Caller::Session { csrf: csrf.clone() }, &h, Some("x")).is_err());
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(auth.authorize(&Caller::Session { csrf: csrf.clone() }, &h, Some(&csrf)).is_err());
        assert!(Auth::new(None, true).authorize(&Caller::Bearer, &HeaderMap::new(), None).is_err());
    }

    /// A read-only source with a token: the token still identifies (reads, logging out), but
    /// nothing may change.
    #[tokio::test]
    async fn a_read_only_console_accepts_its_token_and_refuses_changes() {
        let auth = Auth::new(Some("tok".into()), false);
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer tok"));
        assert_eq!(auth.caller(&h).unwrap(), Caller::Bearer);
        assert_eq!(auth.authorize(&Caller::Bearer, &h, None).unwrap_err().status, 403);
        assert!(auth.check_form(&Caller::Bearer, &h, None).is_ok());
        assert!(auth.login("tok").is_ok());
    }

    /// Failed logins are answered one at a time, each after the delay (on tokio's paused
    /// clock: no real waiting, no timing assertion).
    #[tokio::test(start_paused = true)]
    async fn failed_logins_wait_one_after_another() {
        let auth = std::sync::Arc::new(Auth::new(Some("tok".into()), true));
        let start = tokio::time::Instant::now();
        let tries: Vec<_> = (0..3)
            .map(|_| {
                tokio::spawn({
                    let auth = auth.clone();
                    async move { auth.throttle_failure().await }
                })
            })
            .collect();
        for t in tries {
            t.await.unwrap();
        }
        assert!(start.elapsed() >= LOGIN_FAILURE_DELAY * 3, "{:?}", start.elapsed());
    }
}
