//! The web console in a real browser: headless Chromium driven over WebDriver (chromedriver).
//! Runs only with `ROCKQ_BROWSER_TESTS=1` and `CHROMEDRIVER=host:port` (see
//! `scripts/browser-tests.sh`, which installs Chromium and starts chromedriver); otherwise it
//! says it was skipped. It opens every page, compares the rendered numbers with
//! `Broker::stats` and `Broker::pending`, logs in, clicks pause, reset and redrive and checks
//! their effect through the library, and saves a PNG screenshot of each page under
//! `$CARGO_TARGET_TMPDIR/web-screenshots/`.

mod common;
#[path = "common/console.rs"]
mod console;

use std::path::PathBuf;
use std::time::Duration;

use console::{SCRIPT, fixture, group, http};
use rockq::web::Console;
use serde_json::{Value, json};

const TOKEN: &str = "browser-test-token";

/// A WebDriver session on chromedriver.
struct Browser {
    driver: String,
    session: String,
    shots: PathBuf,
}

impl Browser {
    async fn start(driver: String) -> Browser {
        Browser::start_with(driver, &[]).await
    }

    /// A session whose Chromium gets `extra` command-line flags too.
    async fn start_with(driver: String, extra: &[&str]) -> Browser {
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1500,1100",
            "--hide-scrollbars",
        ];
        args.extend_from_slice(extra);
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
                "args": args,
            },
        }}});
        let v = call(&driver, "POST", "/session", Some(caps)).await;
        let session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_owned();
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        Browser { driver, session, shots }
    }

    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        call(&self.driver, method, &format!("/session/{}{path}", self.session), body).await
    }

    async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// Resizes the window (a narrow laptop, a phone).
    async fn resize(&self, width: u32, height: u32) {
        self.cmd("POST", "/window/rect", Some(json!({ "width": width, "height": height }))).await;
    }

    /// Loads `url` and waits until the page is complete.
    async fn open(&self, url: &str) {
        self.goto(url).await;
        self.wait_for("return document.readyState === 'complete'").await;
    }

    /// Clicks `css` and waits for the next page to be loaded at `path`. The current document
    /// is marked first: a page at the same path (a redirect back) is told from the old one.
    async fn click_to(&self, css: &str, path: &str) {
        self.js("window.rockqOldPage = true; return true").await;
        self.click(css).await;
        self.wait_for(&format!(
            "return !window.rockqOldPage && location.pathname === '{path}' && document.readyState === 'complete'"
        ))
        .await;
    }

    async fn js(&self, script: &str) -> Value {
        self.cmd("POST", "/execute/sync", Some(json!({ "script": script, "args": [] }))).await
    }

    async fn element(&self, css: &str) -> String {
        let v = self.cmd("POST", "/element", Some(json!({ "using": "css selector", "value": css }))).await;
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.cmd("POST", &format!("/element/{e}/click"), Some(json!({}))).await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.cmd("POST", &format!("/element/{e}/value"), Some(json!({ "text": text }))).await;
    }

    /// Waits (bounded by the hang guard) until `script` returns true in the page.
    async fn wait_for(&self, script: &str) {
        let until = tokio::time::Instant::now() + common::HANG_GUARD;
        while self.js(script).await != Value::Bool(true) {
            assert!(tokio::time::Instant::now() < until, "hung waiting for {script}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.cmd("GET", "/screenshot", None).await;
        let png = base64(v.as_str().expect("base64 screenshot"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The rows of table `id` as `{data-col: text}` objects, as the browser renders them.
    async fn table(&self, id: &str) -> Vec<Value> {
        let script = format!(
            "return Array.from(document.querySelectorAll('#{id} tbody tr')).filter(tr => tr.querySelector('td[data-col]')).map(tr => Object.fromEntries(Array.from(tr.cells).map(td => [td.dataset.col, td.textContent.trim()])));"
        );
        self.js(&script).await.as_array().cloned().unwrap_or_default()
    }

    async fn quit(&self) {
        call(&self.driver, "DELETE", &format!("/session/{}", self.session), None).await;
    }
}

/// One WebDriver command: its `value`, failing the test on a WebDriver error.
async fn call(driver: &str, method: &str, path: &str, body: Option<Value>) -> Value {
    let body = body.map(|b| b.to_string());
    let (status, text) = http(driver, method, path, body.as_deref()).await;
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {status} {text}: {e}"));
    assert_eq!(status, 200, "{method} {path}: {v}");
    v["value"].clone()
}

fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("bad base64 {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|&c| u32::from(val(c))).collect();
        let n = v.iter().enumerate().fold(0u32, |acc, (i, x)| acc | (x << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn num(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_headless_browser() {
    if std::env::var("ROCKQ_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set ROCKQ_BROWSER_TESTS=1 and CHROMEDRIVER=host:port (scripts/browser-tests.sh does)"
        );
        return;
    }
    let driver = std::env::var("CHROMEDRIVER").expect("CHROMEDRIVER=host:port of a running chromedriver");
    let started = std::time::Instant::now();
    let f = fixture().await;
    let (app, sampler) = Console::new(f.broker.clone())
        .token(TOKEN)
        .public_reads(true)
        .manual_sampling()
        .refresh_every(0)
        .build();
    // Traffic between samples, so the charts have lines (the pauses shape the picture only;
    // nothing below depends on their length).
    let orders = f.broker.queue("orders").await.unwrap();
    for i in 0..12u64 {
        orders.send_batch((0..(i % 5 + 1) * 3).map(|n| format!("tick {i}/{n}"))).await.unwrap();
        sampler.sample_now().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let emails = f.broker.queue("emails").await.unwrap();
    for i in 1..=5u32 {
        let m = rockq::Message::new(format!("mail {i}"))
            .key(format!("user-{}", i % 4))
            .header("x-tenant", "acme");
        emails.send(m).await.unwrap();
    }
    orders.submit(rockq::Message::new("in an hour").deliver_after(Duration::from_secs(3600))).await.unwrap();
    f.broker
        .schedule("nightly-report", Duration::from_secs(86_400), "orders", "build the report")
        .await
        .unwrap();
    common::flow_in_progress(&f.broker).await;
    sampler.sample_now().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let base = format!("http://{addr}");
    let b = Browser::start(driver).await;
    // The browser is closed whatever happens below, then a failure is reported.
    let run = std::panic::AssertUnwindSafe(Box::pin(pages(&b, &base, &f)));
    let outcome = futures::FutureExt::catch_unwind(run).await;
    b.quit().await;
    server.abort();
    let overview = match outcome {
        Ok(p) => p,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    if let Ok(dest) = std::env::var("ROCKQ_SCREENSHOT_OVERVIEW") {
        std::fs::copy(&overview, dest).unwrap();
    }
    eprintln!(
        "browser test passed in {:.1}s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        b.shots.display()
    );
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits races RocksDB's own
    // teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}

/// Every page and action; returns the overview screenshot's path.
async fn pages(b: &Browser, base: &str, f: &console::Fixture) -> PathBuf {
    // Overview: every number as Broker::stats has it.
    b.goto(&format!("{base}/")).await;
    let stats = f.broker.stats().await.unwrap();
    let queues = b.table("queues").await;
    assert_eq!(queues.len(), stats.queues.len());
    for (row, q) in queues.iter().zip(&stats.queues) {
        assert!(num(&row["queue"]).starts_with(&q.name));
        assert_eq!(
            (num(&row["len"]), num(&row["first"]), num(&row["last"])),
            (q.len.to_string(), q.first_seq.to_string(), q.last_seq.to_string())
        );
    }
    let groups = b.table("groups").await;
    assert_eq!(groups.len(), stats.groups.len());
    for (row, g) in groups.iter().zip(&stats.groups) {
        assert_eq!(num(&row["group"]), g.group);
        assert_eq!(num(&row["committed"]), g.committed.to_string());
        assert_eq!(num(&row["lag"]), g.lag.to_string());
        assert_eq!(num(&row["in-flight"]), g.in_flight.to_string());
        assert_eq!(num(&row["waiting-retry"]), g.waiting_retry.to_string());
        assert_eq!(num(&row["dlq-depth"]), g.dlq_depth.to_string());
    }
    assert_eq!(b.js("return document.querySelectorAll('svg.chart polyline').length > 0").await, true);
    b.screenshot("overview-anonymous").await;

    // Log in through the form.
    b.goto(&format!("{base}/login")).await;
    b.type_into("#token", TOKEN).await;
    b.click("#login").await;
    b.wait_for("return document.getElementById('mode') && document.getElementById('mode').textContent === 'operator'").await;
    let overview = b.screenshot("overview").await;

    // Pause billing by clicking its button; the library sees it paused.
    b.click_to("#pause-orders-billing", "/queues/orders").await;
    assert!(group(&f.broker.stats().await.unwrap(), "orders", "billing").paused);
    let row = b.table("groups").await.into_iter().find(|r| num(&r["group"]) == "billing").unwrap();
    assert_eq!(num(&row["paused"]), "paused");

    b.screenshot("queue-orders").await;
    // The `<script>` payload (the oldest message) is text on the page, and no script element
    // exists.
    b.open(&format!("{base}/queues/orders?order=oldest")).await;
    let payloads = b
        .js("return Array.from(document.querySelectorAll('#messages pre.payload')).map(p => p.textContent)")
        .await;
    assert_eq!(payloads[0], SCRIPT);
    assert_eq!(b.js("return document.querySelectorAll('script').length").await, 0);

    // Reset billing to sequence 2: a confirmation page first, then the offset moves.
    b.js("document.querySelector('form.reset select[name=target]').value = 'seq'; return true").await;
    b.type_into("form.reset input[name=value]", "2").await;
    b.click("#reset-orders-billing").await;
    b.wait_for("return !!document.getElementById('confirm-text')").await;
    b.screenshot("reset-confirm").await;
    assert_eq!(
        group(&f.broker.stats().await.unwrap(), "orders", "billing").committed,
        3,
        "moved before confirming"
    );
    b.click_to("#confirm", "/queues/orders").await;
    assert_eq!(group(&f.broker.stats().await.unwrap(), "orders", "billing").committed, 1);
    b.click_to("#resume-orders-billing", "/queues/orders").await;
    assert!(!group(&f.broker.stats().await.unwrap(), "orders", "billing").paused);

    // Work queue: each message's state in the group, newest first.
    b.open(&format!("{base}/queues/jobs")).await;
    let states = b
        .js("return Array.from(document.querySelectorAll('#messages td[data-col=\"state-in-workers\"] .state')).map(s => s.textContent)")
        .await;
    assert_eq!(states, json!(["open", "open", "leased", "retrying", "dead", "dead"]));
    b.screenshot("queue-jobs").await;

    // The group page: claims as Broker::pending has them.
    b.open(&format!("{base}/groups/jobs/workers")).await;
    let rows = b.table("claims").await;
    let pending = f.broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(rows.len(), pending.len());
    for (row, c) in rows.iter().zip(&pending) {
        let state = if c.state == rockq::PendingState::Waiting { "retrying" } else { c.state.as_str() };
        assert_eq!(
            (num(&row["seq"]), num(&row["state"]), num(&row["attempt"])),
            (c.seq.to_string(), state.to_owned(), c.attempt.to_string())
        );
    }
    b.screenshot("group-workers").await;

    // Find a job: typed into the form, shown as Broker::job tells it.
    let leased = pending.iter().find(|c| c.state == rockq::PendingState::Leased).expect("a leased claim");
    b.type_into("form.find-job input[name=job]", &leased.seq.to_string()).await;
    b.click_to("#find-job", "/groups/jobs/workers").await;
    let job = f.broker.job("jobs", "workers", leased.seq).await.unwrap();
    let rows = b.table("job").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (num(&rows[0]["seq"]), num(&rows[0]["state"]), num(&rows[0]["holder"])),
        (
            leased.seq.to_string(),
            job.state.as_str().to_owned(),
            job.holder.clone().unwrap_or_else(|| "-".into())
        )
    );
    // Its progress report, shown as text (the fixture's is markup, escaped by the page).
    let progress = job.progress.as_deref().map_or("-".into(), |p| String::from_utf8_lossy(p).into_owned());
    assert_eq!(rows[0]["progress"], progress);
    b.screenshot("group-find-job").await;

    // Retry now, by its button: due at once.
    b.click_to("#retry-3", "/groups/jobs/workers").await;
    let p = f.broker.pending("jobs", "workers").await.unwrap();
    assert!(p.iter().find(|c| c.seq == 3).unwrap().retry_at.unwrap() <= f.clock.wall_time());

    // Dead-letter job 6 from the message list, with a reason typed on the confirmation page.
    b.open(&format!("{base}/queues/jobs")).await;
    b.click("#dead-letter-6").await;
    b.wait_for("return !!document.getElementById('reason')").await;
    b.js("document.getElementById('reason').value = ''; return true").await;
    b.type_into("#reason", "parked by ops").await;
    b.screenshot("dead-letter-confirm").await;
    b.click_to("#confirm", "/groups/jobs/workers").await;
    let letters = f.broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap();
    assert!(letters.iter().any(|d| d.seq == Some(6) && d.reason == "parked by ops"), "{letters:?}");

    // Dead letters: listed with their reasons; one deleted from its row, after a confirmation.
    b.open(&format!("{base}/dlq/jobs.dlq")).await;
    let letters = b.table("dead-letters").await;
    assert_eq!(letters.len(), 3);
    assert_eq!(num(&letters[0]["reason"]), "bad input: <missing field>");
    b.screenshot("dead-letters").await;
    let dlq_seq_of_6 = f.broker.dead_letters("jobs.dlq").await.unwrap().list(10).await.unwrap()[2].dlq_seq;
    b.click("#delete-letter-2").await;
    b.wait_for("return !!document.getElementById('confirm-text')").await;
    b.click_to("#confirm", "/dlq/jobs.dlq").await;
    let left: Vec<_> = f
        .broker
        .dead_letters("jobs.dlq")
        .await
        .unwrap()
        .list(10)
        .await
        .unwrap()
        .iter()
        .map(|d| d.dlq_seq)
        .collect();
    assert_eq!(left, [1, dlq_seq_of_6]);
    assert_eq!(b.table("dead-letters").await.len(), 2);
    // The rest redriven with a click, after a confirmation.
    let jobs_last = f.broker.peek("jobs", None, 100).await.unwrap().last().unwrap().seq;
    b.click("#redrive").await;
    b.wait_for("return !!document.getElementById('confirm-text')").await;
    assert_eq!(f.broker.dead_letters("jobs.dlq").await.unwrap().len().await.unwrap(), 2, "asked first");
    b.screenshot("redrive-confirm").await;
    b.click("#confirm").await;
    b.wait_for("return document.getElementById('job-state') && document.getElementById('job-state').textContent === 'done'").await;
    assert_eq!(b.js("return document.getElementById('job-moved').textContent").await, "2");
    b.screenshot("redrive-done").await;
    assert!(f.broker.dead_letters("jobs.dlq").await.unwrap().is_empty().await.unwrap());
    let moved: Vec<_> = f
        .broker
        .peek("jobs", Some(jobs_last + 1), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.payload)
        .collect();
    assert_eq!(moved, ["job 1", "job 6"]);

    // Paging: newest first, then older by its link; a jump; a search by key.
    b.open(&format!("{base}/queues/orders?limit=5")).await;
    let seqs = |rows: Vec<Value>| rows.iter().map(|r| num(&r["seq"])).collect::<Vec<_>>();
    let last = f.broker.stats().await.unwrap().queues.iter().find(|q| q.name == "orders").unwrap().last_seq;
    assert_eq!(seqs(b.table("messages").await)[0], last.to_string());
    b.screenshot("messages-newest").await;
    b.click("#page-older").await;
    b.wait_for(&format!(
        "return document.getElementById('page-range').textContent.startsWith('#{}')",
        last - 9
    ))
    .await;
    b.type_into("#jump-seq", "2").await;
    b.click("#jump").await;
    b.wait_for("return document.querySelector('#messages td[data-col=seq]').textContent === '2'").await;
    b.open(&format!("{base}/queues/emails")).await;
    b.js("document.getElementById('search-field').value = 'key'; return true").await;
    b.type_into("#search-q", "user-1").await;
    b.click("#search").await;
    b.wait_for("return !!document.getElementById('search-note')").await;
    assert_eq!(seqs(b.table("messages").await), ["5", "1"]);
    b.screenshot("messages-search").await;

    // Delayed messages and schedules.
    b.open(&format!("{base}/delayed")).await;
    assert_eq!(b.table("delayed").await.len(), 1);
    assert_eq!(num(&b.table("schedules").await[0]["schedule"]), "nightly-report");
    b.screenshot("delayed-and-schedules").await;

    // Flows: listed, reached from the list; the flow's steps drawn as a graph coloured by
    // state (two resizes done, one dead, the album blocked behind it, the report queued).
    let id = f.broker.flows(0, 1).await.unwrap()[0];
    b.open(&format!("{base}/flows")).await;
    let rows = b.table("flows").await;
    assert_eq!((rows.len(), num(&rows[0]["flow"])), (1, id.to_string()));
    b.click_to(&format!("#flows a[href$='/flows/{id}']"), &format!("/flows/{id}")).await;
    let status = f.broker.flow_status(id).await.unwrap();
    let steps = b.table("steps").await;
    assert_eq!(steps.len(), status.steps.len());
    for (row, s) in steps.iter().zip(&status.steps) {
        assert_eq!(num(&row["state"]), s.state.as_str());
    }
    let drawn = b
        .js("return Array.from(document.querySelectorAll('#flow-graph g.node')).map(g => g.dataset.state)")
        .await;
    assert_eq!(drawn, json!(["succeeded", "succeeded", "failed", "blocked", "queued"]));
    // The stylesheet reaches the SVG: a failed step is drawn red, a done one green.
    let fill = |state: &str| {
        format!("return getComputedStyle(document.querySelector('#flow-graph g.node.{state} rect')).fill")
    };
    assert_eq!(b.js(&fill("failed")).await, "rgb(255, 241, 243)");
    assert_eq!(b.js(&fill("succeeded")).await, "rgb(236, 253, 243)");
    assert_eq!(b.js("return document.querySelectorAll('#flow-graph path.edge').length").await, 6);
    b.screenshot("flow").await;

    // Trim: a confirmation, then a report of what it deleted.
    b.open(&format!("{base}/")).await;
    b.click("#trim").await;
    b.wait_for("return !!document.getElementById('confirm-text')").await;
    b.screenshot("trim-confirm").await;
    b.click("#confirm").await;
    b.wait_for("return !!document.getElementById('trim-report')").await;
    let trimmed = b.table("trimmed").await;
    assert!(trimmed.iter().any(|r| num(&r["queue"]) == "orders"), "{trimmed:?}");
    b.screenshot("trim-report").await;

    // Purge asks first and names what goes; cancelling keeps it.
    b.open(&format!("{base}/queues/emails")).await;
    b.click("#purge-queue").await;
    b.wait_for("return !!document.getElementById('confirm-text')").await;
    assert_eq!(
        b.js("return document.getElementById('confirm-text').textContent.includes('Its 5 stored messages')")
            .await,
        true
    );
    b.screenshot("purge-confirm").await;
    b.click_to("#cancel", "/queues/emails").await;
    assert_eq!(f.broker.peek("emails", None, 10).await.unwrap().len(), 5);

    // Narrow windows: nothing wider than the window but the tables, which scroll inside it.
    for (w, h, name) in [(900, 1000, "overview-900px"), (390, 844, "overview-phone")] {
        b.resize(w, h).await;
        b.open(&format!("{base}/")).await;
        let fits = b.js("return document.documentElement.scrollWidth <= window.innerWidth + 1").await;
        assert_eq!(fits, true, "the page is wider than {w} px");
        b.screenshot(name).await;
    }
    b.open(&format!("{base}/queues/jobs")).await;
    b.screenshot("queue-jobs-phone").await;
    b.resize(1500, 1100).await;

    // Metrics and JSON render in the browser too.
    b.goto(&format!("{base}/metrics")).await;
    assert_eq!(b.js("return document.body.textContent.includes('rockq_group_lag{')").await, true);
    overview
}

/// DNS rebinding, as a browser meets it: Chromium resolves `evil.test` to 127.0.0.1 (as an
/// attacker's DNS would after the victim loaded their page), so a request to
/// `http://evil.test:PORT/` reaches the loopback console with `Host: evil.test:PORT`. The
/// console answers 421 and shows nothing, even with public reads; the same console by its own
/// address answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_foreign_host_name_reads_nothing_in_a_real_browser() {
    if std::env::var("ROCKQ_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set ROCKQ_BROWSER_TESTS=1 and CHROMEDRIVER=host:port (scripts/browser-tests.sh does)"
        );
        return;
    }
    let driver = std::env::var("CHROMEDRIVER").expect("CHROMEDRIVER=host:port of a running chromedriver");
    let f = fixture().await;
    let app = Console::new(f.broker.clone()).token(TOKEN).public_reads(true).manual_sampling().router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let b = Browser::start_with(driver, &["--host-resolver-rules=MAP evil.test 127.0.0.1"]).await;
    let run = async {
        let port = addr.port();
        b.goto(&format!("http://evil.test:{port}/api/dlq/jobs.dlq")).await;
        let text = b.js("return document.body.textContent").await;
        let text = text.as_str().unwrap_or_default().to_owned();
        assert!(text.contains("does not answer to host \"evil.test\""), "{text}");
        assert!(!text.contains("job 1") && !text.contains("missing field"), "leaked: {text}");
        b.screenshot("rebinding-refused").await;
        // The page a rebinding attacker would script: refused too.
        b.goto(&format!("http://evil.test:{port}/queues/jobs")).await;
        let text = b.js("return document.body.textContent").await;
        assert!(!text.as_str().unwrap_or_default().contains("job 1"));
        // The console's own address answers (the refusal is the Host check, not the network).
        b.goto(&format!("http://127.0.0.1:{port}/api/dlq/jobs.dlq")).await;
        let text = b.js("return document.body.textContent").await;
        assert!(text.as_str().unwrap_or_default().contains("missing field"), "{text}");
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(Box::pin(run))).await;
    b.quit().await;
    server.abort();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    drop(f.held);
    // Closed before the test ends: a broker dropped as the binary exits races RocksDB's own
    // teardown ("pthread lock: Invalid argument").
    let _ = f.broker.shutdown().await;
}
