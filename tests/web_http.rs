//! The web console at the HTTP level (feature `web`): every route through
//! `tower::ServiceExt::oneshot`, against a real database. Pages must show the numbers
//! `Broker::stats` returns, escape payloads, refuse mutations without the token, the CSRF
//! token or POST, and refuse bad input with an error page while changing nothing (checked
//! through the library). Time is a `ManualClock`; samples are taken with `sample_now`.

mod common;
#[path = "common/console.rs"]
mod console;

#[path = "common/web_client.rs"]
mod web_client;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use console::{SCRIPT, fixture, group};
use rockq::web::{Console, WebError};
use std::collections::BTreeMap;
use web_client::{TOKEN, call, call_raw, get, login, post, table};

/// A console with the token, its reads public: these tests check what pages and actions show
/// and do (the private default has its own tests).
fn writable(broker: &rockq::Broker) -> Router {
    Console::new(broker.clone()).token(TOKEN).public_reads(true).manual_sampling().router()
}

#[tokio::test]
async fn overview_shows_the_numbers_of_broker_stats() {
    let f = fixture().await;
    let (app, sampler) = Console::new(f.broker.clone()).manual_sampling().build();
    sampler.sample_now().await.unwrap();
    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"<meta http-equiv="refresh" content="5">"#), "auto-refresh");
    let stats = f.broker.stats().await.unwrap();
    let queues = table(&page.body, "queues");
    assert_eq!(queues.len(), stats.queues.len());
    for (row, q) in queues.iter().zip(&stats.queues) {
        assert!(row["queue"].starts_with(&q.name), "{row:?}");
        assert_eq!(row["len"], q.len.to_string());
        assert_eq!(row["first"], q.first_seq.to_string());
        assert_eq!(row["last"], q.last_seq.to_string());
        // Human bytes of the queue's size, recent (memtable) writes included: never 0 for a
        // queue with messages (issue 31).
        let cell = page.body.split(&format!(r#"href="/queues/{}">"#, q.name)).nth(1).unwrap();
        let value = cell.split(r#"data-value=""#).nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(value, q.bytes.to_string(), "{row:?}");
        assert!(q.len == 0 || q.bytes > 0, "{row:?}");
    }
    let groups = table(&page.body, "groups");
    assert_eq!(groups.len(), stats.groups.len());
    for (row, g) in groups.iter().zip(&stats.groups) {
        assert_eq!((row["queue"].as_str(), row["group"].as_str()), (g.queue.as_str(), g.group.as_str()));
        assert_eq!(row["mode"], g.mode.as_str());
        assert_eq!(row["committed"], g.committed.to_string());
        assert_eq!(row["lag"], g.lag.to_string());
        assert_eq!(row["in-flight"], g.in_flight.to_string());
        assert_eq!(row["waiting-retry"], g.waiting_retry.to_string());
        assert_eq!(row["dlq-depth"], g.dlq_depth.to_string());
        assert_eq!(row["paused"], if g.paused { "paused" } else { "no" });
    }
    let keyspaces = table(&page.body, "keyspaces");
    assert_eq!(keyspaces.len(), 1);
    assert_eq!((keyspaces[0]["keyspace"].as_str(), keyspaces[0]["keys"].as_str()), ("accounts", "3"));
    // The fixture's figures, so the comparison above is not vacuous.
    let w = group(&stats, "jobs", "workers");
    assert_eq!((w.committed, w.lag, w.in_flight, w.waiting_retry, w.dlq_depth), (2, 4, 1, 1, 2));
    assert_eq!(group(&stats, "orders", "billing").committed, 3);
    // Read-only without a token: no forms, a banner saying so.
    assert!(page.body.contains("read-only") && !page.body.contains(r#"name="csrf""#));
    assert!(page.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap().contains("default-src 'none'"));
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn payloads_and_headers_are_escaped_and_shown_as_text_json_or_hex() {
    let f = fixture().await;
    let app = Console::new(f.broker.clone()).manual_sampling().router();
    let page = get(&app, "/queues/orders").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains("<script>") && !page.body.contains("<b>bold"), "unescaped payload or header");
    assert!(page.body.contains("&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"));
    assert!(page.body.contains("&lt;b&gt;bold&lt;/b&gt;"));
    // Newest first by default.
    let msgs = table(&page.body, "messages");
    let peek = f.broker.peek("orders", None, 20).await.unwrap();
    assert_eq!(msgs.len(), peek.len());
    for (row, m) in msgs.iter().zip(peek.iter().rev()) {
        assert_eq!(row["seq"], m.seq.to_string());
    }
    let json = get(&app, "/queues/orders?view=json&from=2&limit=1").await;
    assert!(json.body.contains("&quot;order&quot;: 2"), "pretty JSON");
    assert_eq!(table(&json.body, "messages").len(), 1);
    let hex = get(&app, "/queues/orders?view=hex&limit=1&order=oldest").await;
    assert!(hex.body.contains("3c 73 63 72 69 70 74 3e"), "hex of <script>");
    // Dead letters: reason escaped too.
    let dlq = get(&app, "/dlq/jobs.dlq").await;
    assert!(dlq.body.contains("bad input: &lt;missing field&gt;") && !dlq.body.contains("<missing"));
    assert!(dlq.body.contains(r#"<b id="dlq-depth">2</b>"#));
    assert_eq!(table(&dlq.body, "dead-letters").len(), 2);
    assert_eq!(table(&get(&app, "/dlq/jobs.dlq?limit=1").await.body, "dead-letters").len(), 1);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn queue_page_lists_pending_claims_as_broker_pending_does() {
    let f = fixture().await;
    let app = writable(&f.broker);

    let page = get(&app, "/groups/jobs/workers").await;
    let rows = table(&page.body, "claims");
    let pending = f.broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(rows.len(), pending.len());
    assert_eq!(pending.len(), 2);
    for (row, c) in rows.iter().zip(&pending) {
        assert_eq!(row["seq"], c.seq.to_string());
        // The console says "retrying" for what the library calls waiting (for a retry): beside
        // never-claimed messages, "waiting" would be ambiguous.
        let state = if c.state == rockq::PendingState::Waiting { "retrying" } else { c.state.as_str() };
        assert_eq!(row["state"], state);
        assert_eq!(row["attempt"], c.attempt.to_string());
        assert_eq!(row["holder"], c.holder.clone().unwrap_or_else(|| "-".into()));
        assert_eq!(row["last-error"], c.last_error.clone().unwrap_or_else(|| "-".into()));
    }
    assert!(rows.iter().any(|r| r["holder"] == "host-a/1" && r["lease-deadline"] != "-"));
    assert!(rows.iter().any(|r| r["state"] == "retrying" && r["retry-at"] != "-"));

    // One job looked up on the page: what Broker::job says, for each claimed one.
    assert!(page.body.contains(r#"<form class="find-job" method="get""#));
    for c in &pending {
        let page = get(&app, &format!("/groups/jobs/workers?job={}", c.seq)).await;
        let job = f.broker.job("jobs", "workers", c.seq).await.unwrap();
        let rows = table(&page.body, "job");
        assert_eq!(rows.len(), 1, "{}", page.body);
        assert_eq!(
            (rows[0]["seq"].as_str(), rows[0]["state"].as_str(), rows[0]["attempt"].clone()),
            (c.seq.to_string().as_str(), job.state.as_str(), job.attempt.to_string())
        );
        assert_eq!(rows[0]["holder"], job.holder.clone().unwrap_or_else(|| "-".into()));
        assert_eq!(rows[0]["priority"], job.priority.to_string());
        assert_eq!(rows[0]["last-error"], job.last_error.clone().unwrap_or_else(|| "-".into()));
        assert_ne!(rows[0]["time-left"], "-", "a leased or retrying job has a time left");
        assert_eq!(rows[0]["outcome"], "-", "running");
        // (Escaped: the cell is read as HTML with its tags stripped.)
        let progress = job
            .progress
            .as_deref()
            .map_or("-".into(), |p| String::from_utf8_lossy(p).replace('<', "&lt;").replace('>', "&gt;"));
        assert_eq!(rows[0]["progress"], progress);
    }
    // The held job's progress report, escaped.
    let page = get(&app, &format!("/groups/jobs/workers?job={}", f.held.seq())).await;
    assert!(page.body.contains("&lt;i&gt;75%&lt;/i&gt;") && !page.body.contains("<i>75%"), "{}", page.body);
    // A dead-lettered job: its kept outcome, the reason escaped.
    let page = get(&app, "/groups/jobs/workers?job=1").await;
    let rows = table(&page.body, "job");
    assert_eq!(rows[0]["state"], "finished");
    assert!(rows[0]["outcome"].starts_with("dead-lettered (attempt 1) at "), "{}", rows[0]["outcome"]);
    assert!(
        rows[0]["outcome"].ends_with("to jobs.dlq#1: bad input: &lt;missing field&gt;"),
        "{}",
        rows[0]["outcome"]
    );
    assert!(page.body.contains("bad input: &lt;missing field&gt;") && !page.body.contains("<missing"));
    // A job never sent, or a typo, is said beside the form; the page stays.
    for (asked, said) in [("999", "999"), ("x1", "not a sequence number")] {
        let page = get(&app, &format!("/groups/jobs/workers?job={asked}")).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(page.body.contains(r#"id="job-missing""#) && page.body.contains(said), "{}", page.body);
        assert!(page.body.contains(r#"<table id="claims">"#), "the rest of the page is there");
    }
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn api_json_matches_stats_pending_peek_and_dead_letters() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let a = get(&app, "/api/stats").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("application/json"));
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    let stats = f.broker.stats().await.unwrap();
    assert_eq!(v["bytes_on_disk"], stats.bytes_on_disk);
    assert_eq!(v["keyspaces"], serde_json::json!([{ "name": "accounts", "keys": 3 }]));
    for (j, q) in v["queues"].as_array().unwrap().iter().zip(&stats.queues) {
        assert_eq!((j["name"].as_str().unwrap(), j["len"].as_u64().unwrap()), (q.name.as_str(), q.len));
        assert_eq!((j["first_seq"].as_u64(), j["last_seq"].as_u64()), (Some(q.first_seq), Some(q.last_seq)));
    }
    for (j, g) in v["groups"].as_array().unwrap().iter().zip(&stats.groups) {
        assert_eq!(j["group"], g.group.as_str());
        assert_eq!(j["committed"], g.committed);
        assert_eq!(j["lag"], g.lag);
        assert_eq!(j["in_flight"], g.in_flight);
        assert_eq!(j["waiting_retry"], g.waiting_retry);
        assert_eq!(j["dlq_depth"], g.dlq_depth);
        assert_eq!(j["paused"], g.paused);
        assert_eq!(j["mode"], g.mode.as_str());
    }
    let p: serde_json::Value =
        serde_json::from_str(&get(&app, "/api/queues/jobs/groups/workers/pending").await.body).unwrap();
    let pending = f.broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(p.as_array().unwrap().len(), pending.len());
    assert_eq!(p[0]["seq"], pending[0].seq);
    // One job, as Broker::job sees it.
    let path = format!("/api/queues/jobs/groups/workers/jobs/{}", pending[0].seq);
    let j: serde_json::Value = serde_json::from_str(&get(&app, &path).await.body).unwrap();
    let status = f.broker.job("jobs", "workers", pending[0].seq).await.unwrap();
    assert_eq!(j["seq"], status.seq);
    assert_eq!(j["state"], status.state.as_str());
    assert_eq!(j["attempt"], status.attempt);
    assert_eq!(j["holder"].as_str(), status.holder.as_deref());
    assert_eq!(j["last_error"].as_str(), status.last_error.as_deref());
    for (path, code) in [
        ("/api/queues/jobs/groups/workers/jobs/999", StatusCode::NOT_FOUND),
        ("/api/queues/jobs/groups/nobody/jobs/1", StatusCode::NOT_FOUND),
        ("/api/queues/jobs/groups/workers/jobs/-1", StatusCode::BAD_REQUEST),
    ] {
        assert_eq!(get(&app, path).await.status, code, "{path}");
    }
    let m: serde_json::Value =
        serde_json::from_str(&get(&app, "/api/queues/orders/messages?limit=2").await.body).unwrap();
    assert_eq!(m[0]["payload"]["text"], SCRIPT);
    assert_eq!(m[0]["headers"][0]["name"], "x-note");
    let d: serde_json::Value = serde_json::from_str(&get(&app, "/api/dlq/jobs.dlq").await.body).unwrap();
    assert_eq!(d.as_array().unwrap().len(), 2);
    assert_eq!(
        (d[0]["queue"].as_str(), d[0]["seq"].as_u64(), d[0]["reason"].as_str()),
        (Some("jobs"), Some(1), Some("bad input: <missing field>"))
    );
    // Errors under /api are JSON too.
    let e = get(&app, "/api/queues/nope/messages").await;
    assert_eq!(e.status, StatusCode::NOT_FOUND);
    assert!(
        serde_json::from_str::<serde_json::Value>(&e.body).unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("nope")
    );
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_the_stats_figures() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let a = get(&app, "/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    // The text format: comments `# HELP name text` / `# TYPE name gauge`, and samples
    // `name{label="value",...} number`, each family typed before its samples.
    let mut typed = std::collections::HashSet::new();
    let mut samples = BTreeMap::new();
    for line in a.body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(kind, "gauge");
            typed.insert(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
        assert!(typed.contains(name), "sample before its TYPE: {line}");
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            for kv in labels[1..labels.len() - 1].split(',') {
                let (k, v) = kv.split_once('=').unwrap();
                assert!(
                    k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && v.starts_with('"')
                        && v.ends_with('"'),
                    "{line}"
                );
            }
        }
        samples
            .insert(series.to_owned(), value.parse::<f64>().unwrap_or_else(|_| panic!("bad value {line:?}")));
    }
    let stats = f.broker.stats().await.unwrap();
    for q in &stats.queues {
        assert_eq!(samples[&format!("rockq_queue_length{{queue=\"{}\"}}", q.name)], q.len as f64);
    }
    for g in &stats.groups {
        let labels = format!("{{queue=\"{}\",group=\"{}\",mode=\"{}\"}}", g.queue, g.group, g.mode.as_str());
        assert_eq!(samples[&format!("rockq_group_lag{labels}")], g.lag as f64);
        assert_eq!(samples[&format!("rockq_group_dlq_depth{labels}")], g.dlq_depth as f64);
    }
    assert_eq!(samples["rockq_database_bytes"], stats.bytes_on_disk as f64);
    assert_eq!(samples["rockq_keyspace_keys{keyspace=\"accounts\"}"], 3.0);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn without_a_token_every_mutation_is_refused_and_nothing_changes() {
    let f = fixture().await;
    let app = Console::new(f.broker.clone()).manual_sampling().router();
    let before = f.broker.stats().await.unwrap();
    for path in
        ["/groups/orders/billing/pause", "/dlq/jobs.dlq/redrive", "/trim", "/groups/orders/billing/reset"]
    {
        let a =
            post(&app, path, "target=earliest&confirm=yes", &[("authorization", &format!("Bearer {TOKEN}"))])
                .await;
        assert!(
            a.status == StatusCode::FORBIDDEN || a.status == StatusCode::UNAUTHORIZED,
            "{path}: {}",
            a.status
        );
        let a = post(&app, path, "target=earliest&confirm=yes", &[]).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}");
        assert!(a.body.contains("read-only") && a.body.contains("nothing was changed"), "{}", a.body);
    }
    let login = post(&app, "/login", "token=anything", &[]).await;
    assert_eq!(login.status, StatusCode::FORBIDDEN);
    assert_eq!(f.broker.stats().await.unwrap(), before);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn the_token_is_required_for_the_api_and_checked_in_constant_time() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let path = "/api/groups/orders/billing/pause";
    assert_eq!(post(&app, path, "", &[]).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        post(&app, path, "", &[("authorization", "Bearer wrong")]).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        post(&app, path, "", &[("authorization", "Basic czNjcmV0")]).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert!(!group(&f.broker.stats().await.unwrap(), "orders", "billing").paused);
    let ok = post(&app, path, "", &[("authorization", &format!("Bearer {TOKEN}"))]).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&ok.body).unwrap()["paused"], true);
    assert!(group(&f.broker.stats().await.unwrap(), "orders", "billing").paused);
    let ok =
        post(&app, "/api/groups/orders/billing/resume", "", &[("authorization", &format!("Bearer {TOKEN}"))])
            .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(!group(&f.broker.stats().await.unwrap(), "orders", "billing").paused);
    // A wrong bearer is refused even on a page anyone may read.
    let page =
        call(&app, Request::get("/").header("authorization", "Bearer nope").body(Body::empty()).unwrap())
            .await;
    assert_eq!(page.status, StatusCode::UNAUTHORIZED);
    // A wrong login opens no session.
    let bad = post(&app, "/login", "token=wrong", &[]).await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    assert!(bad.headers.get(header::SET_COOKIE).is_none());
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// Guessing the token runs at one try a second at either door: a wrong bearer token is
/// answered as a failed login is, after the delay and one at a time, however many come at
/// once. On tokio's paused clock (no real waiting): three at once take three delays.
#[tokio::test]
async fn wrong_bearer_tokens_are_throttled_as_failed_logins_are() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let delay = std::time::Duration::from_secs(1);
    tokio::time::pause();
    for (door, path, form) in
        [("bearer", "/api/groups/orders/billing/pause", ""), ("login", "/login", "token=guess")]
    {
        let start = tokio::time::Instant::now();
        let guesses = (0..3).map(|i| {
            let app = app.clone();
            let bearer = format!("Bearer guess-{i}");
            async move {
                let headers: Vec<(&str, &str)> =
                    if door == "bearer" { vec![("authorization", &bearer)] } else { vec![] };
                post(&app, path, form, &headers).await.status
            }
        });
        let answers = futures::future::join_all(guesses).await;
        assert_eq!(answers, vec![StatusCode::UNAUTHORIZED; 3], "{door}");
        assert!(start.elapsed() >= delay * 3, "{door}: three guesses answered in {:?}", start.elapsed());
    }
    // Real time again for the broker (on etcd its requests time out on the paused clock).
    tokio::time::resume();
    assert!(
        !group(&f.broker.stats().await.unwrap(), "orders", "billing").paused,
        "no guess changed anything"
    );
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn browser_forms_need_the_session_csrf_token_and_the_same_site() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let form = get(&app, "/login").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.body.contains(r#"type="password" name="token""#));
    let anonymous = get(&app, "/").await;
    assert!(anonymous.body.contains("log in to act") && !anonymous.body.contains(r#"name="csrf""#));
    let (cookie, csrf) = login(&app).await;
    let path = "/groups/orders/billing/pause";
    let paused = || async { group(&f.broker.stats().await.unwrap(), "orders", "billing").paused };
    // No session: 401, the login link.
    assert_eq!(post(&app, path, &format!("csrf={csrf}"), &[]).await.status, StatusCode::UNAUTHORIZED);
    // Session without the form's token, or with a wrong one.
    assert_eq!(post(&app, path, "", &[("cookie", &cookie)]).await.status, StatusCode::FORBIDDEN);
    let wrong = "0".repeat(64);
    let a = post(&app, path, &format!("csrf={wrong}"), &[("cookie", &cookie)]).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.body.contains("CSRF"));
    // The right token, but from another site.
    let cross = [("cookie", cookie.as_str()), ("sec-fetch-site", "cross-site")];
    assert_eq!(post(&app, path, &format!("csrf={csrf}"), &cross).await.status, StatusCode::FORBIDDEN);
    let evil = [("cookie", cookie.as_str()), ("origin", "http://evil.example"), ("host", "127.0.0.1:8080")];
    assert_eq!(post(&app, path, &format!("csrf={csrf}"), &evil).await.status, StatusCode::FORBIDDEN);
    assert!(!paused().await, "a refused request paused the group");
    // Same origin, right token: done, back to the queue page.
    let ok = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:8080"),
        ("host", "127.0.0.1:8080"),
        ("sec-fetch-site", "same-origin"),
    ];
    let a = post(&app, path, &format!("csrf={csrf}"), &ok).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(a.headers[header::LOCATION], "/queues/orders");
    assert!(paused().await);
    // Logging out ends the session: the same cookie and token no longer act.
    assert_eq!(
        post(&app, "/logout", &format!("csrf={csrf}"), &[("cookie", &cookie)]).await.status,
        StatusCode::SEE_OTHER
    );
    let after =
        post(&app, "/groups/orders/billing/resume", &format!("csrf={csrf}"), &[("cookie", &cookie)]).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    assert!(paused().await);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn get_on_a_mutating_route_is_refused_and_changes_nothing() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let before = f.broker.stats().await.unwrap();
    for path in [
        "/groups/orders/billing/pause",
        "/groups/orders/billing/resume",
        "/groups/orders/billing/reset",
        "/dlq/jobs.dlq/redrive",
        "/trim",
        "/logout",
        "/api/groups/orders/billing/pause",
        "/api/dlq/jobs.dlq/redrive",
        "/api/trim",
    ] {
        let a = call(
            &app,
            Request::get(path)
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(a.headers[header::ALLOW], "POST");
        assert!(a.body.contains("POST only"), "{path}: {}", a.body);
    }
    assert_eq!(f.broker.stats().await.unwrap(), before);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_an_error_page_and_changes_nothing() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    let names_before = f.broker.queue_names();
    let before = f.broker.stats().await.unwrap();
    let dlq_before = f.broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap();
    let cases: &[(&str, String, StatusCode, &str)] = &[
        ("/groups/orders/no-such/pause", format!("csrf={csrf}"), StatusCode::NOT_FOUND, "does not exist"),
        ("/groups/no-such/billing/pause", format!("csrf={csrf}"), StatusCode::NOT_FOUND, "does not exist"),
        ("/groups/bad%20name/billing/pause", format!("csrf={csrf}"), StatusCode::BAD_REQUEST, "invalid"),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=seq&value=abc&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "not a sequence",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=seq&value=-1&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "not a sequence",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=seq&value=99999999999999999999999&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "too large",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=seq&value=500&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "outside the retained range",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=time&value=yesterday&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "not understood",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=time&value=2999-01-01T00:00:00Z&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "in the future",
        ),
        (
            "/groups/orders/billing/reset",
            format!("csrf={csrf}&target=sideways&confirm=yes"),
            StatusCode::BAD_REQUEST,
            "not one of",
        ),
        (
            "/groups/orders/nobody/reset",
            format!("csrf={csrf}&target=earliest&confirm=yes"),
            StatusCode::NOT_FOUND,
            "does not exist",
        ),
        (
            "/dlq/jobs.dlq/redrive",
            format!("csrf={csrf}&to=no-such-queue"),
            StatusCode::BAD_REQUEST,
            "does not exist",
        ),
        ("/dlq/jobs.dlq/redrive", format!("csrf={csrf}&to=%3Cscript%3E"), StatusCode::BAD_REQUEST, "invalid"),
        ("/dlq/jobs.dlq/redrive", format!("csrf={csrf}&to=jobs.dlq"), StatusCode::BAD_REQUEST, "into itself"),
        ("/dlq/jobs.dlq/redrive", format!("csrf={csrf}&limit=0"), StatusCode::BAD_REQUEST, "between 1 and"),
        (
            "/dlq/jobs.dlq/redrive",
            format!("csrf={csrf}&limit=lots"),
            StatusCode::BAD_REQUEST,
            "not a sequence",
        ),
        ("/dlq/no-such.dlq/redrive", format!("csrf={csrf}"), StatusCode::NOT_FOUND, "does not exist"),
    ];
    for (path, form, status, says) in cases {
        let a = post(&app, path, form, &h).await;
        assert_eq!(a.status, *status, "{path} {form}: {}", a.body);
        assert!(a.body.contains(says), "{path} {form}: {}", a.body);
        assert!(
            a.body.contains(r#"id="error""#)
                && a.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html")
        );
        assert!(!a.body.contains("<script>"), "input echoed unescaped");
    }
    // A form body that is not a form, and bad page inputs.
    let a = call(
        &app,
        Request::post("/groups/orders/billing/pause")
            .header("cookie", &cookie)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    for (path, status) in [
        ("/queues/nope", StatusCode::NOT_FOUND),
        ("/queues/orders?limit=0", StatusCode::BAD_REQUEST),
        ("/queues/orders?limit=100000", StatusCode::BAD_REQUEST),
        ("/queues/orders?from=x", StatusCode::BAD_REQUEST),
        ("/dlq/nope", StatusCode::NOT_FOUND),
        ("/jobs/77", StatusCode::NOT_FOUND),
        ("/jobs/x", StatusCode::BAD_REQUEST),
        ("/no/such/page", StatusCode::NOT_FOUND),
    ] {
        let a = get(&app, path).await;
        assert_eq!(a.status, status, "{path}: {}", a.body);
        assert!(a.body.contains(r#"id="error""#), "{path}");
    }
    // Nothing changed: no queue created, no offset moved, no dead letter moved.
    assert_eq!(f.broker.queue_names(), names_before);
    assert_eq!(f.broker.stats().await.unwrap(), before);
    assert_eq!(f.broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap(), dlq_before);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn reset_asks_for_confirmation_then_moves_the_offset() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    let a = post(&app, "/groups/orders/billing/reset", &format!("csrf={csrf}&target=seq&value=2"), &h).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("confirm-text") && a.body.contains("sequence 2"), "{}", a.body);
    assert_eq!(
        group(&f.broker.stats().await.unwrap(), "orders", "billing").committed,
        3,
        "moved before confirmation"
    );
    let a = post(
        &app,
        "/groups/orders/billing/reset",
        &format!("csrf={csrf}&target=seq&value=2&confirm=yes"),
        &h,
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(group(&f.broker.stats().await.unwrap(), "orders", "billing").committed, 1);
    // By time: every message was sent at the clock's start, so "1h ago" means the first.
    let a = post(&app, "/groups/orders/billing/reset", &format!("csrf={csrf}&target=latest&confirm=yes"), &h)
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(group(&f.broker.stats().await.unwrap(), "orders", "billing").committed, 10);
    let a = post(
        &app,
        "/api/groups/orders/billing/reset",
        "target=time&value=0",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["next_seq"], 1);
    // A relative time is resolved once, on the confirmation page: the form sends the instant.
    let a = post(&app, "/groups/orders/billing/reset", &format!("csrf={csrf}&target=latest&confirm=yes"), &h)
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let a =
        post(&app, "/groups/orders/billing/reset", &format!("csrf={csrf}&target=time&value=1h"), &h).await;
    let at = a.body.find(r#"name="value" value=""#).unwrap() + r#"name="value" value=""#.len();
    let instant = &a.body[at..at + a.body[at..].find('"').unwrap()];
    assert!(instant.len() == 27 && instant.ends_with('Z'), "{instant}");
    assert_eq!(group(&f.broker.stats().await.unwrap(), "orders", "billing").committed, 10);
    let a = post(
        &app,
        "/groups/orders/billing/reset",
        &format!("csrf={csrf}&target=time&value={instant}&confirm=yes"),
        &h,
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(
        group(&f.broker.stats().await.unwrap(), "orders", "billing").committed,
        0,
        "every message is younger than 1h"
    );
    // A work group with a live subscription refuses: 409, nothing moved.
    let a = post(&app, "/groups/jobs/workers/reset", &format!("csrf={csrf}&target=earliest&confirm=yes"), &h)
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    assert_eq!(group(&f.broker.stats().await.unwrap(), "jobs", "workers").committed, 2);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn redrive_runs_as_a_job_with_progress_and_moves_the_dead_letters() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let jobs_last =
        f.broker.stats().await.unwrap().queues.iter().find(|q| q.name == "jobs").unwrap().last_seq;
    // One first, to the origin queue: the form asks first, moving nothing.
    let a =
        post(&app, "/dlq/jobs.dlq/redrive", &format!("csrf={csrf}&limit=1"), &[("cookie", &cookie)]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("Redrive 1 of the 2 dead letters of <b>jobs.dlq</b>"), "{}", a.body);
    assert!(a.body.contains(r#"<input type="hidden" name="limit" value="1">"#), "{}", a.body);
    assert_eq!(f.broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap(), 2);
    let a = post(
        &app,
        "/dlq/jobs.dlq/redrive",
        &format!("csrf={csrf}&limit=1&to=&confirm=yes"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(a.headers[header::LOCATION], "/jobs/1");
    let j: serde_json::Value = serde_json::from_str(&get(&app, "/api/jobs/1?wait=1").await.body).unwrap();
    assert_eq!(
        (j["done"].as_bool(), j["total"].as_u64(), j["moved"].as_u64(), j["error"].is_null()),
        (Some(true), Some(1), Some(1), true)
    );
    let page = get(&app, "/jobs/1").await;
    assert!(
        page.body.contains(r#"<span id="job-moved">1</span> of <span id="job-total">1</span>"#)
            && page.body.contains("done")
    );
    assert_eq!(f.broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap(), 1);
    let jobs_q = f.broker.peek("jobs", Some(jobs_last + 1), 10).await.unwrap();
    assert_eq!(jobs_q.len(), 1);
    assert_eq!(jobs_q[0].payload, "job 1");
    // The rest to another queue, through the API.
    f.broker.queue("quarantine").await.unwrap();
    let a = post(
        &app,
        "/api/dlq/jobs.dlq/redrive",
        "to=quarantine",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let id = serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["job"].as_u64().unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&get(&app, &format!("/api/jobs/{id}?wait=1")).await.body).unwrap();
    assert_eq!((j["moved"].as_u64(), j["to"].as_str()), (Some(1), Some("quarantine")));
    assert_eq!(f.broker.peek("quarantine", None, 10).await.unwrap()[0].payload, "job 2");
    assert!(f.broker.dead_letters("jobs.dlq").await.unwrap().is_empty().await.unwrap());
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn trim_runs_a_retention_pass() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    // The form asks first; nothing is deleted until confirmed.
    let a = post(&app, "/trim", &format!("csrf={csrf}"), &[("cookie", &cookie)]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains(r#"id="confirm-text""#), "{}", a.body);
    let q = f.broker.stats().await.unwrap().queues.into_iter().find(|q| q.name == "orders").unwrap();
    assert_eq!((q.first_seq, q.len), (1, 10));
    // Confirmed: a report of what was deleted.
    let a = post(&app, "/trim", &format!("csrf={csrf}&confirm=yes"), &[("cookie", &cookie)]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // `orders` keeps until acknowledged: billing committed 3, so 3 messages go.
    let q = f.broker.stats().await.unwrap().queues.into_iter().find(|q| q.name == "orders").unwrap();
    assert_eq!((q.first_seq, q.len), (4, 7));
    // `jobs` too: its group finished 2.
    assert!(a.body.contains(r#"<b id="trim-deleted">5</b>"#), "{}", a.body);
    let trimmed = table(&a.body, "trimmed");
    let rows: Vec<_> = trimmed
        .iter()
        .map(|r| (r["queue"].as_str(), r["deleted"].as_str(), r["first-now"].as_str()))
        .collect();
    assert_eq!(rows, [("jobs", "2", "#3"), ("orders", "3", "#4")]);
    let a = post(&app, "/api/trim", "", &[("authorization", &format!("Bearer {TOKEN}"))]).await;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["deleted"], 0);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn the_sampler_feeds_the_charts_and_stops_with_the_router() {
    let f = fixture().await;
    let (app, sampler) = Console::new(f.broker.clone()).manual_sampling().history(3).build();
    let page = get(&app, "/").await;
    assert!(page.body.contains("waiting for samples") || !page.body.contains("<svg"));
    let orders = f.broker.queue("orders").await.unwrap();
    for i in 0..4 {
        orders.send(format!("more {i}")).await.unwrap();
        sampler.sample_now().await.unwrap();
    }
    let page = get(&app, "/").await;
    assert!(page.body.contains(r#"<svg class="chart""#) && page.body.contains("<polyline"), "no chart");
    assert!(page.body.contains("queue orders") && page.body.contains("group orders/billing"));
    let h: serde_json::Value = serde_json::from_str(&get(&app, "/api/history").await.body).unwrap();
    let orders_h = h["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "orders").unwrap();
    let seqs: Vec<u64> =
        orders_h["samples"].as_array().unwrap().iter().map(|s| s["last_seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [12, 13, 14], "a bounded ring of the last 3 samples");
    assert_eq!(orders_h["enqueued_per_sec"].as_array().unwrap().len(), 2);
    drop(app);
    assert!(matches!(sampler.sample_now().await, Err(WebError::Stopped)));
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn a_read_only_console_reads_a_database_another_broker_holds() {
    let f = fixture().await;
    // Private (the default with a token): the read-only console takes its token for reads.
    let app = Console::read_only(f.dir.path()).token(TOKEN).manual_sampling().router();
    assert_eq!(get(&app, "/").await.status, StatusCode::SEE_OTHER, "anonymous: to the login form");
    let bearer = format!("Bearer {TOKEN}");
    let with_token =
        |path: &str| Request::get(path).header(header::AUTHORIZATION, &bearer).body(Body::empty()).unwrap();
    let page = call(&app, with_token("/")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(
        call(&app, with_token("/metrics")).await.status,
        StatusCode::OK,
        "a scraper with the token reads"
    );
    let app = Console::read_only(f.dir.path()).token(TOKEN).public_reads(true).manual_sampling().router();
    let stats = f.broker.stats().await.unwrap();
    let rows = table(&page.body, "queues");
    assert_eq!(rows.len(), stats.queues.len());
    for (row, q) in rows.iter().zip(&stats.queues) {
        assert_eq!(row["len"], q.len.to_string());
    }
    let groups = table(&page.body, "groups");
    assert_eq!(
        groups.iter().find(|g| g["group"] == "workers").unwrap()["lag"],
        group(&stats, "jobs", "workers").lag.to_string()
    );
    assert!(page.body.contains("read-only"));
    assert_eq!(get(&app, "/dlq/jobs.dlq").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/queues/jobs").await.status, StatusCode::OK);
    // The token is the console's (a 403 "read-only", not a 401), but nothing may change.
    let a = post(&app, "/api/groups/orders/billing/pause", "", &[("authorization", &bearer)]).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert!(a.body.contains("read-only"), "{}", a.body);
    // A browser logs in (to read a private console); its forms stay hidden.
    assert_eq!(post(&app, "/login", &format!("token={TOKEN}"), &[]).await.status, StatusCode::SEE_OTHER);
    assert_eq!(f.broker.stats().await.unwrap(), stats);
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn nested_under_a_prefix_every_link_and_redirect_keeps_it() {
    let f = fixture().await;
    let app = Router::new().nest("/rockq", writable(&f.broker));
    let page = get(&app, "/rockq").await;
    assert_eq!(page.status, StatusCode::OK);
    // The overview's links point at the mount point itself (a nest does not route `/rockq/`).
    assert!(page.body.contains(r#"class="brand" href="/rockq""#), "{}", page.body);
    assert!(!page.body.contains(r#"href="/rockq/""#));
    let missing = get(&app, "/rockq/queues/nope").await;
    assert!(missing.body.contains(r#"<a href="/rockq">Back to the overview</a>"#), "{}", missing.body);
    assert!(
        page.body.contains(r#"href="/rockq/queues/orders""#)
            && page.body.contains(r#"href="/rockq/dlq/jobs.dlq""#)
    );
    let a = post(&app, "/rockq/login", &format!("token={TOKEN}"), &[]).await;
    assert_eq!(
        a.headers[header::LOCATION],
        "/rockq",
        "the overview is the mount point, which the nest routes"
    );
    assert!(a.headers[header::SET_COOKIE].to_str().unwrap().contains("Path=/rockq;"));
    let q = get(&app, "/rockq/queues/jobs").await;
    assert!(q.body.contains(r#"href="/rockq/queues/jobs?view=hex"#));
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn serve_binds_loopback_only_unless_allowed() {
    let f = fixture().await;
    let mut c = Console::new(f.broker.clone());
    assert!(matches!(c.bind(([0, 0, 0, 0], 0).into()).await, Err(WebError::NotLoopback { .. })));
    let listener = c.bind(([127, 0, 0, 1], 0).into()).await.unwrap();
    assert!(listener.local_addr().unwrap().ip().is_loopback());
    // Remote needs both the permission and a token: without a token anyone reads everything.
    let mut c = Console::new(f.broker.clone()).allow_remote(true);
    assert!(matches!(c.bind(([0, 0, 0, 0], 0).into()).await, Err(WebError::NotLoopback { .. })));
    let mut c = Console::new(f.broker.clone()).allow_remote(true).token(TOKEN);
    assert!(c.bind(([0, 0, 0, 0], 0).into()).await.is_ok());
    // serve_on returns once the broker shuts down.
    let server = tokio::spawn(Console::new(f.broker.clone()).serve_on(listener));
    drop(f.held);
    drop(f.work);
    f.broker.shutdown().await.unwrap();
    tokio::time::timeout(common::HANG_GUARD, server).await.unwrap().unwrap().unwrap();
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// `rockq serve`: read-only while this process holds the database, full once it is free.
#[cfg(feature = "cli")]
#[tokio::test]
async fn rockq_serve_is_read_only_beside_a_running_service_and_full_alone() {
    use tokio::io::AsyncBufReadExt;
    async fn start(db: &std::path::Path, extra: &[&str]) -> (tokio::process::Child, String) {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rockq"))
            .args(["serve", "--db", db.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first =
            tokio::time::timeout(common::HANG_GUARD, lines.next_line()).await.unwrap().unwrap().unwrap();
        let addr = first.split("http://").nth(1).unwrap().split('/').next().unwrap().to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{first}");
        (child, first)
    }
    let f = fixture().await;
    let (mut child, first) = start(f.dir.path(), &["--token", TOKEN]).await;
    assert!(first.contains("held by another process"), "{first}");
    let addr = first.split("http://").nth(1).unwrap().split('/').next().unwrap().to_owned();
    let (status, _) = console::http(&addr, "GET", "/", None).await;
    assert_eq!(status, 303, "private with a token: to the login form");
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let (status, body) = console::http_with(&addr, "GET", "/", None, &[&bearer]).await;
    assert_eq!(status, 200);
    assert!(body.contains("read-only") && body.contains(r#"href="/queues/jobs""#));
    let (status, _) = console::http(&addr, "POST", "/api/trim", None).await;
    assert_eq!(status, 401, "anonymous: not even told it is read-only");
    let (status, _) = console::http_with(&addr, "POST", "/api/trim", None, &[&bearer]).await;
    assert_eq!(status, 403, "the token, but read-only");
    child.kill().await.unwrap();

    drop(f.held);
    drop(f.work);
    f.broker.shutdown().await.unwrap();
    let (mut child, first) = start(f.dir.path(), &["--token", TOKEN]).await;
    assert!(first.contains("full"), "{first}");
    let addr = first.split("http://").nth(1).unwrap().split('/').next().unwrap().to_owned();
    let (status, body) = console::http_with(&addr, "GET", "/", None, &[&bearer]).await;
    assert_eq!(status, 200);
    assert!(body.contains("log in to act"), "{body}");
    // SIGTERM shuts the broker down cleanly: the database opens again at once.
    let pid = child.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(common::HANG_GUARD, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    let again = common::open(f.dir.path()).await;
    assert_eq!(again.stats().await.unwrap().groups.len(), 2);
    again.shutdown().await.unwrap();
    // A signal sent the moment the address is printed is handled too (the handlers were once
    // installed only when serving began: such a signal killed the process, broker unclosed).
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let (mut child, _) = start(f.dir.path(), &["--token", TOKEN]).await;
        assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, signal) }, 0);
        let status = tokio::time::timeout(common::HANG_GUARD, child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "signal {signal}: {status:?}");
    }
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// `tokio::spawn` outside a runtime panics: the console must not.
#[test]
fn built_outside_a_runtime_the_console_works_without_its_sampler_task() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = common::tempdir();
    let broker = rt.block_on(common::open(dir.path()));
    let (app, sampler) = Console::new(broker.clone()).build();
    rt.block_on(async {
        sampler.sample_now().await.unwrap();
        assert_eq!(get(&app, "/").await.status, StatusCode::OK);
        broker.shutdown().await.unwrap();
    });
}

/// A dead-letter queue larger than a redrive chunk moves in several atomic chunks, and the
/// job reports the whole count.
#[tokio::test]
async fn a_big_redrive_moves_in_chunks_and_reports_every_letter() {
    let f = fixture().await;
    let app = writable(&f.broker);
    // Sent straight to a DLQ-named queue: no origin headers, so a target is required.
    let bulk = f.broker.queue("bulk.dlq").await.unwrap();
    bulk.send_batch((0..600).map(|i| format!("letter {i}"))).await.unwrap();
    f.broker.queue("bulk").await.unwrap();
    let bearer = format!("Bearer {TOKEN}");
    // Without a target they cannot go anywhere: the job fails, and nothing moved.
    let a = post(&app, "/api/dlq/bulk.dlq/redrive", "", &[("authorization", &bearer)]).await;
    let id = serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["job"].as_u64().unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&get(&app, &format!("/api/jobs/{id}?wait=1")).await.body).unwrap();
    assert_eq!((j["done"].as_bool(), j["moved"].as_u64()), (Some(true), Some(0)));
    assert!(j["error"].as_str().unwrap().contains("origin"), "{j}");
    assert_eq!(f.broker.dead_letters("bulk.dlq").await.unwrap().len().await.unwrap(), 600);
    let page = get(&app, &format!("/jobs/{id}")).await;
    assert!(page.body.contains("failed:"), "{}", page.body);

    let a = post(&app, "/api/dlq/bulk.dlq/redrive", "to=bulk&limit=550", &[("authorization", &bearer)]).await;
    let id = serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["job"].as_u64().unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&get(&app, &format!("/api/jobs/{id}?wait=1")).await.body).unwrap();
    assert_eq!(
        (j["total"].as_u64(), j["moved"].as_u64(), j["error"].is_null()),
        (Some(550), Some(550), true)
    );
    assert_eq!(f.broker.dead_letters("bulk.dlq").await.unwrap().len().await.unwrap(), 50);
    let moved = f.broker.peek("bulk", None, 500).await.unwrap();
    assert_eq!(
        (moved.len(), moved[0].payload.as_ref(), moved[499].payload.as_ref()),
        (500, &b"letter 0"[..], &b"letter 499"[..])
    );
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// The sampler task ticks on its own (the wait is for a condition, bounded by the hang guard;
/// nothing asserts how long it took).
#[tokio::test]
async fn the_sampler_task_records_on_its_tick() {
    let f = fixture().await;
    let (app, sampler) =
        Console::new(f.broker.clone()).sample_every(std::time::Duration::from_millis(100)).build();
    let until = tokio::time::Instant::now() + common::HANG_GUARD;
    loop {
        let h: serde_json::Value = serde_json::from_str(&get(&app, "/api/history").await.body).unwrap();
        let samples =
            h["groups"].as_array().unwrap().iter().map(|g| g["samples"].as_array().unwrap().len()).min();
        if samples.is_some_and(|n| n >= 2) {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "the sampler task never ticked twice");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(app);
    assert!(matches!(sampler.sample_now().await, Err(WebError::Stopped)));
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits would race
    // RocksDB's own teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// With a token, the console is private: every page, the JSON API and `/metrics` need it (a
/// session or the bearer token); only the login form and the favicon are open. `public_reads`
/// opts out.
#[tokio::test]
async fn with_a_token_every_read_needs_it_unless_reads_are_public() {
    let f = fixture().await;
    let app = Console::new(f.broker.clone()).token(TOKEN).manual_sampling().router();
    let pages = ["/", "/queues/orders", "/dlq/jobs.dlq", "/queues/orders?view=hex", "/flows"];
    let api = [
        "/api/stats",
        "/api/history",
        "/api/queues/orders/messages",
        "/api/dlq/jobs.dlq",
        "/api/flows",
        "/metrics",
    ];
    for path in pages {
        let a = get(&app, path).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(a.headers[header::LOCATION], "/login", "{path}");
        assert!(!a.body.contains("order"), "{path}: nothing of the data");
    }
    for path in api {
        let a = get(&app, path).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(a.headers[header::WWW_AUTHENTICATE].to_str().unwrap().starts_with("Bearer"), "{path}");
        assert!(!a.body.contains("order"), "{path}: nothing of the data");
    }
    assert_eq!(get(&app, "/login").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/favicon.ico").await.status, StatusCode::OK);
    // The bearer token (a scraper, a script) and a browser session read everything.
    let bearer = format!("Bearer {TOKEN}");
    let (cookie, _) = login(&app).await;
    for path in pages.iter().chain(&api) {
        let r = Request::get(*path).header(header::AUTHORIZATION, &bearer).body(Body::empty()).unwrap();
        assert_eq!(call(&app, r).await.status, StatusCode::OK, "bearer {path}");
        let r = Request::get(*path).header(header::COOKIE, &cookie).body(Body::empty()).unwrap();
        assert_eq!(call(&app, r).await.status, StatusCode::OK, "session {path}");
    }
    // A wrong token reads nothing either.
    let r =
        Request::get("/api/stats").header(header::AUTHORIZATION, "Bearer wrong").body(Body::empty()).unwrap();
    assert_eq!(call(&app, r).await.status, StatusCode::UNAUTHORIZED);
    // Opted out: reads are public, actions still need the token.
    let public = writable(&f.broker);
    for path in pages.iter().chain(&api) {
        assert_eq!(get(&public, path).await.status, StatusCode::OK, "public {path}");
    }
    assert_eq!(post(&public, "/api/trim", "", &[]).await.status, StatusCode::UNAUTHORIZED);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

/// DNS rebinding: a page on another name pointed at this machine sends its own `Host`. Only the
/// console's names pass (the port does not matter); no `Host` at all is refused too.
#[tokio::test]
async fn requests_for_a_host_the_console_does_not_answer_to_are_refused() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let with_host =
        |path: &str, host: &str| Request::get(path).header(header::HOST, host).body(Body::empty()).unwrap();
    for path in ["/", "/api/dlq/jobs.dlq", "/metrics", "/login"] {
        let a = call(&app, with_host(path, "evil.test:8080")).await;
        assert_eq!(a.status, StatusCode::MISDIRECTED_REQUEST, "{path}");
        assert!(!a.body.contains("order"), "{path}: nothing of the data");
        let a = call_raw(&app, Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}: no Host");
    }
    for host in ["localhost:8080", "LOCALHOST", "127.0.0.1:9", "[::1]:8080"] {
        assert_eq!(call(&app, with_host("/", host)).await.status, StatusCode::OK, "{host}");
    }
    // The name a reverse proxy forwards, once allowed.
    let proxied = Console::new(f.broker.clone())
        .token(TOKEN)
        .public_reads(true)
        .allowed_host("Queues.Example.com:443")
        .manual_sampling()
        .router();
    assert_eq!(call(&proxied, with_host("/", "queues.example.com")).await.status, StatusCode::OK);
    assert_eq!(call(&proxied, with_host("/", "example.com")).await.status, StatusCode::MISDIRECTED_REQUEST);
    // A refused action changes nothing.
    let before = f.broker.stats().await.unwrap();
    let r = Request::post("/api/trim")
        .header(header::HOST, "evil.test")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, r).await.status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(f.broker.stats().await.unwrap(), before);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

/// Dead-letter views and redrive act on dead-letter queues only: on a live queue, redrive would
/// move live work elsewhere.
#[tokio::test]
async fn redrive_and_the_dead_letter_views_refuse_a_queue_that_is_not_a_dead_letter_queue() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let orders = f.broker.queue("orders").await.unwrap();
    let before = (orders.len(), f.broker.stats().await.unwrap());
    assert_eq!(get(&app, "/dlq/orders").await.status, StatusCode::NOT_FOUND);
    let a = get(&app, "/api/dlq/orders").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.body.contains("not a dead-letter queue"), "{}", a.body);
    let bearer = format!("Bearer {TOKEN}");
    let a = post(&app, "/api/dlq/orders/redrive", "to=jobs", &[("authorization", &bearer)]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    assert_eq!((orders.len(), f.broker.stats().await.unwrap()), before, "nothing moved");
    // A real one still works.
    assert_eq!(get(&app, "/dlq/jobs.dlq").await.status, StatusCode::OK);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

/// Flows: the list and one flow's page show what `Broker::flow_status` says (graph and steps,
/// failure reasons escaped), the JSON is the library's one shape, bad ids are clear errors, and
/// a read-only console reads them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_pages_and_json_show_what_flow_status_says() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let empty = get(&app, "/flows").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(table(&empty.body, "flows").is_empty());
    let id = common::flow_in_progress(&f.broker).await;
    let status = f.broker.flow_status(id).await.unwrap();

    let list = get(&app, "/flows").await;
    let rows = table(&list.body, "flows");
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0]["flow"].as_str(), rows[0]["steps"].as_str()), (id.to_string().as_str(), "5"));
    assert!(rows[0]["state"].contains("running"), "{:?}", rows[0]);
    assert!(
        list.body.contains("nav") && list.body.contains(r#"href="/flows""#),
        "linked from the navigation"
    );

    let page = get(&app, &format!("/flows/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let steps = table(&page.body, "steps");
    assert_eq!(steps.len(), status.steps.len());
    for (row, s) in steps.iter().zip(&status.steps) {
        assert_eq!(row["step"], s.step.to_string());
        assert!(row["state"].contains(s.state.as_str()), "{row:?}");
        assert!(row["queue"].contains(&s.queue) && row["group"].contains(&s.group), "{row:?}");
    }
    assert!(steps[0]["detail"].contains("small-a.jpg"), "{:?}", steps[0]);
    assert!(steps[3]["after"].contains("all succeeded of 0-2"), "{:?}", steps[3]);
    // The dead letter's reason is text, never markup.
    assert!(!page.body.contains("<img src=x>"), "unescaped reason");
    assert!(page.body.contains("unreadable &lt;img src=x&gt;"));
    // The graph: three resizes, the album and the report, edges from each resize to both.
    assert!(page.body.contains(r#"id="flow-graph""#));
    assert_eq!(page.body.matches(r#"<g class="node "#).count(), 5);
    assert_eq!(page.body.matches(r#"class="edge""#).count(), 6);
    assert_eq!(page.body.matches(r#"data-state="failed""#).count(), 1);
    assert_eq!(page.body.matches(r#"data-state="blocked""#).count(), 1);
    assert_eq!(page.body.matches(r#"data-state="succeeded""#).count(), 2);
    assert!(page.body.contains(r#"href="/groups/images/resize?job=3""#), "a step links to its job");

    // JSON: the library's shape, the same as `rockq flow --json`.
    let one = get(&app, &format!("/api/flows/{id}")).await;
    assert_eq!(one.status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&one.body).unwrap();
    assert_eq!(v["state"], "running");
    assert_eq!(v["tally"]["total"], 5);
    let states: Vec<_> =
        v["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap().to_owned()).collect();
    let expected: Vec<_> = status.steps.iter().map(|s| s.state.as_str().to_owned()).collect();
    assert_eq!(states, expected);
    let listed: serde_json::Value = serde_json::from_str(&get(&app, "/api/flows").await.body).unwrap();
    assert_eq!(listed[0]["id"], id);
    assert!(listed[0].get("steps").is_none(), "the list leaves the steps out");
    let after: serde_json::Value =
        serde_json::from_str(&get(&app, &format!("/api/flows?from={}", id + 1)).await.body).unwrap();
    assert_eq!(after, serde_json::json!([]));

    // Bad input: clear errors.
    for (path, code) in [
        ("/flows/abc", StatusCode::BAD_REQUEST),
        ("/flows/99", StatusCode::NOT_FOUND),
        ("/api/flows/99", StatusCode::NOT_FOUND),
        ("/flows?limit=100000", StatusCode::BAD_REQUEST),
        ("/flows?from=x", StatusCode::BAD_REQUEST),
    ] {
        let a = get(&app, path).await;
        assert_eq!(a.status, code, "{path}: {}", a.body);
    }
    assert!(get(&app, "/flows/99").await.body.contains("no flow 99"));

    // A read-only console over the same database (the service holds it); on etcd there is no
    // database directory (its console is `rockq serve --etcd`, tests/web_etcd.rs).
    if !common::against_etcd() {
        f.broker.flush().await.unwrap();
        let ro = Console::read_only(f.dir.path()).token(TOKEN).public_reads(true).manual_sampling().router();
        let page = get(&ro, &format!("/flows/{id}")).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert_eq!(table(&page.body, "steps").len(), 5);
        assert_eq!(table(&get(&ro, "/flows").await.body, "flows").len(), 1);
    }
    drop(f.held);
    let _ = f.broker.shutdown().await;
}
