//! Server-rendered SVG line charts (no JavaScript, no chart library): a few series over the
//! sampled window, each scaled to its own peak (a rate and a length differ by orders of
//! magnitude), with each peak in the legend and the window's length written on the chart so
//! that it reads without axes.

use std::fmt::Write as _;
use std::time::SystemTime;

use super::html::{duration, esc};

/// One line: its label, CSS class (the colour) and points `(time, value)`.
pub(crate) struct Series<'a> {
    pub label: &'a str,
    pub class: &'a str,
    pub points: Vec<(SystemTime, f64)>,
}

const W: f64 = 320.0;
const H: f64 = 80.0;
const TOP: f64 = 14.0;

/// The chart, or a note when fewer than two samples exist (one point draws no line).
pub(crate) fn render(title: &str, series: &[Series<'_>]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (Some(start), Some(end)) = (all.clone().map(|p| p.0).min(), all.clone().map(|p| p.0).max()) else {
        return format!(r#"<p class="chart-empty">{}: waiting for samples…</p>"#, esc(title));
    };
    let span = end.duration_since(start).unwrap_or_default();
    let mut out = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="{t}"><title>{t}</title><rect class="frame" x="0" y="{TOP}" width="{W}" height="{H}"/>"#,
        h = H + TOP + 14.0,
        t = esc(title),
    );
    let _ = write!(out, r#"<text class="label" x="2" y="10">{}</text>"#, esc(title));
    let peak = |s: &Series<'_>| s.points.iter().map(|p| p.1).fold(0.0f64, f64::max);
    for s in series {
        if s.points.len() < 2 {
            continue;
        }
        let scale = if peak(s) > 0.0 { peak(s) } else { 1.0 };
        let mut pts = String::new();
        for (t, v) in &s.points {
            let dx = t.duration_since(start).unwrap_or_default().as_secs_f64();
            let x = if span.is_zero() { 0.0 } else { dx / span.as_secs_f64() * W };
            let y = TOP + H - (v / scale) * (H - 2.0);
            let _ = write!(pts, "{x:.1},{y:.1} ");
        }
        let _ = write!(
            out,
            r#"<polyline class="{}" points="{}"><title>{}</title></polyline>"#,
            esc(s.class),
            pts.trim_end(),
            esc(s.label)
        );
    }
    let mut legend = String::new();
    for s in series {
        let _ = write!(
            legend,
            r#"<tspan class="{}">■ {} ≤{}</tspan> "#,
            esc(s.class),
            esc(s.label),
            number(peak(s))
        );
    }
    let _ = write!(out, r#"<text class="label" x="2" y="{}">{}</text>"#, TOP + H + 11.0, legend.trim_end());
    let _ = write!(
        out,
        r#"<text class="label" x="{}" y="{}" text-anchor="end">last {}</text></svg>"#,
        W - 2.0,
        TOP + H + 11.0,
        duration(span)
    );
    out
}

/// `12`, `3.5`, `0.25`: few digits, for a label.
fn number(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn draws_a_scaled_line_and_escapes_labels() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        let points =
            vec![(t0, 0.0), (t0 + Duration::from_secs(5), 10.0), (t0 + Duration::from_secs(10), 5.0)];
        let svg = render("q<1>", &[Series { label: "enqueued/s", class: "rate", points }]);
        assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.contains("enqueued/s ≤10"));
        assert!(svg.contains("0.0,94.0 160.0,16.0 320.0,55.0"), "{svg}");
        assert!(svg.contains("q&lt;1&gt;") && !svg.contains("q<1>"));
        assert!(render("empty", &[]).contains("waiting for samples"));
    }
}
