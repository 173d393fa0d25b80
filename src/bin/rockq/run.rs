//! Carrying out a command: opening the database the right way and printing the answer.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;

use crate::format::progress;
use rockq::{Broker, Inspector, JobState, ResetTo};
use serde_json::json;

use crate::args::{Cli, Command, Dlq, Group, ResetTarget};
use crate::format::{self, table};
use crate::session::{Failure, Result, Target, exclusive, finish, inspect, say};

pub async fn run(cli: Cli) -> Result<()> {
    let target = Target::of(&cli)?;
    let (json, db) = (cli.json, &target);
    match cli.command {
        Command::Stats => stats(&inspect(db).await?, json, None, Some(db)).await,
        Command::Groups { queue } => stats(&inspect(db).await?, json, queue.as_deref(), None).await,
        Command::Peek { queue, from, limit } => peek(&inspect(db).await?, json, &queue, from, limit).await,
        Command::Scheduled { queue, limit } => {
            scheduled(&inspect(db).await?, json, queue.as_deref(), limit).await
        }
        Command::Schedules => schedules(&inspect(db).await?, json).await,
        Command::Pending { group, queue } => pending(&inspect(db).await?, json, &group, &queue).await,
        Command::Job { queue, group, seq } => job(&inspect(db).await?, json, &queue, &group, seq).await,
        Command::Flow { id: Some(id), limit, .. } => {
            crate::flows::show(&inspect(db).await?, json, id, limit).await
        }
        Command::Flow { id: None, from, limit } => {
            crate::flows::list(&inspect(db).await?, json, from, limit).await
        }
        Command::Dlq(Dlq::List { dlq, limit }) => dlq_list(&inspect(db).await?, json, &dlq, limit).await,
        Command::Dlq(Dlq::Peek { dlq }) => dlq_peek(&inspect(db).await?, json, &dlq).await,
        Command::Dlq(Dlq::Redrive { ref dlq, ref to, limit, rate }) => {
            let broker = exclusive(db, "dlq redrive").await?;
            let res = redrive(&broker, json, dlq, to.clone(), limit, rate).await;
            finish(broker, res).await
        }
        Command::Group(Group::Reset { ref group, ref queue, ref to }) => {
            let broker = exclusive(db, "group reset").await?;
            let res = reset(&broker, json, group, queue, to).await;
            finish(broker, res).await
        }
        Command::Group(Group::Pause { ref group, ref queue }) => pause(db, json, group, queue, true).await,
        Command::Group(Group::Resume { ref group, ref queue }) => pause(db, json, group, queue, false).await,
        Command::DeleteQueue { ref queue, ref confirm } => {
            crate::lifecycle::delete_queue(db, json, queue, confirm).await
        }
        Command::Purge { ref queue, ref confirm } => crate::lifecycle::purge(db, json, queue, confirm).await,
        Command::DeleteGroup { ref queue, ref group, ref confirm } => {
            crate::lifecycle::delete_group(db, json, queue, group, confirm).await
        }
        #[cfg(feature = "web")]
        Command::Serve { listen, token, allow_remote, read_only, public_reads, allowed_hosts } => {
            let access = crate::serve::Access { token, allow_remote, public_reads, allowed_hosts };
            crate::serve::serve(db, listen, access, read_only).await
        }
        Command::Backup { ref dir } => crate::backup::backup(db, json, dir).await,
        Command::Restore { ref backup } => crate::backup::restore(db, json, backup).await,
        Command::Export { ref file } => crate::transfer::export(db, json, file).await,
        Command::Import { ref file } => crate::transfer::import(db, json, file).await,
        Command::Trim => {
            let broker = exclusive(db, "trim").await?;
            let res = trim(&broker, json).await;
            finish(broker, res).await
        }
    }
}

fn print_json(value: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

/// The groups (of `only_queue`), and with `queues` (what was inspected) the queues and keyspaces.
async fn stats(
    inspector: &Inspector,
    json: bool,
    only_queue: Option<&str>,
    queues: Option<&Target>,
) -> Result<()> {
    let stats = inspector.stats().await?;
    let groups: Vec<_> = stats.groups.iter().filter(|g| only_queue.is_none_or(|q| g.queue == q)).collect();
    if json {
        // The library's JSON shape of the stats (the console's `/api/stats` too).
        let mut out = json!({ "groups": groups });
        if queues.is_some() {
            out["bytes_on_disk"] = json!(stats.bytes_on_disk);
            out["queues"] = json!(stats.queues);
            out["keyspaces"] = json!(stats.keyspaces);
        }
        print_json(&out);
        return Ok(());
    }
    if let Some(target) = queues {
        let rows: Vec<_> = stats
            .queues
            .iter()
            .map(|q| {
                vec![
                    q.name.clone(),
                    q.first_seq.to_string(),
                    q.last_seq.to_string(),
                    q.len.to_string(),
                    q.bytes.to_string(),
                    format::opt_duration(q.oldest_age),
                    q.scheduled.to_string(),
                    format::opt_time(q.next_due),
                    format!("{:?}", q.retention),
                ]
            })
            .collect();
        table(
            &["QUEUE", "FIRST", "LAST", "LEN", "BYTES", "OLDEST", "SCHEDULED", "NEXT DUE", "RETENTION"],
            &rows,
        );
        // An etcd namespace has no size of its own (etcd's is the cluster's: `etcdctl endpoint status`).
        if matches!(target, Target::Db(_)) {
            println!(
                "database: {} bytes (SST files and memtables; per-queue bytes are estimates, recent writes included)",
                stats.bytes_on_disk
            );
        }
        println!();
        if !stats.keyspaces.is_empty() {
            let rows: Vec<_> =
                stats.keyspaces.iter().map(|k| vec![k.name.clone(), k.keys.to_string()]).collect();
            table(&["KEYSPACE", "KEYS"], &rows);
            println!();
        }
    }
    let rows: Vec<_> = groups
        .iter()
        .map(|g| {
            vec![
                g.queue.clone(),
                g.group.clone(),
                g.mode.as_str().to_owned(),
                g.committed.to_string(),
                g.lag.to_string(),
                format::opt_duration(g.oldest_unacked_age),
                g.in_flight.to_string(),
                g.waiting_retry.to_string(),
                match &g.dead_letter_queue {
                    Some(d) => format!("{d} ({})", g.dlq_depth),
                    None => "-".into(),
                },
                if g.paused { "paused".into() } else { "-".into() },
                format::opt_duration(g.lease),
                g.retry_policy.as_ref().map_or_else(
                    || "-".into(),
                    |p| {
                        let (lo, hi) = (format::duration(p.initial_delay()), format::duration(p.max_delay()));
                        format!("{} ({lo}..{hi})", p.attempts())
                    },
                ),
                if g.ordered_by_key { "by key".into() } else { "-".into() },
                limits(g.rate_limit, g.concurrency_limit, g.per_key_limit),
            ]
        })
        .collect();
    table(
        &[
            "QUEUE",
            "GROUP",
            "MODE",
            "COMMITTED",
            "LAG",
            "OLDEST UNACKED",
            "IN FLIGHT",
            "RETRYING",
            "DLQ",
            "PAUSED",
            "LEASE",
            "ATTEMPTS (BACKOFF)",
            "ORDER",
            "LIMITS",
        ],
        &rows,
    );
    Ok(())
}

/// A group's stored limits: `10/1s` (with a burst), `3 at once`, `2 per key`, or `-`.
fn limits(rate: Option<rockq::RateLimit>, concurrency: Option<u32>, per_key: Option<u32>) -> String {
    let rate = rate.map(|r| match r.burst_size() {
        1 => format!("{}/{}", r.jobs(), format::duration(r.per())),
        n => format!("{}/{} burst {n}", r.jobs(), format::duration(r.per())),
    });
    let at_once = concurrency.map(|n| format!("{n} at once"));
    let per_key = per_key.map(|n| format!("{n} per key"));
    let both: Vec<String> = rate.into_iter().chain(at_once).chain(per_key).collect();
    if both.is_empty() { "-".into() } else { both.join(", ") }
}

async fn peek(inspector: &Inspector, json: bool, queue: &str, from: Option<u64>, limit: usize) -> Result<()> {
    let msgs = inspector.peek(queue, from, limit).await?;
    if json {
        print_json(&json!(msgs));
        return Ok(());
    }
    let rows: Vec<_> = msgs
        .iter()
        .map(|m| {
            vec![
                m.seq.to_string(),
                format::time(m.enqueued_at),
                m.headers.len().to_string(),
                format::payload(&m.payload, 60),
            ]
        })
        .collect();
    table(&["SEQ", "ENQUEUED", "HEADERS", "PAYLOAD"], &rows);
    Ok(())
}

async fn scheduled(inspector: &Inspector, json: bool, queue: Option<&str>, limit: usize) -> Result<()> {
    let msgs = inspector.delayed(queue, limit).await?;
    if json {
        print_json(&json!(msgs));
        return Ok(());
    }
    let rows: Vec<_> = msgs
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.queue.clone(),
                format::time(m.due),
                format::time(m.sent_at),
                m.payload_len.to_string(),
                m.key.as_deref().map_or_else(|| "-".into(), |k| format::payload(k.as_bytes(), 40)),
            ]
        })
        .collect();
    table(&["ID", "QUEUE", "DUE", "SENT", "BYTES", "KEY"], &rows);
    Ok(())
}

/// `catch-up-once` or `skip`.
async fn schedules(inspector: &Inspector, json: bool) -> Result<()> {
    let all = inspector.schedules().await?;
    if json {
        print_json(&json!(all));
        return Ok(());
    }
    let rows: Vec<_> = all
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.queue.clone(),
                s.recurrence.clone(),
                format::opt_time(s.next),
                if s.paused { "paused".into() } else { "-".into() },
                s.fired.to_string(),
                s.missed_firings.to_string(),
                s.last.map_or_else(|| "-".into(), |(t, seq)| format!("{} (#{seq})", format::time(t))),
            ]
        })
        .collect();
    table(&["NAME", "QUEUE", "RECURRENCE", "NEXT", "PAUSED", "FIRED", "MISSED", "LAST"], &rows);
    Ok(())
}

async fn pending(inspector: &Inspector, json: bool, group: &str, queue: &str) -> Result<()> {
    let claims = inspector.pending(queue, group).await?;
    if json {
        print_json(&json!(claims));
        return Ok(());
    }
    let rows: Vec<_> = claims
        .iter()
        .map(|c| {
            vec![
                c.seq.to_string(),
                c.state.as_str().to_owned(),
                c.attempt.to_string(),
                c.holder.clone().unwrap_or_else(|| "-".into()),
                format::opt_time(c.lease_deadline.or(c.retry_at)),
                c.last_error.as_deref().map_or_else(|| "-".into(), |e| format::payload(e.as_bytes(), 50)),
            ]
        })
        .collect();
    table(&["SEQ", "STATE", "ATTEMPT", "HOLDER", "UNTIL", "LAST ERROR"], &rows);
    Ok(())
}

async fn job(inspector: &Inspector, json: bool, queue: &str, group: &str, seq: u64) -> Result<()> {
    let job = inspector.job(queue, group, seq).await?;
    if json {
        print_json(&json!(job));
        return Ok(());
    }
    let time_left = match job.state {
        JobState::Leased { lease_remaining } => format!("lease {:.1}s", lease_remaining.as_secs_f64()),
        JobState::RetryWaiting { due_in } => format!("retry in {:.1}s", due_in.as_secs_f64()),
        _ => "-".into(),
    };
    let row = vec![
        job.seq.to_string(),
        job.state.as_str().to_owned(),
        job.priority.to_string(),
        job.attempt.to_string(),
        job.holder.clone().unwrap_or_else(|| "-".into()),
        time_left,
        job.last_error.as_deref().map_or_else(|| "-".into(), |e| format::payload(e.as_bytes(), 50)),
        job.progress.as_deref().map_or_else(|| "-".into(), |p| format::payload(p, 30)),
        job.outcome.as_ref().map_or_else(|| "-".into(), outcome),
    ];
    table(
        &["SEQ", "STATE", "PRIORITY", "ATTEMPT", "HOLDER", "UNTIL", "LAST ERROR", "PROGRESS", "OUTCOME"],
        &[row],
    );
    Ok(())
}

/// `acked (attempt 2) at <time>, result "…"`, `dead-lettered … to <dlq>#<seq>: <reason>`.
fn outcome(o: &rockq::JobOutcome) -> String {
    let mut s = format!("{} (attempt {}) at {}", o.kind.as_str(), o.attempt, format::time(o.finished_at));
    if let rockq::OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } = &o.kind {
        s +=
            &format!(" to {dead_letter_queue}#{dead_letter_seq}: {}", format::payload(reason.as_bytes(), 50));
    }
    if let Some(r) = &o.result {
        s += &format!(", result {}", format::payload(r, 50));
    }
    s
}

async fn dlq_list(inspector: &Inspector, json: bool, dlq: &str, limit: usize) -> Result<()> {
    let letters = inspector.dead_letters(dlq, limit).await?;
    if json {
        print_json(&json!(letters));
        return Ok(());
    }
    let rows: Vec<_> = letters
        .iter()
        .map(|d| {
            vec![
                d.dlq_seq.to_string(),
                match (&d.queue, d.seq) {
                    (Some(q), Some(s)) => format!("{q}#{s}"),
                    _ => "-".into(),
                },
                d.group.clone().unwrap_or_else(|| "-".into()),
                d.attempts.to_string(),
                format::time(d.dead_lettered_at),
                format::payload(d.reason.as_bytes(), 50),
            ]
        })
        .collect();
    table(&["DLQ SEQ", "ORIGIN", "GROUP", "ATTEMPTS", "DEAD-LETTERED", "REASON"], &rows);
    Ok(())
}

async fn dlq_peek(inspector: &Inspector, json: bool, dlq: &str) -> Result<()> {
    let Some(d) = inspector.dead_letters(dlq, 1).await?.into_iter().next() else {
        say(json, serde_json::Value::Null, || format!("{dlq} is empty"));
        return Ok(());
    };
    if json {
        print_json(&json!(d));
        return Ok(());
    }
    let origin = match (&d.queue, d.seq) {
        (Some(q), Some(s)) => format!("{q}#{s}"),
        _ => "-".into(),
    };
    println!("dlq seq:        {}", d.dlq_seq);
    println!("origin:         {origin}");
    println!("group:          {}", d.group.as_deref().unwrap_or("-"));
    println!("attempts:       {}", d.attempts);
    println!("reason:         {}", d.reason);
    println!("enqueued:       {}", format::time(d.enqueued_at));
    println!("dead-lettered:  {}", format::time(d.dead_lettered_at));
    for (k, v) in &d.headers {
        println!("header {k}: {}", format::payload(v, 0));
    }
    println!("payload:        {}", format::payload(&d.payload, 0));
    Ok(())
}

async fn pause(db: &Target, json: bool, group: &str, queue: &str, paused: bool) -> Result<()> {
    let (verb, done) = if paused { ("group pause", "paused") } else { ("group resume", "resumed") };
    let broker = exclusive(db, verb).await?;
    let res = match paused {
        true => broker.pause_group(queue, group).await,
        false => broker.resume_group(queue, group).await,
    };
    let res = res.map_err(Failure::from).map(|()| {
        say(json, json!({ "group": group, "queue": queue, "paused": paused }), || {
            format!("{done} group {group} on {queue}")
        })
    });
    finish(broker, res).await
}

async fn redrive(
    broker: &Broker,
    json: bool,
    dlq: &str,
    to: Option<String>,
    limit: Option<u64>,
    rate: Option<f64>,
) -> Result<()> {
    if !broker.queue_names().iter().any(|q| q == dlq) {
        return Err(Failure::from(format!("queue {dlq:?} does not exist")));
    }
    let letters = broker.dead_letters(dlq).await?;
    let total = letters.len().await?.min(limit.unwrap_or(u64::MAX));
    let bar = progress(json, total, "redriving");
    // Batches of 256, each its own atomic redrive: the bar moves per batch, and an interrupted
    // run resumes where it stopped (the redrive cursor is persisted with each batch).
    let mut moved = 0u64;
    while moved < total {
        let mut opts = rockq::Redrive::new().limit((total - moved).min(256));
        if let Some(t) = &to {
            opts = opts.to(t.clone());
        }
        if let Some(r) = rate {
            opts = opts.rate(r);
        }
        let n = letters.redrive(opts).await?;
        if n == 0 {
            break;
        }
        moved += n;
        bar.set_position(moved);
    }
    bar.finish_and_clear();
    say(json, json!({ "dlq": dlq, "moved": moved }), || format!("redrove {moved} dead letters from {dlq}"));
    Ok(())
}

async fn reset(broker: &Broker, json: bool, group: &str, queue: &str, to: &ResetTarget) -> Result<()> {
    // `Broker::queue` would create a missing queue: bad input must change nothing.
    if !broker.queue_names().iter().any(|q| q == queue) {
        return Err(Failure::from(format!("group {group:?} does not exist on queue {queue:?}")));
    }
    let target = if let Some(s) = to.to_seq {
        ResetTo::Sequence(s)
    } else if let Some(t) = to.to_time {
        ResetTo::Time(UNIX_EPOCH + Duration::from_secs(t))
    } else if let Some(ago) = to.ago {
        ResetTo::Time(SystemTime::now() - ago)
    } else {
        let q = broker.queue(queue).await?;
        ResetTo::Sequence(if to.earliest { q.first_seq() } else { q.last_seq() + 1 })
    };
    let seq = broker.reset_group(queue, group, target).await?;
    say(json, json!({ "group": group, "queue": queue, "next_seq": seq }), || {
        format!("group {group} on {queue} now starts at sequence {seq}")
    });
    Ok(())
}

async fn trim(broker: &Broker, json: bool) -> Result<()> {
    let bar = spinner(json, "trimming and compacting");
    let report = broker.trim().await;
    bar.finish_and_clear();
    let r = report?;
    say(
        json,
        json!({ "deleted": r.deleted, "bytes_before": r.bytes_before, "bytes_after": r.bytes_after, "compacted": r.compacted }),
        || format!("deleted {} messages; {} → {} bytes on disk", r.deleted, r.bytes_before, r.bytes_after),
    );
    Ok(())
}

fn spinner(json: bool, what: &str) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_message(what.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}
