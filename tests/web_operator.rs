//! The console as an operator's tool (issue 31), at the HTTP level against a real database:
//! paging either way, jump and search, each message's state per work group with per-job
//! actions, the group page, delayed messages and schedules, purge and delete with
//! confirmations, and problems flagged. Every figure is checked against the library, every
//! action's effect through it; a refused or unconfirmed action changes nothing.

mod common;
#[path = "common/console.rs"]
mod console;
#[path = "common/web_client.rs"]
mod web_client;

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use console::{fixture, group};
use rockq::Message;
use rockq::web::Console;
use web_client::{TOKEN, get, login, post, strip_tags, table};

fn writable(broker: &rockq::Broker) -> Router {
    Console::new(broker.clone()).token(TOKEN).public_reads(true).manual_sampling().router()
}

fn seqs(page: &str) -> Vec<String> {
    table(page, "messages").into_iter().map(|r| r["seq"].clone()).collect()
}

/// The `href` of the element with id `id`.
fn href(page: &str, id: &str) -> Option<String> {
    let at = page.find(&format!(r#"id="{id}" href=""#))? + format!(r#"id="{id}" href=""#).len();
    Some(page[at..at + page[at..].find('"')?].replace("&amp;", "&"))
}

#[tokio::test]
async fn messages_page_newest_first_or_oldest_first_with_every_pager_link() {
    let f = fixture().await;
    let app = writable(&f.broker);
    // orders holds 1..=10.
    let page = get(&app, "/queues/orders?limit=3").await.body;
    assert_eq!(seqs(&page), ["10", "9", "8"]);
    assert!(page.contains(r#"<span id="page-range">#8–#10 of #1–#10</span>"#), "{page}");
    assert!(
        href(&page, "page-newer").is_none() && href(&page, "page-newest").is_none(),
        "on the newest page"
    );
    let older = href(&page, "page-older").unwrap();
    let page = get(&app, &older).await.body;
    assert_eq!(seqs(&page), ["7", "6", "5"]);
    let page = get(&app, &href(&page, "page-oldest").unwrap()).await.body;
    assert_eq!(seqs(&page), ["3", "2", "1"]);
    assert!(href(&page, "page-older").is_none());
    let page = get(&app, &href(&page, "page-newest").unwrap()).await.body;
    assert_eq!(seqs(&page), ["10", "9", "8"]);
    // Oldest first.
    let page = get(&app, "/queues/orders?limit=4&order=oldest").await.body;
    assert_eq!(seqs(&page), ["1", "2", "3", "4"]);
    let page = get(&app, &href(&page, "page-newer").unwrap()).await.body;
    assert_eq!(seqs(&page), ["5", "6", "7", "8"]);
    let page = get(&app, &href(&page, "page-newest").unwrap()).await.body;
    assert_eq!(seqs(&page), ["7", "8", "9", "10"]);
    // Jump to a sequence.
    let page = get(&app, "/queues/orders?order=oldest&from=6&limit=2").await.body;
    assert_eq!(seqs(&page), ["6", "7"]);
    // Bad paging input: 400, nothing else.
    for bad in ["order=sideways", "from=-1", "limit=0", "limit=100000"] {
        let a = get(&app, &format!("/queues/orders?{bad}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {}", a.body);
    }
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn search_by_ordering_key_idempotency_key_header_or_payload_says_what_it_searched() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let emails = f.broker.queue("emails").await.unwrap();
    for i in 1..=12u32 {
        let tenant = if i % 3 == 0 { "acme" } else { "globex" };
        let m = Message::new(format!("mail {i} for {tenant}"))
            .key(format!("user-{}", i % 4))
            .idempotency_key(format!("mail-{i}"))
            .header("x-tenant", tenant);
        emails.send(m).await.unwrap();
    }
    let by = |field: &str, q: &str| format!("/queues/emails?field={field}&q={q}&limit=20");
    let page = get(&app, &by("key", "user-1")).await.body;
    assert_eq!(seqs(&page), ["9", "5", "1"], "newest first");
    assert!(
        page.contains("3 matches for key <code>user-1</code> in #1–#12 (12 messages searched)"),
        "{page}"
    );
    assert_eq!(seqs(&get(&app, &by("idempotency", "mail-7")).await.body), ["7"]);
    assert_eq!(seqs(&get(&app, &by("header", "x-tenant%3Dacme")).await.body), ["12", "9", "6", "3"]);
    assert_eq!(seqs(&get(&app, &by("header", "x-tenant")).await.body).len(), 12);
    assert_eq!(seqs(&get(&app, &by("payload", "mail%207%20for")).await.body), ["7"]);
    assert!(seqs(&get(&app, &by("key", "nobody")).await.body).is_empty());
    // A limit reached: the next request goes on past the last match, and finds the rest.
    let page = get(&app, "/queues/emails?field=header&q=x-tenant%3Dacme&limit=2").await.body;
    assert_eq!(seqs(&page), ["12", "9"]);
    let more = href(&page, "search-more").unwrap();
    assert!(more.contains("after=9"), "{more}");
    let page = get(&app, &format!("/queues/emails{more}")).await.body;
    assert_eq!(seqs(&page), ["6", "3"]);
    // Oldest first.
    let page = get(&app, "/queues/emails?order=oldest&field=key&q=user-2&limit=20").await.body;
    assert_eq!(seqs(&page), ["2", "6", "10"]);
    // The keys are shown, escaped.
    assert!(page.contains("<code>user-2</code>") && page.contains("idem <code>mail-2</code>"), "{page}");
    let a = get(&app, "/queues/emails?field=colour&q=red").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn each_message_shows_where_it_stands_in_each_work_group() {
    let f = fixture().await;
    let app = writable(&f.broker);
    // jobs 1..=6 in `workers`: 1 and 2 dead-lettered, 3 waiting for a retry, 4 leased, 5 and
    // 6 not finished (never claimed).
    let page = get(&app, "/queues/jobs?order=oldest").await.body;
    let rows = table(&page, "messages");
    let states: Vec<_> =
        rows.iter().map(|r| r["state-in-workers"].split_whitespace().next().unwrap().to_owned()).collect();
    assert_eq!(states, ["dead", "dead", "retrying", "leased", "open", "open"]);
    // Cross-checked with the library.
    let pending = f.broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(pending.iter().map(|p| p.seq).collect::<Vec<_>>(), [3, 4]);
    let dead = f.broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.seq.unwrap()).collect::<Vec<_>>(), [1, 2]);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn per_job_actions_retry_now_delete_and_dead_letter_after_a_confirmation() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    // The group page offers retry now only for the job waiting for a retry, none for the
    // leased one.
    let page = get_with(&app, "/groups/jobs/workers", &cookie).await;
    assert!(page.contains(r#"id="retry-3""#) && !page.contains(r#"id="retry-4""#), "{page}");
    assert!(!page.contains(r#"id="delete-4""#), "no action on a leased job");

    // Retry now: due at once.
    let a = post(&app, "/groups/jobs/workers/jobs/3/retry", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let p = f.broker.pending("jobs", "workers").await.unwrap();
    assert!(p.iter().find(|c| c.seq == 3).unwrap().retry_at.unwrap() <= f.clock.wall_time());

    // Delete 5: asks first, then the group moves past it.
    let a = post(&app, "/groups/jobs/workers/jobs/5/delete", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("Delete job <b>#5</b>"), "{}", a.body);
    let lag = group(&f.broker.stats().await.unwrap(), "jobs", "workers").lag;
    let a = post(&app, "/groups/jobs/workers/jobs/5/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(group(&f.broker.stats().await.unwrap(), "jobs", "workers").lag, lag - 1);

    // Dead-letter 6 with a reason typed on the confirmation page.
    let a = post(&app, "/groups/jobs/workers/jobs/6/dead-letter", &format!("csrf={csrf}"), &h).await;
    assert!(a.body.contains(r#"name="reason""#), "{}", a.body);
    let form = format!("csrf={csrf}&confirm=yes&reason=bounced%20%3Cadmin%3E");
    let a = post(&app, "/groups/jobs/workers/jobs/6/dead-letter", &form, &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let dead = f.broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    let d = dead.iter().find(|d| d.seq == Some(6)).unwrap();
    assert_eq!(d.reason, "bounced <admin>");

    // The leased job is refused (409), untouched; the API answers JSON.
    let a = post(
        &app,
        "/api/groups/jobs/workers/jobs/4/delete",
        "",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    assert!(f.broker.pending("jobs", "workers").await.unwrap().iter().any(|c| c.seq == 4));
    // Anonymous: refused, nothing moved.
    let a = post(&app, "/groups/jobs/workers/jobs/3/delete", "confirm=yes", &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(f.broker.pending("jobs", "workers").await.unwrap().iter().any(|c| c.seq == 3));
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

async fn get_with(app: &Router, path: &str, cookie: &str) -> String {
    let req =
        axum::http::Request::get(path).header("cookie", cookie).body(axum::body::Body::empty()).unwrap();
    web_client::call(app, req).await.body
}

#[tokio::test]
async fn the_group_page_shows_settings_claims_and_last_errors() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let page = get(&app, "/groups/jobs/workers").await;
    assert_eq!(page.status, StatusCode::OK);
    let settings = table(&page.body, "settings");
    let value = |k: &str| settings.iter().find(|r| r["setting"] == k).unwrap()["value"].clone();
    assert_eq!(value("Lease"), "30.0s");
    assert!(value("Retries").starts_with("up to 3 attempts"), "{}", value("Retries"));
    assert_eq!(value("Dead-letter queue"), "jobs.dlq");
    assert_eq!(value("Keeps outcomes"), "1d00h");
    let claims = table(&page.body, "claims");
    let pending = f.broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(claims.len(), pending.len());
    assert_eq!(claims[0]["holder"], "-");
    assert_eq!(claims[1]["holder"], "host-a/1");
    let errors = table(&page.body, "last-errors");
    assert_eq!((errors[0]["error"].as_str(), errors[0]["messages"].as_str()), ("downstream 503", "1"));
    assert!(page.body.contains(r#"<span class="badge bad">2 dead</span>"#), "the DLQ's letters flagged");
    // An ordered group has a page too; an unknown one is a 404.
    assert_eq!(get(&app, "/groups/orders/billing").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/groups/orders/nobody").await.status, StatusCode::NOT_FOUND);
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn delayed_messages_and_schedules_are_listed_and_schedules_can_be_paused_and_deleted() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let orders = f.broker.queue("orders").await.unwrap();
    orders.submit(Message::new("later").key("k1").deliver_after(Duration::from_secs(3600))).await.unwrap();
    f.broker.schedule("nightly", Duration::from_secs(86_400), "orders", "report").await.unwrap();
    let page = get(&app, "/delayed").await.body;
    let delayed = table(&page, "delayed");
    assert_eq!(delayed.len(), 1);
    assert_eq!((delayed[0]["queue"].as_str(), delayed[0]["key"].as_str()), ("orders", "k1"));
    assert!(
        delayed[0]["due"].starts_with("in 59 min") || delayed[0]["due"].starts_with("in 1 h"),
        "{:?}",
        delayed[0]
    );
    let schedules = table(&page, "schedules");
    assert_eq!((schedules[0]["schedule"].as_str(), schedules[0]["queue"].as_str()), ("nightly", "orders"));
    // The overview links the count.
    assert!(get(&app, "/").await.body.contains(r#"<a href="/delayed">1 delayed</a>"#));

    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    let a = post(&app, "/schedules/nightly/pause", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert!(f.broker.schedules().await.unwrap()[0].paused);
    let a = post(&app, "/schedules/nightly/resume", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(!f.broker.schedules().await.unwrap()[0].paused);
    let a = post(&app, "/schedules/nightly/delete", &format!("csrf={csrf}"), &h).await;
    assert!(a.body.contains(r#"id="confirm-text""#));
    assert_eq!(f.broker.schedules().await.unwrap().len(), 1, "asked first");
    let a = post(&app, "/schedules/nightly/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(f.broker.schedules().await.unwrap().is_empty());
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn purge_and_delete_ask_first_and_then_do_exactly_what_they_said() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    // Purge: the question names the messages; nothing happens until confirmed.
    let a = post(&app, "/queues/orders/purge", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        strip_tags(&a.body).contains("Purge queue orders? Its 10 stored messages (#1..=#10"),
        "{}",
        a.body
    );
    assert_eq!(f.broker.peek("orders", None, 100).await.unwrap().len(), 10);
    let a = post(&app, "/queues/orders/purge", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert!(f.broker.peek("orders", None, 100).await.unwrap().is_empty());
    // Delete a group, then a queue.
    let a = post(&app, "/groups/orders/billing/delete", &format!("csrf={csrf}"), &h).await;
    assert!(a.body.contains("Delete group <b>billing</b>"), "{}", a.body);
    let a = post(&app, "/groups/orders/billing/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(!f.broker.stats().await.unwrap().groups.iter().any(|g| g.group == "billing"));
    let a = post(&app, "/queues/orders/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(!f.broker.queue_names().contains(&"orders".to_owned()));
    // Through the API at once; a missing queue is a 404 and creates nothing.
    let bearer = [("authorization", format!("Bearer {TOKEN}"))];
    let bearer: Vec<_> = bearer.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = post(&app, "/api/queues/jobs.dlq/purge", "", &bearer).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&a.body).unwrap()["purged"], 2);
    let a = post(&app, "/api/queues/nothing/delete", "", &bearer).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(!f.broker.queue_names().contains(&"nothing".to_owned()));
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn a_dead_letter_queue_says_how_many_letters_are_left_to_redrive() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let page = get(&app, "/").await.body;
    assert!(page.contains(r#"<a class="badge bad" href="/dlq/jobs.dlq" title="dead letters not yet redriven">2 to redrive</a>"#), "{page}");
    f.broker.dead_letters("jobs.dlq").await.unwrap().redrive(rockq::Redrive::new()).await.unwrap();
    let page = get(&app, "/").await.body;
    // Its length still counts the redriven letters (retention deletes them later).
    assert!(
        page.contains(
            r#"<a class="badge" href="/dlq/jobs.dlq" title="dead letters not yet redriven">0 to redrive</a>"#
        ),
        "{page}"
    );
    let groups = table(&page, "groups");
    let g = groups.iter().find(|r| r["group"] == "workers").unwrap();
    assert_eq!(g["dlq-depth"], "0");
    assert!(!g["status"].contains("dead"), "{g:?}");
    drop(f.held);
    let _ = f.broker.shutdown().await;
}

#[tokio::test]
async fn one_dead_letter_is_redriven_or_deleted_from_its_row() {
    let f = fixture().await;
    let app = writable(&f.broker);
    let (cookie, csrf) = login(&app).await;
    let h = [("cookie", cookie.as_str())];
    let page = get_with(&app, "/dlq/jobs.dlq", &cookie).await;
    assert!(page.contains(r#"id="redrive-letter-2""#) && page.contains(r#"id="delete-letter-1""#), "{page}");
    // Redrive letter 2 alone: it goes back to `jobs`, letter 1 stays.
    let jobs_last = f.broker.peek("jobs", None, 100).await.unwrap().last().unwrap().seq;
    let a = post(&app, "/dlq/jobs.dlq/letters/2/redrive", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(f.broker.peek("jobs", Some(jobs_last + 1), 10).await.unwrap()[0].payload, "job 2");
    let dlq = f.broker.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.list(10).await.unwrap().iter().map(|d| d.dlq_seq).collect::<Vec<_>>(), [1]);
    // Delete letter 1: asks first.
    let a = post(&app, "/dlq/jobs.dlq/letters/1/delete", &format!("csrf={csrf}"), &h).await;
    assert!(a.body.contains("Delete dead letter <b>#1</b>"), "{}", a.body);
    assert_eq!(dlq.len().await.unwrap(), 1);
    let a = post(&app, "/dlq/jobs.dlq/letters/1/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert!(dlq.is_empty().await.unwrap());
    let page = get(&app, "/dlq/jobs.dlq").await.body;
    assert!(page.contains(r#"<b id="dlq-depth">0</b>"#), "{page}");
    // Gone: 404; not a dead-letter queue: 404, nothing created or moved.
    let a = post(&app, "/dlq/jobs.dlq/letters/1/delete", &format!("csrf={csrf}&confirm=yes"), &h).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    let a = post(&app, "/dlq/orders/letters/1/redrive", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    assert_eq!(f.broker.peek("orders", None, 100).await.unwrap().len(), 10);
    let a = post(&app, "/dlq/nothing.dlq/letters/1/redrive", &format!("csrf={csrf}"), &h).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(!f.broker.queue_names().contains(&"nothing.dlq".to_owned()));
    drop(f.held);
    let _ = f.broker.shutdown().await;
}
