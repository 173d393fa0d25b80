//! An HTTP client for the console's tests: requests through `tower::ServiceExt::oneshot`
//! (no socket), a browser session's login, and the rows of a rendered table.
#![allow(dead_code)]

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use tower::ServiceExt;

pub const TOKEN: &str = "s3cret-token";

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// Sends `req` as a browser on this machine would: with `Host: localhost` unless it names one.
pub async fn call(app: &Router, mut req: Request<Body>) -> Answer {
    if !req.headers().contains_key(header::HOST) {
        req.headers_mut().insert(header::HOST, header::HeaderValue::from_static("localhost:8080"));
    }
    call_raw(app, req).await
}

/// Sends `req` exactly as given (no `Host` added).
pub async fn call_raw(app: &Router, req: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20).await.expect("body");
    Answer { status, headers, body: String::from_utf8(bytes.to_vec()).expect("utf-8 body") }
}

pub async fn get(app: &Router, path: &str) -> Answer {
    call(app, Request::get(path).body(Body::empty()).unwrap()).await
}

/// A form POST with extra headers.
pub async fn post(app: &Router, path: &str, form: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    call(app, req.body(Body::from(form.to_owned())).unwrap()).await
}

/// A browser session: logs in and returns (cookie header, csrf token from a page).
pub async fn login(app: &Router) -> (String, String) {
    let a = post(app, "/login", &format!("token={TOKEN}"), &[("sec-fetch-site", "same-origin")]).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let set = a.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let page =
        call(app, Request::get("/").header(header::COOKIE, &cookie).body(Body::empty()).unwrap()).await;
    let at = page.body.find(r#"name="csrf" value=""#).expect("a form with a csrf token")
        + r#"name="csrf" value=""#.len();
    let csrf = page.body[at..at + 64].to_owned();
    (cookie, csrf)
}

/// The rows of table `id`: each cell by its `data-col`, tags stripped.
pub fn table(html: &str, id: &str) -> Vec<BTreeMap<String, String>> {
    let start = html.find(&format!(r#"<table id="{id}">"#)).unwrap_or_else(|| panic!("no table {id}"));
    let t = &html[start..start + html[start..].find("</table>").unwrap()];
    let body = &t[t.find("<tbody>").unwrap()..];
    body.split("<tr>")
        .skip(1)
        .filter(|r| r.contains("data-col"))
        .map(|r| {
            r.split(r#"<td data-col=""#)
                .skip(1)
                .map(|c| {
                    let (col, rest) = c.split_once('"').unwrap();
                    let cell = &rest[1..rest.find("</td>").unwrap()];
                    (col.to_owned(), strip_tags(cell))
                })
                .collect()
        })
        .collect()
}

pub fn strip_tags(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.trim().to_owned()
}
