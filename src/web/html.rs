//! HTML building: the one escaping helper every page goes through, the page frame, and the
//! small formatters (durations, UTC times, payload views) the pages share.
//!
//! Pages are hand-written `format!` strings. The rule that keeps them safe: every value that
//! did not come from this file is passed through [`esc`] (payloads, headers, names, errors) —
//! names are restricted to `[A-Za-z0-9._-]`, but they are escaped anyway so that no page relies
//! on a validation done elsewhere.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The stylesheet, served inline in every page (no second request, no CDN).
const CSS: &str = include_str!("assets/console.css");

/// Escapes text for HTML element content and for double- or single-quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What the frame of a page needs besides its body.
pub(crate) struct Frame<'a> {
    /// The mount prefix (`""` or e.g. `"/rockq"`), for links.
    pub base: &'a str,
    /// The page's title (plain text; escaped here).
    pub title: &'a str,
    /// Reload the page every this many seconds (the overview's auto-refresh).
    pub refresh: Option<u32>,
    /// The banner under the navigation: read-only, logged in, or log in.
    pub banner: String,
}

/// A whole page: head, navigation, banner, body (already HTML).
pub(crate) fn page(frame: &Frame<'_>, body: &str) -> String {
    let base = esc(frame.base);
    // The overview is the mount point itself: `/rockq`, not `/rockq/` (see `Ctx::home`).
    let home = if frame.base.is_empty() { "/".to_owned() } else { base.clone() };
    let refresh =
        frame.refresh.map_or_else(String::new, |s| format!(r#"<meta http-equiv="refresh" content="{s}">"#));
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
{refresh}<title>{title} · rockq</title><link rel="icon" type="image/svg+xml" href="{base}/favicon.ico"><style>{CSS}</style></head>
<body><header><a class="brand" href="{home}">rockq</a><nav><a href="{home}">Overview</a><a href="{base}/flows">Flows</a><a href="{base}/metrics">Metrics</a><a href="{base}/api/stats">JSON</a></nav>{banner}</header>
<main><h1>{title}</h1>
{body}
</main></body></html>
"#,
        title = esc(frame.title),
        banner = frame.banner,
    )
}

/// A table: headers, then rows of cells that are already HTML. `id` names it for tests and
/// scripts; each cell of a column carries `data-col` so a browser test can read one number
/// without depending on the layout.
pub(crate) fn table(id: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(r#"<table id="{}"><thead><tr>"#, esc(id));
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(out, r#"<tr><td colspan="{}" class="none">none</td></tr>"#, headers.len());
    }
    for row in rows {
        out.push_str("<tr>");
        for (cell, h) in row.iter().zip(headers) {
            let _ = write!(out, r#"<td data-col="{}">{cell}</td>"#, esc(&col_key(h)));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// `"In flight"` → `"in-flight"`.
fn col_key(header: &str) -> String {
    header.to_ascii_lowercase().replace(' ', "-")
}

/// `850ms`, `12.3s`, `4m05s`, `3h12m`, `2d04h`.
pub(crate) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// A duration, or `-`.
pub(crate) fn opt_duration(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), duration)
}

/// `2026-11-22T08:05:01.123Z` (UTC, what operators paste into a reset form).
pub(crate) fn time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    match chrono::DateTime::<chrono::Utc>::from_timestamp(d.as_secs() as i64, d.subsec_nanos()) {
        Some(dt) => dt.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => format!("{}s", d.as_secs()),
    }
}

/// How a payload is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// UTF-8 text (invalid sequences replaced).
    Text,
    /// Pretty-printed JSON when it parses, else text.
    Json,
    /// Hex bytes.
    Hex,
}

impl View {
    /// From a `?view=` value; anything unknown is text (a view is harmless to get wrong).
    pub(crate) fn parse(s: Option<&str>) -> View {
        match s {
            Some("json") => View::Json,
            Some("hex") => View::Hex,
            _ => View::Text,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            View::Text => "text",
            View::Json => "json",
            View::Hex => "hex",
        }
    }
}

/// The bytes as the view asks, escaped, in a `<pre>`; at most `max` bytes are shown.
pub(crate) fn payload(b: &[u8], view: View, max: usize) -> String {
    let cut = &b[..b.len().min(max)];
    let more = if b.len() > max { format!("… ({} bytes)", b.len()) } else { String::new() };
    let body = match view {
        View::Hex => hex(cut),
        View::Json => match serde_json::from_slice::<serde_json::Value>(b) {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
            Err(_) => String::from_utf8_lossy(cut).into_owned(),
        },
        View::Text => String::from_utf8_lossy(cut).into_owned(),
    };
    format!(r#"<pre class="payload">{}{}</pre>"#, esc(&body), esc(&more))
}

/// Lowercase hex, grouped by 16 bytes per line.
pub(crate) fn hex(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 3);
    for (i, x) in b.iter().enumerate() {
        if i > 0 {
            out.push(if i % 16 == 0 { '\n' } else { ' ' });
        }
        let _ = write!(out, "{x:02x}");
    }
    out
}

/// Headers as a small list (values as lossy UTF-8), escaped.
pub(crate) fn headers(h: &[(String, bytes::Bytes)]) -> String {
    if h.is_empty() {
        return "-".into();
    }
    let mut out = String::from(r#"<ul class="headers">"#);
    for (k, v) in h {
        let _ = write!(out, "<li><b>{}</b>: {}</li>", esc(k), esc(&String::from_utf8_lossy(v)));
    }
    out.push_str("</ul>");
    out
}

/// A hidden CSRF field (empty when there is no session: the form is then not rendered).
pub(crate) fn csrf_field(csrf: &str) -> String {
    format!(r#"<input type="hidden" name="csrf" value="{}">"#, esc(csrf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_special_character() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(esc("plain-name_1.dlq"), "plain-name_1.dlq");
        let p = payload(b"<script>alert(1)</script>", View::Text, 100);
        assert!(!p.contains("<script>") && p.contains("&lt;script&gt;"));
        let j = payload(br#"{"a":"<b>"}"#, View::Json, 100);
        assert!(j.contains("&lt;b&gt;") && j.contains("&quot;a&quot;"));
        assert_eq!(hex(&[0, 255, 16]), "00 ff 10");
        assert!(payload(&[1; 40], View::Hex, 20).contains("(40 bytes)"));
    }

    #[test]
    fn formats_times_and_durations() {
        assert_eq!(time(UNIX_EPOCH + Duration::from_millis(1_795_335_634_310)), "2026-11-22T08:20:34.310Z");
        assert_eq!(duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(opt_duration(None), "-");
    }
}
