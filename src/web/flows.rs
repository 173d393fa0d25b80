//! Flows of dependent jobs: the list (`/flows`), one flow drawn as a graph of its steps with a
//! table of them (`/flows/{id}`), and the same as JSON (`/api/flows`, `/api/flows/{id}`).
//!
//! The graph is drawn on the server as SVG (no script runs on any page): a step's column is its
//! depth (one more than its deepest dependency's), and steps of one column that share queue,
//! group, condition and dependencies — a fan-out of 10,000 children — are drawn as one node
//! with their counts, so a batch stays a picture of three boxes rather than 10,000.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::{Path, Query, State as AxState};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::ctx::Ctx;
use super::failure::Failure;
use super::fmt;
use super::html::{self, View, esc};
use super::input;
use super::state::State;
use crate::flow_state::{FlowStatus, StepState, StepStatus, StepTally};
use crate::json::FlowSummary;
use crate::stats::OutcomeKind;

type Params = Query<HashMap<String, String>>;

/// Steps of one column drawn one by one up to this many alike; more are one node.
const ALIKE_SHOWN: usize = 4;
/// Nodes drawn at most: past it (a flow of many distinct steps) only the table is shown.
const MAX_NODES: usize = 300;

/// `?from=` and `?limit=` of the list (default: the first 50 flows).
fn list_params(p: &HashMap<String, String>) -> Result<(u64, usize), Failure> {
    let from = match p.get("from").map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(s) => input::seq("from", s)?,
        None => 0,
    };
    let limit = input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?
        .unwrap_or(50) as usize;
    Ok((from, limit))
}

async fn load(st: &State, from: u64, limit: usize) -> Result<Vec<FlowStatus>, Failure> {
    let mut flows = Vec::new();
    for id in st.source.flows(from, limit).await? {
        match st.source.flow(id).await {
            Ok(f) => flows.push(f),
            // Deleted between the listing and the read.
            Err(f) if f.status == axum::http::StatusCode::NOT_FOUND => {}
            Err(f) => return Err(f),
        }
    }
    Ok(flows)
}

/// GET `/api/flows?from=&limit=`: the flows without their steps.
pub(crate) async fn api_list(AxState(st): AxState<Arc<State>>, ctx: Ctx, Query(p): Params) -> Response {
    let r = async {
        let (from, limit) = list_params(&p)?;
        let flows = load(&st, from, limit).await?;
        Ok(json!(flows.iter().map(FlowSummary).collect::<Vec<_>>()))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(f) => ctx.fail(f),
    }
}

/// GET `/api/flows/{id}`: one flow with every step.
pub(crate) async fn api_flow(AxState(st): AxState<Arc<State>>, ctx: Ctx, Path(id): Path<String>) -> Response {
    let r = async {
        let id = input::seq("flow", &id)?;
        st.source.flow(id).await
    }
    .await;
    match r {
        Ok(f) => Json(json!(f)).into_response(),
        Err(f) => ctx.fail(f),
    }
}

/// GET `/flows?from=&limit=`.
pub(crate) async fn list(AxState(st): AxState<Arc<State>>, ctx: Ctx, Query(p): Params) -> Response {
    ctx.render(list_page(&st, &ctx, &p).await)
}

async fn list_page(st: &State, ctx: &Ctx, p: &HashMap<String, String>) -> Result<Response, Failure> {
    let (from, limit) = list_params(p)?;
    let flows = load(st, from, limit).await?;
    let b = esc(&ctx.base);
    let now = SystemTime::now();
    let rows: Vec<_> = flows
        .iter()
        .map(|f| {
            let t = f.tally();
            vec![
                format!(r#"<a href="{b}/flows/{0}">{0}</a>"#, f.id),
                fmt::when(f.created_at, now),
                format!(r#"<span class="state {0}">{0}</span>"#, f.state.as_str()),
                t.total().to_string(),
                tally_text(&t),
            ]
        })
        .collect();
    let mut body = format!(
        r#"<p class="summary">Showing {} flows from id {from} (at most {limit}), in the order they were submitted.</p>"#,
        flows.len()
    );
    body.push_str(&html::table("flows", &["Flow", "Created", "State", "Steps", "Steps by state"], &rows));
    if flows.len() == limit
        && let Some(last) = flows.last()
    {
        let _ = write!(
            body,
            r#"<p><a id="next-flows" href="{b}/flows?from={}&amp;limit={limit}">Next</a></p>"#,
            last.id + 1
        );
    }
    Ok(ctx.page("Flows", None, &body))
}

/// `queued 10, succeeded 3` (the states some step is in).
fn tally_text(t: &StepTally) -> String {
    let all = [
        ("waiting", t.waiting),
        ("blocked", t.blocked),
        ("queued", t.queued),
        ("succeeded", t.succeeded),
        ("failed", t.failed),
    ];
    let parts: Vec<_> = all
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!(r#"<span class="state {name}">{n} {name}</span>"#))
        .collect();
    if parts.is_empty() { "-".into() } else { parts.join(" ") }
}

/// GET `/flows/{id}?limit=`: the graph, then the first `limit` steps (default 200).
pub(crate) async fn page(
    AxState(st): AxState<Arc<State>>,
    ctx: Ctx,
    Path(id): Path<String>,
    Query(p): Params,
) -> Response {
    ctx.render(flow_page(&st, &ctx, &id, &p).await)
}

async fn flow_page(
    st: &State,
    ctx: &Ctx,
    id: &str,
    p: &HashMap<String, String>,
) -> Result<Response, Failure> {
    let id = input::seq("flow", id)?;
    let limit = input::limit("limit", p.get("limit").map(String::as_str), input::MAX_LIST as u64)?
        .unwrap_or(200) as usize;
    let flow = st.source.flow(id).await?;
    let now = SystemTime::now();
    let t = flow.tally();
    let mut body = format!(
        r#"<p class="summary">Flow <b>{id}</b> <span class="state {s}" id="flow-state">{s}</span> · {} steps: {} · created {}</p>"#,
        t.total(),
        tally_text(&t),
        fmt::when(flow.created_at, now),
        s = flow.state.as_str(),
    );
    body.push_str("<h2>Graph</h2>");
    body.push_str(&graph(ctx, &flow));
    let shown = flow.steps.len().min(limit);
    let _ = write!(body, r#"<h2>Steps</h2><p class="summary">Showing {shown} of {}.</p>"#, flow.steps.len());
    let rows: Vec<_> = flow.steps.iter().take(limit).map(|s| step_row(ctx, s, now)).collect();
    body.push_str(&html::table(
        "steps",
        &["Step", "Queue", "Group", "After", "State", "Job", "Detail"],
        &rows,
    ));
    Ok(ctx.page(&format!("Flow {id}"), None, &body))
}

fn job_link(ctx: &Ctx, s: &StepStatus, seq: u64) -> String {
    format!(r#"<a href="{}/groups/{}/{}?job={seq}">#{seq}</a>"#, esc(&ctx.base), esc(&s.queue), esc(&s.group))
}

fn step_row(ctx: &Ctx, s: &StepStatus, now: SystemTime) -> Vec<String> {
    let b = esc(&ctx.base);
    let after = if s.after.is_empty() {
        "-".to_owned()
    } else {
        format!("{} of {}", s.when.as_str().replace('_', " "), esc(&ranges(&s.after)))
    };
    let (job, detail) = match &s.state {
        StepState::Waiting { succeeded, failed, of } => {
            ("-".into(), format!("{succeeded} succeeded, {failed} failed of {of}"))
        }
        StepState::Blocked { failed, of } => ("-".into(), format!("{failed} of {of} failed")),
        StepState::Queued { seq } => (job_link(ctx, s, *seq), "-".into()),
        StepState::Succeeded { seq, finished_at, result } => (
            job_link(ctx, s, *seq),
            format!(
                "{}{}",
                fmt::when(*finished_at, now),
                result
                    .as_ref()
                    .map_or_else(String::new, |r| format!(" · result {}", html::payload(r, View::Text, 200)))
            ),
        ),
        StepState::Failed { seq, finished_at, how } => {
            let why = match how {
                OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } => format!(
                    r#"dead-lettered to <a href="{b}/dlq/{q}">{q}</a>#{dead_letter_seq}: {}"#,
                    esc(reason),
                    q = esc(dead_letter_queue)
                ),
                other => esc(other.as_str()),
            };
            (job_link(ctx, s, *seq), format!("{why} · {}", fmt::when(*finished_at, now)))
        }
    };
    vec![
        s.step.to_string(),
        format!(r#"<a href="{b}/queues/{q}">{q}</a>"#, q = esc(&s.queue)),
        format!(r#"<a href="{b}/groups/{q}/{g}">{g}</a>"#, q = esc(&s.queue), g = esc(&s.group)),
        after,
        format!(r#"<span class="state {0}">{0}</span>"#, s.state.as_str()),
        job,
        detail,
    ]
}

/// `0-9, 12` for `[0, 1, …, 9, 12]`.
fn ranges(steps: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let mut j = i;
        while j + 1 < steps.len() && steps[j + 1] == steps[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", steps[i], steps[j]) } else { steps[i].to_string() });
        i = j + 1;
    }
    parts.join(", ")
}

/// One box of the graph: one step, or several alike steps of one column.
struct Node {
    steps: Vec<u32>,
    column: usize,
}

/// What makes steps of one column alike: depth, queue, group, condition, dependencies.
type Likeness<'a> = (usize, &'a str, &'a str, &'a str, &'a [u32]);

/// Steps laid out in columns by depth, alike steps of a column merged (see the module docs);
/// `None` if the picture would have more than [`MAX_NODES`] boxes.
fn layout(flow: &FlowStatus) -> Option<(Vec<Node>, Vec<usize>)> {
    let mut depth = vec![0usize; flow.steps.len()];
    for s in &flow.steps {
        // Dependencies always come earlier (the builder refuses forward ones).
        let d = s.after.iter().filter_map(|&a| depth.get(a as usize)).max().map_or(0, |m| m + 1);
        if let Some(slot) = depth.get_mut(s.step as usize) {
            *slot = d;
        }
    }
    let mut classes: BTreeMap<Likeness<'_>, Vec<u32>> = BTreeMap::new();
    for s in &flow.steps {
        let when = if s.after.is_empty() { "" } else { s.when.as_str() };
        let d = depth.get(s.step as usize).copied().unwrap_or(0);
        classes.entry((d, &s.queue, &s.group, when, &s.after)).or_default().push(s.step);
    }
    let mut nodes: Vec<Node> = Vec::new();
    for ((column, ..), steps) in classes {
        if steps.len() > ALIKE_SHOWN {
            nodes.push(Node { steps, column });
        } else {
            nodes.extend(steps.into_iter().map(|s| Node { steps: vec![s], column }));
        }
        if nodes.len() > MAX_NODES {
            return None;
        }
    }
    // Within a column, in step order.
    nodes.sort_by_key(|n| (n.column, n.steps[0]));
    let mut node_of = vec![0usize; flow.steps.len()];
    for (i, n) in nodes.iter().enumerate() {
        for &s in &n.steps {
            if let Some(slot) = node_of.get_mut(s as usize) {
                *slot = i;
            }
        }
    }
    Some((nodes, node_of))
}

/// A node's steps counted by state.
fn tally_of(flow: &FlowStatus, node: &Node) -> StepTally {
    let mut t = StepTally::default();
    for &s in &node.steps {
        match flow.steps.get(s as usize).map(|s| &s.state) {
            Some(StepState::Waiting { .. }) => t.waiting += 1,
            Some(StepState::Blocked { .. }) => t.blocked += 1,
            Some(StepState::Queued { .. }) => t.queued += 1,
            Some(StepState::Succeeded { .. }) => t.succeeded += 1,
            Some(StepState::Failed { .. }) | None => t.failed += 1,
        }
    }
    t
}

/// The state a node is drawn in: its steps' one state, or the one that most needs an eye.
fn node_state(t: &StepTally) -> &'static str {
    if t.failed > 0 {
        "failed"
    } else if t.blocked > 0 {
        "blocked"
    } else if t.queued > 0 {
        "queued"
    } else if t.waiting > 0 {
        "waiting"
    } else {
        "succeeded"
    }
}

const BOX_W: usize = 190;
const BOX_H: usize = 46;
const GAP_X: usize = 70;
const GAP_Y: usize = 14;

/// The flow as an SVG graph of its steps (see the module docs), or a note when it is too big.
fn graph(ctx: &Ctx, flow: &FlowStatus) -> String {
    let Some((nodes, node_of)) = layout(flow) else {
        return format!(
            r#"<p class="summary" id="flow-graph-skipped">Not drawn: more than {MAX_NODES} distinct steps. The table below lists them.</p>"#
        );
    };
    let columns = nodes.iter().map(|n| n.column + 1).max().unwrap_or(0);
    let mut row_in_column = vec![0usize; columns];
    let mut at = Vec::with_capacity(nodes.len());
    for n in &nodes {
        let row = row_in_column[n.column];
        row_in_column[n.column] += 1;
        at.push((10 + n.column * (BOX_W + GAP_X), 10 + row * (BOX_H + GAP_Y)));
    }
    let rows = row_in_column.iter().copied().max().unwrap_or(0);
    let w = 20 + columns * BOX_W + columns.saturating_sub(1) * GAP_X;
    let h = 20 + rows * BOX_H + rows.saturating_sub(1) * GAP_Y;
    let mut svg = format!(
        r#"<svg class="flow-graph" id="flow-graph" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="the steps of flow {}">"#,
        flow.id
    );
    // Edges first, under the boxes: one per pair of boxes, however many steps they hold.
    let mut edges: Vec<(usize, usize)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for &s in &n.steps {
            for &a in flow.steps.get(s as usize).map_or(&[][..], |s| &s.after[..]) {
                edges.push((node_of.get(a as usize).copied().unwrap_or(0), i));
            }
        }
    }
    edges.sort_unstable();
    edges.dedup();
    for (from, to) in edges {
        let ((fx, fy), (tx, ty)) = (at[from], at[to]);
        let (x1, y1, x2, y2) = (fx + BOX_W, fy + BOX_H / 2, tx, ty + BOX_H / 2);
        let mid = (x1 + x2) / 2;
        let _ = write!(
            svg,
            r#"<path class="edge" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}" data-from="{from}" data-to="{to}"/>"#
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        let (x, y) = at[i];
        let t = tally_of(flow, n);
        let state = node_state(&t);
        let first = flow.steps.get(n.steps[0] as usize);
        let (queue, group) = first.map_or(("", ""), |s| (s.queue.as_str(), s.group.as_str()));
        let title = if n.steps.len() == 1 {
            format!("step {}", n.steps[0])
        } else {
            format!("steps {} ({})", ranges(&n.steps), n.steps.len())
        };
        let detail = if n.steps.len() == 1 {
            match first.map(|s| &s.state) {
                Some(StepState::Queued { seq })
                | Some(StepState::Succeeded { seq, .. })
                | Some(StepState::Failed { seq, .. }) => {
                    format!("{state} · job #{seq}")
                }
                Some(StepState::Waiting { succeeded, failed, of }) => {
                    format!("waiting · {} of {of} done", succeeded + failed)
                }
                _ => state.to_owned(),
            }
        } else {
            let all = [
                ("waiting", t.waiting),
                ("blocked", t.blocked),
                ("queued", t.queued),
                ("ok", t.succeeded),
                ("failed", t.failed),
            ];
            all.iter().filter(|(_, k)| *k > 0).map(|(s, k)| format!("{k} {s}")).collect::<Vec<_>>().join(", ")
        };
        let link = match first.map(|s| &s.state) {
            Some(StepState::Queued { seq })
            | Some(StepState::Succeeded { seq, .. })
            | Some(StepState::Failed { seq, .. })
                if n.steps.len() == 1 =>
            {
                Some(format!("{}/groups/{}/{}?job={seq}", esc(&ctx.base), esc(queue), esc(group)))
            }
            _ => None,
        };
        let boxed = format!(
            r#"<g class="node {state}" data-steps="{}" data-state="{state}"><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6"/><text x="{tx}" y="{t1}">{}</text><text x="{tx}" y="{t2}" class="sub">{}</text><text x="{tx}" y="{t3}" class="sub">{}</text></g>"#,
            n.steps.len(),
            esc(&clip(&title, 30)),
            esc(&clip(&format!("{queue} / {group}"), 32)),
            esc(&clip(&detail, 32)),
            tx = x + 8,
            t1 = y + 14,
            t2 = y + 28,
            t3 = y + 41,
        );
        match link {
            Some(href) => {
                let _ = write!(svg, r#"<a href="{href}">{boxed}</a>"#);
            }
            None => svg.push_str(&boxed),
        }
    }
    svg.push_str("</svg>");
    format!(r#"<div class="flow-graph-wrap">{svg}</div>"#)
}

/// At most `max` characters, with `…` when cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        s.chars().take(max - 1).chain(std::iter::once('…')).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_state::{FlowState, RunWhen};

    fn step(i: u32, after: &[u32], state: StepState) -> StepStatus {
        StepStatus {
            step: i,
            queue: "q".into(),
            group: if after.is_empty() { "children".into() } else { "parents".into() },
            when: RunWhen::AllSucceeded,
            after: after.to_vec(),
            state,
        }
    }

    fn flow(steps: Vec<StepStatus>) -> FlowStatus {
        FlowStatus { id: 1, created_at: SystemTime::UNIX_EPOCH, state: FlowState::Running, steps }
    }

    #[test]
    fn a_fan_out_is_three_boxes_and_a_chain_one_per_step() {
        let mut steps: Vec<_> =
            (0..1000).map(|i| step(i, &[], StepState::Queued { seq: i as u64 + 1 })).collect();
        let all: Vec<u32> = (0..1000).collect();
        steps.push(step(1000, &all, StepState::Waiting { succeeded: 0, failed: 0, of: 1000 }));
        steps.push(step(1001, &[1000], StepState::Waiting { succeeded: 0, failed: 0, of: 1 }));
        let (nodes, node_of) = layout(&flow(steps)).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].steps.len(), 1000);
        assert_eq!((nodes[1].column, nodes[2].column), (1, 2));
        assert_eq!((node_of[999], node_of[1000], node_of[1001]), (0, 1, 2));

        let chain: Vec<_> = (0..3)
            .map(|i: u32| {
                let after: Vec<u32> = (i.saturating_sub(1)..i).collect();
                step(i, &after, StepState::Waiting { succeeded: 0, failed: 0, of: 1 })
            })
            .collect();
        let (nodes, _) = layout(&flow(chain)).unwrap();
        assert_eq!(nodes.iter().map(|n| n.column).collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn too_many_distinct_steps_are_not_drawn() {
        // Each step after its predecessor and the first: all different dependency lists.
        let steps: Vec<_> = (0..(MAX_NODES as u32 + 2))
            .map(|i| {
                let after: Vec<u32> = if i == 0 { vec![] } else { (0..i).collect() };
                step(i, &after, StepState::Waiting { succeeded: 0, failed: 0, of: i })
            })
            .collect();
        assert!(layout(&flow(steps)).is_none());
    }

    #[test]
    fn ranges_are_shortened() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(clip("abcdef", 4), "abc…");
    }
}
