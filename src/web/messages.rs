//! The message list of a queue page: paging either way (newest first by default), a jump to a
//! sequence, a search by ordering key, idempotency key, header or payload text, and per
//! message where it stands in each work group (done, leased, retrying, dead, open).
//!
//! Everything comes from `Broker::peek`, `Broker::pending` and the dead-letter listing: the
//! page reads at most [`SEARCH_SCAN`] messages per request, and says which range it searched.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use super::ctx::Ctx;
use super::failure::Failure;
use super::fmt;
use super::html::{self, View, esc};
use super::input;
use super::state::State;
use crate::stats::{GroupMode, PendingState, QueueStats, Stats, StoredMessage};

/// The most messages one search request reads (it says where to go on from).
pub(crate) const SEARCH_SCAN: u64 = 10_000;
/// Messages read per `peek` while searching.
const CHUNK: usize = 500;
/// Dead letters read to mark messages as dead.
const DEAD_SCAN: usize = 1_000;

/// Which field a search looks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Key,
    Idempotency,
    Header,
    Payload,
}

impl Field {
    fn parse(s: Option<&str>) -> Result<Field, Failure> {
        match s.unwrap_or("key") {
            "key" => Ok(Field::Key),
            "idempotency" => Ok(Field::Idempotency),
            "header" => Ok(Field::Header),
            "payload" => Ok(Field::Payload),
            other => Err(Failure::bad_request(format!(
                "search field {:?} is not one of key, idempotency, header, payload",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Field::Key => "key",
            Field::Idempotency => "idempotency",
            Field::Header => "header",
            Field::Payload => "payload",
        }
    }

    /// Keys match exactly; a header as `name` or `name=value`; payload text as a substring.
    fn matches(self, m: &StoredMessage, q: &str) -> bool {
        match self {
            Field::Key => m.key.as_deref() == Some(q),
            Field::Idempotency => m.idempotency_key.as_deref() == Some(q),
            Field::Header => match q.split_once('=') {
                Some((n, v)) => m.headers.iter().any(|(k, val)| k == n && val.as_ref() == v.as_bytes()),
                None => m.headers.iter().any(|(k, _)| k == q),
            },
            Field::Payload => !q.is_empty() && m.payload.windows(q.len()).any(|w| w == q.as_bytes()),
        }
    }
}

/// Newest first (the default) or oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Newest,
    Oldest,
}

/// The request's paging and search parameters, validated.
struct Params {
    order: Order,
    limit: u64,
    from: Option<u64>,
    view: View,
    search: Option<(Field, String)>,
    /// A search goes on below this sequence (newest first) or above it (oldest first).
    after: Option<u64>,
}

fn params(p: &HashMap<String, String>) -> Result<Params, Failure> {
    let get = |k: &str| p.get(k).map(String::as_str).map(str::trim).filter(|s| !s.is_empty());
    let order = match get("order") {
        None | Some("newest") => Order::Newest,
        Some("oldest") => Order::Oldest,
        Some(other) => {
            return Err(Failure::bad_request(format!(
                "order {:?} is not newest or oldest",
                other.chars().take(40).collect::<String>()
            )));
        }
    };
    let search = match get("q") {
        Some(q) => Some((Field::parse(get("field"))?, q.chars().take(512).collect())),
        None => None,
    };
    Ok(Params {
        order,
        limit: input::limit("limit", get("limit"), input::MAX_LIST as u64)?.unwrap_or(20),
        from: get("from").map(|s| input::seq("from", s)).transpose()?,
        view: View::parse(get("view")),
        search,
        after: get("after").map(|s| input::seq("after", s)).transpose()?,
    })
}

/// Where each message stands in one work group: `(group, state by seq, committed)`.
struct GroupView {
    group: String,
    committed: u64,
    states: HashMap<u64, (&'static str, String)>,
}

impl GroupView {
    /// The state's label and a tooltip.
    fn state(&self, seq: u64) -> (&'static str, String) {
        if let Some(s) = self.states.get(&seq) {
            return s.clone();
        }
        if seq <= self.committed {
            ("done", format!("at or below the committed offset {}", self.committed))
        } else {
            (
                "open",
                "not finished as of the committed offset: waiting to be claimed, or acked out of order \
                 (the offset moves over it once every message before it finishes)"
                    .into(),
            )
        }
    }
}

async fn group_views(
    st: &State,
    stats: &Stats,
    queue: &str,
    now: SystemTime,
) -> Result<Vec<GroupView>, Failure> {
    let mut out = Vec::new();
    for g in stats.groups.iter().filter(|g| g.queue == queue && g.mode == GroupMode::WorkQueue) {
        let mut states = HashMap::new();
        if let Some(dlq) =
            g.dead_letter_queue.as_deref().filter(|d| stats.queues.iter().any(|q| q.name == *d))
        {
            for d in st.source.dead_letters(dlq, DEAD_SCAN).await? {
                if d.queue.as_deref() == Some(queue)
                    && d.group.as_deref() == Some(g.group.as_str())
                    && let Some(seq) = d.seq
                {
                    states.insert(
                        seq,
                        ("dead", format!("in {dlq} after {} attempts: {}", d.attempts, d.reason)),
                    );
                }
            }
        }
        for c in st.source.pending(queue, &g.group).await? {
            let tip = match c.state {
                PendingState::Leased => format!(
                    "attempt {} held by {} until {}",
                    c.attempt,
                    c.holder.as_deref().unwrap_or("?"),
                    c.lease_deadline.map_or_else(|| "-".into(), |t| fmt::relative(t, now))
                ),
                PendingState::Waiting => format!(
                    "attempt {} failed ({}); retry {}",
                    c.attempt,
                    c.last_error.as_deref().unwrap_or("-"),
                    c.retry_at.map_or_else(|| "-".into(), |t| fmt::relative(t, now))
                ),
                _ => format!("attempt {}: the lease ran out; claimable now", c.attempt),
            };
            let label = super::group::label(c.state);
            states.entry(c.seq).or_insert((label, tip));
        }
        out.push(GroupView { group: g.group.clone(), committed: g.committed, states });
    }
    Ok(out)
}

/// The messages section of queue `q`'s page.
pub(crate) async fn section(
    st: &State,
    ctx: &Ctx,
    stats: &Stats,
    q: &QueueStats,
    p: &HashMap<String, String>,
) -> Result<String, Failure> {
    let params = params(p)?;
    let now = SystemTime::now();
    let (first, last) = (q.first_seq, q.last_seq);
    let (msgs, note) = match &params.search {
        Some((field, text)) => search(st, q, &params, *field, text).await?,
        None => (page(st, q, &params).await?, String::new()),
    };
    let groups = group_views(st, stats, &q.name, now).await?;
    let (b, n) = (esc(&ctx.base), esc(&q.name));
    let url = |extra: &str| {
        let mut u = format!("{b}/queues/{n}?view={}&limit={}", params.view.as_str(), params.limit);
        if params.order == Order::Oldest {
            u.push_str("&order=oldest");
        }
        u.push_str(extra);
        u
    };

    let mut out = String::from(r#"<h2 id="messages-title">Messages</h2>"#);
    // Search and jump.
    let (sq, sf) = params.search.as_ref().map_or(("", "key"), |(f, t)| (t.as_str(), f.as_str()));
    let _ = write!(
        out,
        r#"<div class="toolbar"><form class="search" method="get" action="{b}/queues/{n}"><input type="hidden" name="view" value="{view}"><input type="hidden" name="limit" value="{limit}">
<select name="field" id="search-field">{opts}</select> <input name="q" id="search-q" value="{sq}" placeholder="value, or header name=value"> <button id="search">Search</button></form>
<form class="jump" method="get" action="{b}/queues/{n}"><input type="hidden" name="view" value="{view}"><input type="hidden" name="order" value="oldest"><input type="hidden" name="limit" value="{limit}">
<input name="from" id="jump-seq" size="10" placeholder="sequence"> <button id="jump">Go to</button></form></div>"#,
        view = params.view.as_str(),
        limit = params.limit,
        sq = esc(sq),
        opts = [
            ("key", "ordering key"),
            ("idempotency", "idempotency key"),
            ("header", "header"),
            ("payload", "payload text")
        ]
        .iter()
        .map(|(v, l)| format!(
            r#"<option value="{v}"{}>{l}</option>"#,
            if *v == sf { " selected" } else { "" }
        ))
        .collect::<String>(),
    );
    let _ = write!(out, r#"<p class="views">Payload as "#);
    for v in [View::Text, View::Json, View::Hex] {
        let cls = if v == params.view { r#" class="current""# } else { "" };
        let link = format!("{b}/queues/{n}?view={}&limit={}", v.as_str(), params.limit);
        let _ = write!(out, r#"<a{cls} href="{link}">{}</a> "#, v.as_str());
    }
    let _ = write!(out, "· order: ");
    for (o, label) in [(Order::Newest, "newest first"), (Order::Oldest, "oldest first")] {
        let cls = if o == params.order { r#" class="current""# } else { "" };
        let ord = if o == Order::Oldest { "&order=oldest" } else { "" };
        let _ = write!(
            out,
            r#"<a{cls} id="order-{}" href="{b}/queues/{n}?view={}&limit={}{ord}">{label}</a> "#,
            if o == Order::Oldest { "oldest" } else { "newest" },
            params.view.as_str(),
            params.limit
        );
    }
    out.push_str("</p>");
    if !note.is_empty() {
        out.push_str(&note);
    }

    let mut headers = vec!["Seq", "Enqueued", "Key"];
    let group_cols: Vec<String> = groups.iter().map(|g| format!("State in {}", g.group)).collect();
    headers.extend(group_cols.iter().map(String::as_str));
    headers.extend(["Headers", "Payload"]);
    let rows: Vec<_> = msgs
        .iter()
        .map(|m| {
            let mut key = m.key.as_deref().map_or_else(|| "-".into(), |k| format!("<code>{}</code>", esc(k)));
            if let Some(i) = &m.idempotency_key {
                let _ =
                    write!(key, r#"<br><small title="idempotency key">idem <code>{}</code></small>"#, esc(i));
            }
            if m.priority > 0 {
                let _ = write!(
                    key,
                    r#"<br><small class="priority" title="priority">priority {}</small>"#,
                    m.priority
                );
            }
            let mut row = vec![
                format!(r#"<span id="m{}">{}</span>"#, m.seq, m.seq),
                fmt::when(m.enqueued_at, now),
                key,
            ];
            for g in &groups {
                let (label, tip) = g.state(m.seq);
                let actions = super::job_actions::buttons(ctx, &q.name, &g.group, m.seq, label);
                row.push(format!(
                    r#"<span class="state {label}" title="{}">{label}</span>{}"#,
                    esc(&tip),
                    if actions.is_empty() {
                        String::new()
                    } else {
                        format!(r#"<div class="job-actions">{actions}</div>"#)
                    }
                ));
            }
            row.push(html::headers(&m.headers));
            row.push(html::payload(&m.payload, params.view, 4096));
            row
        })
        .collect();
    out.push_str(&html::table("messages", &headers, &rows));

    // Paging (not while searching: the search note says where to go on).
    if params.search.is_none() && last >= first {
        let lim = params.limit;
        let start = page_start(&params, first, last);
        let end = last.min(start.saturating_add(lim - 1));
        let older = (start > first).then(|| start.saturating_sub(lim).max(first));
        let newer = (end < last).then(|| end + 1);
        let newest_start = last.saturating_sub(lim - 1).max(first);
        let link = |id: &str, label: &str, to: Option<u64>| match to {
            Some(f) => format!(r#"<a id="{id}" href="{}">{label}</a>"#, url(&format!("&from={f}"))),
            None => format!(r#"<span class="disabled">{label}</span>"#),
        };
        let (a, z) = match params.order {
            Order::Newest => (
                [
                    link("page-newest", "« Newest", (end < last).then_some(newest_start)),
                    link("page-newer", "‹ Newer", newer),
                ],
                [
                    link("page-older", "Older ›", older),
                    link("page-oldest", "Oldest »", (start > first).then_some(first)),
                ],
            ),
            Order::Oldest => (
                [
                    link("page-oldest", "« Oldest", (start > first).then_some(first)),
                    link("page-older", "‹ Older", older),
                ],
                [
                    link("page-newer", "Newer ›", newer),
                    link("page-newest", "Newest »", (end < last).then_some(newest_start)),
                ],
            ),
        };
        let _ = write!(
            out,
            r#"<p class="pager" id="pager">{} {} <span id="page-range">#{start}–#{end} of #{first}–#{last}</span> {} {}</p>"#,
            a[0], a[1], z[0], z[1]
        );
    }
    Ok(out)
}

/// The lowest sequence of the page.
fn page_start(p: &Params, first: u64, last: u64) -> u64 {
    let start = match (p.from, p.order) {
        (Some(f), _) => f,
        (None, Order::Oldest) => first,
        (None, Order::Newest) => last.saturating_sub(p.limit - 1),
    };
    start.clamp(first, last.max(first))
}

/// One page of messages, in the page's order.
async fn page(st: &State, q: &QueueStats, p: &Params) -> Result<Vec<StoredMessage>, Failure> {
    if q.last_seq < q.first_seq {
        return Ok(Vec::new());
    }
    let start = page_start(p, q.first_seq, q.last_seq);
    let mut msgs = st.source.peek(&q.name, Some(start), p.limit as usize).await?;
    if p.order == Order::Newest {
        msgs.reverse();
    }
    Ok(msgs)
}

/// Up to `limit` matches, scanning at most [`SEARCH_SCAN`] messages from the newest (or the
/// oldest) on, and a note saying what was searched and where to go on.
async fn search(
    st: &State,
    q: &QueueStats,
    p: &Params,
    field: Field,
    text: &str,
) -> Result<(Vec<StoredMessage>, String), Failure> {
    let (first, last) = (q.first_seq, q.last_seq);
    let mut found = Vec::new();
    let mut scanned = 0u64;
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    let limit = p.limit as usize;
    // Each examined message moves `lo` (newest first) or `hi` (oldest first): the note then
    // names exactly the range searched, and the next request goes on past it.
    match p.order {
        Order::Newest => {
            let mut top = p.after.map_or(last, |a| a.saturating_sub(1)).min(last);
            hi = top;
            'scan: while top >= first && top > 0 && scanned < SEARCH_SCAN {
                let from = top.saturating_sub(CHUNK as u64 - 1).max(first);
                let chunk = st.source.peek(&q.name, Some(from), (top - from + 1) as usize).await?;
                for m in chunk.into_iter().rev() {
                    lo = m.seq;
                    scanned += 1;
                    if field.matches(&m, text) {
                        found.push(m);
                        if found.len() == limit {
                            break 'scan;
                        }
                    }
                }
                if from == first {
                    break;
                }
                top = from - 1;
            }
        }
        Order::Oldest => {
            let mut bottom = p.after.map_or(first, |a| a + 1).max(first);
            lo = bottom;
            'scan: while bottom <= last && scanned < SEARCH_SCAN {
                let to = last.min(bottom + CHUNK as u64 - 1);
                let chunk = st.source.peek(&q.name, Some(bottom), (to - bottom + 1) as usize).await?;
                for m in chunk {
                    hi = m.seq;
                    scanned += 1;
                    if field.matches(&m, text) {
                        found.push(m);
                        if found.len() == limit {
                            break 'scan;
                        }
                    }
                }
                bottom = to + 1;
            }
        }
    }
    let more = scanned > 0
        && match p.order {
            Order::Newest => lo > first,
            Order::Oldest => hi < last,
        };
    let examined_end = if p.order == Order::Newest { lo } else { hi };
    let mut note = format!(
        r#"<p class="summary" id="search-note">{} match{} for {} <code>{}</code> in {}.</p>"#,
        found.len(),
        if found.len() == 1 { "" } else { "es" },
        field.as_str(),
        esc(text),
        if scanned == 0 {
            "no messages".to_owned()
        } else {
            format!("#{lo}–#{hi} ({scanned} messages searched)")
        },
    );
    if more {
        let e = examined_end;
        let _ = write!(
            note,
            r#"<p><a id="search-more" href="?view={}&limit={}{}&field={}&q={}&after={e}">Search {} →</a></p>"#,
            p.view.as_str(),
            p.limit,
            if p.order == Order::Oldest { "&order=oldest" } else { "" },
            field.as_str(),
            esc(&urlencode(text)),
            if p.order == Order::Newest { "older" } else { "newer" },
        );
    }
    Ok((found, note))
}

/// Percent-encodes a query value (everything but unreserved characters).
fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_values_are_percent_encoded() {
        assert_eq!(urlencode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
