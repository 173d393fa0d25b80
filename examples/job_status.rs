//! "Where is my job?": a producer keeps the ids its sends returned, asks a work group where
//! each job stands while a pool runs them (one fails once and waits for its retry; each reports
//! its progress), then waits for each to finish without polling and reads the result its
//! handler set (the group keeps outcomes for a day).
//!
//! `cargo run --example job_status`

use std::time::Duration;

use rockq::{Broker, HandlerError, JobState, RetryPolicy, Task};

#[tokio::main]
async fn main() -> Result<(), rockq::Error> {
    let dir = tempfile::tempdir()?;
    let broker = Broker::open(dir.path()).await?;
    let reports = broker.queue("reports").await?;
    let group = reports
        .work_group("builders")?
        .consumer_name("builder-1")
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_millis(300), Duration::from_secs(1)),
        )
        .keep_outcomes(Duration::from_secs(24 * 3600));

    // A job's id is the sequence its send returned.
    let mut ids = Vec::new();
    for name in ["january", "february", "march"] {
        ids.push(reports.send(name).await?);
    }

    // The pool: "february" fails its first attempt.
    let pool = group.clone().workers(2).spawn(|task: Task| async move {
        task.progress("fetching the ledger")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if task.payload().as_ref() == b"february" && task.attempt() == 1 {
            return Err(HandlerError::retry("the ledger service timed out"));
        }
        task.progress("rendering")?;
        let month = String::from_utf8_lossy(task.payload()).into_owned();
        task.set_result(format!("reports/{month}.pdf"))?;
        Ok(())
    });

    // Ask while they run.
    tokio::time::sleep(Duration::from_millis(150)).await;
    for &id in &ids {
        let job = broker.job("reports", "builders", id).await?;
        match job.state {
            JobState::Leased { lease_remaining } => println!(
                "job {id}: running ({}), attempt {} on {}, lease {lease_remaining:.1?} left",
                job.progress.as_deref().map(String::from_utf8_lossy).unwrap_or_default(),
                job.attempt,
                job.holder.as_deref().unwrap_or("?")
            ),
            JobState::RetryWaiting { due_in } => println!(
                "job {id}: failed ({}), again in {due_in:.1?}",
                job.last_error.as_deref().unwrap_or("?")
            ),
            JobState::Finished => match &job.outcome {
                Some(o) => {
                    println!("job {id}: finished already, {} after attempt {}", o.kind.as_str(), o.attempt)
                }
                None => println!("job {id}: finished already"),
            },
            state => println!("job {id}: {} (attempt {})", state.as_str(), job.attempt),
        }
    }

    // Wait for each: woken when its outcome is durable.
    for &id in &ids {
        let done = group.wait_job(id).await?;
        match done.outcome {
            Some(o) => println!(
                "job {id}: {} after attempt {}, result {}",
                o.kind.as_str(),
                o.attempt,
                o.result.as_deref().map(String::from_utf8_lossy).unwrap_or_default()
            ),
            None => println!("job {id}: {}", done.state.as_str()),
        }
    }
    pool.shutdown().await?;
    broker.shutdown().await?;
    Ok(())
}
