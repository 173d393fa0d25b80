//! The confirmation page every destructive action shows a browser first: the question says
//! exactly what will happen, and the form posts the same fields again with `confirm=yes`. The
//! JSON API skips it (its caller already decided).

use std::fmt::Write as _;

use axum::response::Response;

use super::ctx::Ctx;
use super::html::{self, esc};

/// Whether the browser form confirmed; otherwise the confirmation page to answer with.
/// `hidden`: the fields the confirming form posts again (besides `csrf` and `confirm`).
pub(crate) fn confirmed(
    ctx: &Ctx,
    f: &std::collections::HashMap<String, String>,
    action: &str,
    hidden: &[&str],
    question: &str,
    yes: &str,
    cancel: &str,
) -> Option<Response> {
    if ctx.api || f.get("confirm").map(String::as_str) == Some("yes") {
        return None;
    }
    let csrf = f.get("csrf").map(String::as_str).unwrap_or("");
    let b = esc(&ctx.base);
    let mut fields = String::new();
    for name in hidden {
        let value = f.get(*name).map(String::as_str).unwrap_or("");
        let _ = write!(fields, r#"<input type="hidden" name="{}" value="{}">"#, esc(name), esc(value));
    }
    let body = format!(
        r#"<p id="confirm-text" class="confirm">{question}</p>
<form method="post" action="{b}{action}">{csrf}{fields}<input type="hidden" name="confirm" value="yes"><button id="confirm" class="danger">{yes}</button> <a id="cancel" href="{b}{cancel}">Cancel</a></form>"#,
        action = esc(action),
        csrf = html::csrf_field(csrf),
        yes = esc(yes),
        cancel = esc(cancel),
    );
    Some(ctx.page("Confirm", None, &body))
}
