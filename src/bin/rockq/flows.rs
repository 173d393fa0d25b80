//! `rockq flow [ID]`: the flows of dependent jobs a database holds, and one flow's steps.

use rockq::{FlowStatus, Inspector, OutcomeKind, StepState, StepStatus};
use serde_json::json;

use crate::format::{self, table};
use crate::session::Result;

/// The states some step is in, with how many: `queued 10, succeeded 3`.
fn counts_text(f: &FlowStatus) -> String {
    let t = f.tally();
    let all = [
        ("waiting", t.waiting),
        ("blocked", t.blocked),
        ("queued", t.queued),
        ("succeeded", t.succeeded),
        ("failed", t.failed),
    ];
    all.iter().filter(|(_, n)| *n > 0).map(|(name, n)| format!("{name} {n}")).collect::<Vec<_>>().join(", ")
}

/// `rockq flow`: up to `limit` flows from id `from`, each with its state and step counts.
pub async fn list(inspector: &Inspector, json: bool, from: u64, limit: usize) -> Result<()> {
    let mut flows = Vec::new();
    for id in inspector.flows(from, limit).await? {
        flows.push(inspector.flow(id).await?);
    }
    if json {
        let rows: Vec<_> = flows
            .iter()
            .map(|f| {
                // The console's `/api/flows` shape: the flow without its steps.
                json!({
                    "id": f.id,
                    "created_at_micros": micros(f.created_at),
                    "state": f.state.as_str(),
                    "tally": f.tally(),
                })
            })
            .collect();
        pretty(&json!(rows));
        return Ok(());
    }
    if flows.is_empty() {
        println!("no flows{}", if from > 0 { format!(" from id {from}") } else { String::new() });
        return Ok(());
    }
    let rows: Vec<_> = flows
        .iter()
        .map(|f| {
            vec![
                f.id.to_string(),
                format::time(f.created_at),
                f.state.as_str().to_owned(),
                f.steps.len().to_string(),
                counts_text(f),
            ]
        })
        .collect();
    table(&["FLOW", "CREATED", "STATE", "STEPS", "STEPS BY STATE"], &rows);
    Ok(())
}

/// `rockq flow ID`: the flow's state and its first `limit` steps.
pub async fn show(inspector: &Inspector, json: bool, id: u64, limit: usize) -> Result<()> {
    let flow = inspector.flow(id).await?;
    if json {
        pretty(&json!(flow));
        return Ok(());
    }
    println!(
        "flow {} {} (created {}): {} steps — {}",
        flow.id,
        flow.state.as_str(),
        format::time(flow.created_at),
        flow.steps.len(),
        counts_text(&flow)
    );
    let rows: Vec<_> = flow.steps.iter().take(limit).map(step_row).collect();
    table(&["STEP", "QUEUE", "GROUP", "AFTER", "STATE", "JOB", "DETAIL"], &rows);
    if flow.steps.len() > limit {
        println!("… {} more steps (--limit, or --json for all)", flow.steps.len() - limit);
    }
    Ok(())
}

fn step_row(s: &StepStatus) -> Vec<String> {
    let after = if s.after.is_empty() {
        "-".to_owned()
    } else {
        format!("{} of {}", s.when.as_str().replace('_', " "), list_steps(&s.after))
    };
    let (job, detail) = match &s.state {
        StepState::Waiting { succeeded, failed, of } => {
            ("-".to_owned(), format!("{succeeded} succeeded, {failed} failed of {of}"))
        }
        StepState::Blocked { failed, of } => ("-".to_owned(), format!("{failed} of {of} failed")),
        StepState::Queued { seq } => (format!("#{seq}"), "-".to_owned()),
        StepState::Succeeded { seq, finished_at, result } => (
            format!("#{seq}"),
            format!(
                "at {}{}",
                format::time(*finished_at),
                result.as_ref().map_or_else(String::new, |r| format!(", result {}", format::payload(r, 40)))
            ),
        ),
        StepState::Failed { seq, finished_at, how } => {
            let why = match how {
                OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } => format!(
                    "dead-lettered to {dead_letter_queue}#{dead_letter_seq}: {}",
                    format::payload(reason.as_bytes(), 40)
                ),
                other => other.as_str().to_owned(),
            };
            (format!("#{seq}"), format!("{why} at {}", format::time(*finished_at)))
        }
        // `StepState` is non-exhaustive: a state this CLI does not know yet.
        other => ("-".to_owned(), other.as_str().to_owned()),
    };
    vec![
        s.step.to_string(),
        s.queue.clone(),
        s.group.clone(),
        after,
        s.state.as_str().to_owned(),
        job,
        detail,
    ]
}

/// `0-9, 12` for the steps `[0, 1, …, 9, 12]`: runs of consecutive indexes shortened.
fn list_steps(steps: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let mut j = i;
        while j + 1 < steps.len() && steps[j + 1] == steps[j] + 1 {
            j += 1;
        }
        parts.push(if j > i + 1 {
            format!("{}-{}", steps[i], steps[j])
        } else if j == i + 1 {
            format!("{}, {}", steps[i], steps[j])
        } else {
            steps[i].to_string()
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// As the other reading commands print JSON: indented.
fn pretty(value: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

fn micros(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_of_steps_are_shortened() {
        assert_eq!(super::list_steps(&[0, 1, 2, 3, 7, 9, 10]), "0-3, 7, 9, 10");
        assert_eq!(super::list_steps(&[4]), "4");
        assert_eq!(super::list_steps(&[]), "");
    }
}
