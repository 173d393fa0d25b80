//! The `rockq` CLI on an etcd namespace (`--etcd ENDPOINTS --namespace NS`), run as a separate
//! process beside a service — a library broker connected to the same namespace — against a
//! real single-member etcd started on loopback ports chosen at run time and stopped by its pid.
//! On etcd nothing needs the namespace to itself: commands that write connect as one more
//! instance, read-only ones through `Inspector::connect_etcd`, which writes nothing.

mod common;
#[cfg(feature = "web")]
#[path = "common/console.rs"]
mod console;
#[path = "common/etcd.rs"]
mod etcd;

use std::time::Duration;

use common::{HANG_GUARD, next_job, take};
use rockq::{Broker, EtcdOptions, Message};
use serde_json::Value;

/// The namespace a command operates.
struct Ns<'a> {
    cluster: &'a etcd::Cluster,
    name: &'a str,
}

fn rockq(ns: &Ns<'_>) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_rockq"));
    cmd.arg("--etcd")
        .arg(ns.cluster.endpoints().join(","))
        .arg("--namespace")
        .arg(ns.name)
        .env_remove("ROCKQ_DB")
        .env_remove("ROCKQ_ETCD")
        .env_remove("ROCKQ_NAMESPACE")
        .timeout(HANG_GUARD);
    cmd
}

fn json(ns: &Ns<'_>, args: &[&str]) -> Value {
    let out = rockq(ns).arg("--json").args(args).assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&out)))
}

fn text(ns: &Ns<'_>, args: &[&str]) -> String {
    String::from_utf8(rockq(ns).args(args).assert().success().get_output().stdout.clone()).unwrap()
}

/// Runs a command expected to fail with `code`; returns its standard error.
fn fails(ns: &Ns<'_>, args: &[&str], code: i32) -> String {
    let out = rockq(ns).args(args).assert().code(code).get_output().clone();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn find<'a>(list: &'a Value, field: &str, value: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v[field] == value)
        .unwrap_or_else(|| panic!("no {value} in {list}"))
}

/// The cluster's revision: it moves with every write, and only then.
async fn revision(cluster: &etcd::Cluster) -> i64 {
    let mut client = cluster.client().await;
    let opts = etcd_client::GetOptions::new().with_count_only();
    client.get("revision-probe", Some(opts)).await.unwrap().header().unwrap().revision()
}

/// The service: no background retention pass, so that only the commands change the namespace.
async fn service(cluster: &etcd::Cluster, ns: &str) -> Broker {
    let options = rockq::Options::new().retention_interval(Duration::ZERO);
    let opts = EtcdOptions::new().options(options).owner_ttl(Duration::from_secs(2));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

/// Five orders (billing committed 2), three jobs (one dead-lettered, one held by `cli-test`),
/// a delayed reminder and a recurring schedule.
async fn populate(broker: &Broker) -> (rockq::WorkSubscription, rockq::Job) {
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch(["o1", "o2", "o3", "o4", "o5"]).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 2).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2", "j3"]).await.unwrap();
    let mut js = jobs
        .work_group("workers")
        .unwrap()
        .consumer_name("cli-test")
        .lease(Duration::from_secs(3600))
        .read_batch(1)
        .max_in_flight(1)
        .subscribe()
        .await
        .unwrap();
    next_job(&mut js).await.dead_letter_durable("malformed").await.unwrap();
    let held = next_job(&mut js).await;
    let reminders = broker.queue("reminders").await.unwrap();
    let renew = Message::new("renew plan").key("cust-7").deliver_after(Duration::from_secs(3600));
    reminders.submit(renew).await.unwrap();
    broker.schedule("hourly", Duration::from_secs(3600), "ticks", "tick").await.unwrap();
    (js, held)
}

/// Every read-only command answers from the namespace while the service runs, and none of them
/// writes anything (the cluster's revision does not move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_read_the_namespace_beside_the_service_and_write_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let ns = Ns { cluster: &cluster, name: "shop" };
    let broker = service(&cluster, "shop").await;
    let (js, held) = populate(&broker).await;

    let stats = json(&ns, &["stats"]);
    let orders = find(&stats["queues"], "name", "orders");
    assert_eq!(
        (orders["first_seq"].as_u64(), orders["last_seq"].as_u64(), orders["len"].as_u64()),
        (Some(1), Some(5), Some(5))
    );
    let billing = find(&stats["groups"], "group", "billing");
    assert_eq!((billing["committed"].as_u64(), billing["lag"].as_u64()), (Some(2), Some(3)));
    let workers = find(&stats["groups"], "group", "workers");
    assert_eq!(workers["in_flight"].as_u64(), Some(1), "{workers}");
    assert_eq!(
        (workers["dead_letter_queue"].as_str(), workers["dlq_depth"].as_u64()),
        (Some("jobs.dlq"), Some(1))
    );
    let table = text(&ns, &["stats"]);
    assert!(table.contains("billing") && table.contains("reminders"), "{table}");
    assert!(!table.contains("database:"), "a namespace has no size of its own: {table}");
    assert_eq!(json(&ns, &["groups", "--queue", "jobs"])["groups"].as_array().unwrap().len(), 1);

    let page = json(&ns, &["peek", "orders", "--from", "2", "--limit", "2"]);
    let seqs: Vec<u64> = page.as_array().unwrap().iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![2, 3]);
    assert_eq!(page[0]["payload"]["text"], "o2");

    let pending = json(&ns, &["pending", "jobs", "workers"]);
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");
    assert_eq!(
        (pending[0]["seq"].as_u64(), pending[0]["holder"].as_str()),
        (Some(held.seq()), Some("cli-test"))
    );
    let job = json(&ns, &["job", "jobs", "workers", &held.seq().to_string()]);
    assert_eq!((job["state"].as_str(), job["holder"].as_str()), (Some("leased"), Some("cli-test")), "{job}");

    let letters = json(&ns, &["dlq", "list", "jobs.dlq"]);
    assert_eq!(letters.as_array().unwrap().len(), 1);
    assert_eq!(
        (letters[0]["reason"].as_str(), letters[0]["payload"]["text"].as_str()),
        (Some("malformed"), Some("j1"))
    );
    assert!(text(&ns, &["dlq", "peek", "jobs.dlq"]).contains("malformed"));

    let delayed = json(&ns, &["scheduled"]);
    assert_eq!(delayed.as_array().unwrap().len(), 1, "{delayed}");
    assert_eq!(
        (delayed[0]["queue"].as_str(), delayed[0]["key"].as_str()),
        (Some("reminders"), Some("cust-7"))
    );
    let schedules = json(&ns, &["schedules"]);
    assert_eq!(find(&schedules, "name", "hourly")["queue"], "ticks");

    // Flows, as `Broker::flow_status` has them.
    let flow = common::flow_in_progress(&broker).await;
    let expected = broker.flow_status(flow).await.unwrap();
    let list = json(&ns, &["flow"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!((list[0]["id"].as_u64(), list[0]["state"].as_str()), (Some(flow), Some("running")));
    let one = json(&ns, &["flow", &flow.to_string()]);
    let states: Vec<&str> =
        one["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap()).collect();
    let want: Vec<&str> = expected.steps.iter().map(|s| s.state.as_str()).collect();
    assert_eq!(states, want);

    // What an inspection cannot find is an error, not something created.
    let absent = fails(&ns, &["dlq", "list", "nothing.dlq"], 1);
    assert!(absent.contains("nothing.dlq"), "{absent}");

    // With the service gone quiet, not one read-only command moves the revision.
    drop((js, held));
    broker.shutdown().await.unwrap();
    let before = revision(&cluster).await;
    for args in [
        &["stats"][..],
        &["groups"],
        &["peek", "orders"],
        &["scheduled"],
        &["schedules"],
        &["pending", "jobs", "workers"],
        &["job", "jobs", "workers", "2"],
        &["dlq", "list", "jobs.dlq"],
        &["dlq", "peek", "jobs.dlq"],
        &["flow"],
        &["flow", &flow.to_string()],
    ] {
        rockq(&ns).args(args).assert().success();
    }
    assert_eq!(revision(&cluster).await, before, "a read-only command wrote to etcd");
}

/// Commands that write connect beside the running service, which sees what they did; what etcd
/// does not carry out is refused with the engine's error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_write_work_beside_the_running_service() {
    let cluster = etcd::Cluster::start(1).await;
    let ns = Ns { cluster: &cluster, name: "shop" };
    let broker = service(&cluster, "shop").await;
    let (js, held) = populate(&broker).await;
    let billing = broker.queue("orders").await.unwrap().group("billing").unwrap();

    assert_eq!(json(&ns, &["group", "pause", "orders", "billing"])["paused"], true);
    assert_eq!(find(&json(&ns, &["stats"])["groups"], "group", "billing")["paused"], true);
    // The service learns it through its watch.
    eventually(|| billing.is_paused()).await;
    assert_eq!(json(&ns, &["group", "resume", "orders", "billing"])["paused"], false);
    eventually(|| !billing.is_paused()).await;

    assert_eq!(
        json(&ns, &["group", "reset", "orders", "billing", "--to-seq", "4"])["next_seq"].as_u64(),
        Some(4)
    );
    assert_eq!(find(&json(&ns, &["stats"])["groups"], "group", "billing")["committed"].as_u64(), Some(3));

    assert_eq!(json(&ns, &["dlq", "redrive", "jobs.dlq"])["moved"].as_u64(), Some(1));
    let jobs = broker.get_queue("jobs").unwrap();
    eventually(|| jobs.last_seq() == 4).await;

    assert_eq!(json(&ns, &["purge", "orders", "--yes"])["purged"].as_u64(), Some(5));
    let orders = find(&json(&ns, &["stats"])["queues"], "name", "orders").clone();
    assert_eq!((orders["first_seq"].as_u64(), orders["len"].as_u64()), (Some(6), Some(0)), "{orders}");
    // Destructive commands still ask first.
    let unconfirmed = fails(&ns, &["purge", "jobs"], 2);
    assert!(unconfirmed.contains("--yes"), "{unconfirmed}");
    json(&ns, &["trim"]);

    // A group deleted from the command line ends in the service too.
    let mut live = billing.subscribe().await.unwrap();
    assert_eq!(json(&ns, &["delete-group", "orders", "billing", "--yes"])["deleted"], true);
    let ended = tokio::time::timeout(HANG_GUARD, futures::StreamExt::next(&mut live)).await.unwrap();
    assert!(matches!(ended, Some(Err(rockq::Error::GroupDeleted { .. }))), "{ended:?}");
    drop(live);
    let groups = json(&ns, &["groups"]);
    assert!(groups["groups"].as_array().unwrap().iter().all(|g| g["group"] != "billing"), "{groups}");
    let missing = fails(&ns, &["delete-group", "orders", "billing", "--yes"], 1);
    assert!(missing.contains("does not exist"), "{missing}");

    // A queue deleted from the command line: gone for the service too (its handle refuses).
    assert_eq!(json(&ns, &["delete-queue", "jobs", "--yes"])["deleted"], true);
    let stats = json(&ns, &["stats"]);
    assert!(stats["queues"].as_array().unwrap().iter().all(|q| q["name"] != "jobs"), "{stats}");
    // Whether or not its watch brought the deletion yet: refused here, or by etcd (the tail is
    // gone) and answered as deleted. Nothing is written.
    let refused = jobs.send("late").await.unwrap_err();
    assert!(matches!(refused, rockq::Error::QueueDeleted { .. }), "{refused}");
    let missing = fails(&ns, &["delete-queue", "jobs", "--yes"], 1);
    assert!(missing.contains("does not exist"), "{missing}");

    drop((js, held));
    broker.shutdown().await.unwrap();
}

/// Polls `done` until it holds (a watch delivers asynchronously); a hang guard, not a timing.
async fn eventually(done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "not seen within the hang guard");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `export` reads a namespace while the service runs; `import` makes another namespace of it
/// (which must be empty); `backup` and `restore` say what to use instead; a missing namespace
/// or a half-given target is a clear error that creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_import_and_what_is_refused_with_a_clear_error() {
    let cluster = etcd::Cluster::start(1).await;
    let (shop, copy) = (Ns { cluster: &cluster, name: "shop" }, Ns { cluster: &cluster, name: "copy" });
    let broker = service(&cluster, "shop").await;
    let (js, held) = populate(&broker).await;
    let out = common::tempdir();
    let file = out.path().join("shop.jsonl");

    let written = json(&shop, &["export", file.to_str().unwrap()]);
    assert_eq!((written["queues"].as_u64(), written["messages"].as_u64()), (Some(4), Some(9)), "{written}");
    assert!(written["from"].as_str().unwrap().contains("etcd namespace shop"), "{written}");
    let report = text(&copy, &["import", file.to_str().unwrap()]);
    assert!(report.contains("4 queues, 9 messages"), "{report}");
    for args in [
        &["peek", "orders"][..],
        &["pending", "jobs", "workers"],
        &["dlq", "list", "jobs.dlq"],
        &["scheduled"],
    ] {
        assert_eq!(json(&copy, args), json(&shop, args), "{args:?}");
    }
    let committed = |ns: &Ns<'_>| {
        let g = json(ns, &["groups"]);
        g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["group"].clone(), g["committed"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(committed(&copy), committed(&shop));
    let again = fails(&copy, &["import", file.to_str().unwrap()], 1);
    assert!(again.contains("not empty"), "{again}");

    let before = revision(&cluster).await;
    let backup = out.path().join("backup");
    let refused = fails(&shop, &["backup", backup.to_str().unwrap()], 2);
    assert!(refused.contains("etcdctl snapshot save"), "{refused}");
    assert!(!backup.exists());
    let refused = fails(&shop, &["restore", out.path().to_str().unwrap()], 2);
    assert!(refused.contains("etcdctl snapshot save"), "{refused}");
    let missing = fails(&Ns { cluster: &cluster, name: "absent" }, &["stats"], 1);
    assert!(missing.contains("no etcd namespace absent"), "{missing}");
    let missing = fails(&Ns { cluster: &cluster, name: "absent" }, &["group", "pause", "q", "g"], 1);
    assert!(missing.contains("no etcd namespace absent"), "{missing}");
    assert_eq!(revision(&cluster).await, before, "nothing was created or changed");

    let bare = |args: &[&str]| {
        let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_rockq"));
        cmd.env_remove("ROCKQ_DB").env_remove("ROCKQ_ETCD").env_remove("ROCKQ_NAMESPACE").args(args);
        let out = cmd.timeout(HANG_GUARD).assert().code(2).get_output().clone();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let endpoints = cluster.endpoints().join(",");
    assert!(bare(&["--etcd", &endpoints, "stats"]).contains("--etcd needs --namespace"));
    assert!(bare(&["--namespace", "shop", "stats"]).contains("give the endpoints with --etcd"));
    assert!(
        bare(&["--etcd", &endpoints, "--namespace", "shop", "--db", "/tmp/x", "stats"]).contains("give one")
    );
    // ROCKQ_NAMESPACE in the environment (set for the etcd commands) leaves --db commands alone.
    let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_rockq"));
    let nodb = out.path().join("no-database");
    cmd.env_remove("ROCKQ_ETCD").env("ROCKQ_NAMESPACE", "shop").args([
        "--db",
        nodb.to_str().unwrap(),
        "stats",
    ]);
    let out_db = cmd.timeout(HANG_GUARD).assert().code(1).get_output().clone();
    assert!(String::from_utf8_lossy(&out_db.stderr).contains("no database at"), "{out_db:?}");

    drop((js, held));
    broker.shutdown().await.unwrap();
}

/// `rockq --etcd … serve`: one more instance of the namespace, full with a token; `--read-only`
/// serves pages and refuses every action.
#[cfg(feature = "web")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_console_over_the_namespace() {
    use tokio::io::AsyncBufReadExt;
    let cluster = etcd::Cluster::start(1).await;
    let broker = service(&cluster, "shop").await;
    let (js, held) = populate(&broker).await;
    const TOKEN: &str = "cli-etcd-token";
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let start = |extra: &'static [&'static str]| {
        let endpoints = cluster.endpoints().join(",");
        async move {
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rockq"))
                .args([
                    "--etcd",
                    &endpoints,
                    "--namespace",
                    "shop",
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--token",
                    TOKEN,
                ])
                .args(extra)
                .env_remove("ROCKQ_DB")
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let first = tokio::time::timeout(HANG_GUARD, lines.next_line()).await.unwrap().unwrap().unwrap();
            let addr = first.split("http://").nth(1).unwrap().split('/').next().unwrap().to_owned();
            (child, first, addr)
        }
    };

    let (mut child, first, addr) = start(&[]).await;
    assert!(first.contains("full"), "{first}");
    let (status, body) = console::http_with(&addr, "GET", "/api/stats", None, &[&bearer]).await;
    assert_eq!(status, 200, "{body}");
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(find(&stats["queues"], "name", "orders")["len"].as_u64(), Some(5));
    let (status, body) = console::http_with(&addr, "GET", "/queues/jobs", None, &[&bearer]).await;
    assert_eq!(status, 200, "{body}");
    // SIGTERM shuts its broker down cleanly.
    let pid = child.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(HANG_GUARD, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");

    let (mut child, first, addr) = start(&["--read-only"]).await;
    assert!(first.contains("read-only"), "{first}");
    let (status, _) = console::http_with(&addr, "GET", "/groups/jobs/workers", None, &[&bearer]).await;
    assert_eq!(status, 200);
    let (status, _) = console::http_with(&addr, "POST", "/api/trim", None, &[&bearer]).await;
    assert_eq!(status, 403, "the token, but read-only");
    child.kill().await.unwrap();

    drop((js, held));
    broker.shutdown().await.unwrap();
}
