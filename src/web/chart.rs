//! Server-rendered SVG line charts (no JavaScript, no chart library) with axes and units: a
//! count (length, lag) on the left axis and a rate on the right one, each from 0 to a rounded
//! ceiling with headroom (so a steady line sits mid-chart instead of pinned to the top like an
//! alarm), and the time axis labelled from the window's start to "now".

use std::fmt::Write as _;
use std::time::SystemTime;

use super::fmt::short;
use super::html::{duration, esc};

/// One line: its label, CSS class (the colour), which axis, and points `(time, value)`.
pub(crate) struct Series<'a> {
    pub label: &'a str,
    pub class: &'a str,
    pub axis: Axis,
    pub points: Vec<(SystemTime, f64)>,
}

/// The left (counts) or right (rates) axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Axis {
    Left,
    Right,
}

const W: f64 = 380.0;
const PLOT_W: f64 = 300.0;
const LEFT: f64 = 40.0;
const TOP: f64 = 28.0;
const H: f64 = 80.0;

/// The chart, or a note when the window holds fewer than two samples over some time (one
/// point draws no line, and a frame labelled "last 0ms" tells nothing).
pub(crate) fn render(title: &str, units: (&str, &str), series: &[Series<'_>]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (Some(start), Some(end)) = (all.clone().map(|p| p.0).min(), all.clone().map(|p| p.0).max()) else {
        return empty(title);
    };
    let span = end.duration_since(start).unwrap_or_default();
    if span.is_zero() || series.iter().all(|s| s.points.len() < 2) {
        return empty(title);
    }
    let ceiling = |axis: Axis| {
        let peak = series
            .iter()
            .filter(|s| s.axis == axis)
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        nice_ceiling(peak * 1.25)
    };
    let (left_max, right_max) = (ceiling(Axis::Left), ceiling(Axis::Right));
    let mut out = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="{t}"><title>{t}</title><text class="label title" x="2" y="11">{t}</text><rect class="frame" x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{H}"/>"#,
        h = TOP + H + 30.0,
        t = esc(title),
    );
    // Grid and tick labels: 0, half, ceiling on both axes, with units.
    for (i, frac) in [0.0, 0.5, 1.0].into_iter().enumerate() {
        let y = TOP + H - frac * H;
        if i > 0 {
            let _ = write!(
                out,
                r#"<line class="grid" x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}"/>"#,
                LEFT + PLOT_W
            );
        }
        let _ = write!(
            out,
            r#"<text class="tick left" x="{}" y="{:.1}" text-anchor="end">{}</text><text class="tick right" x="{}" y="{:.1}">{}</text>"#,
            LEFT - 3.0,
            y + 3.0,
            short(left_max * frac),
            LEFT + PLOT_W + 3.0,
            y + 3.0,
            short(right_max * frac),
        );
    }
    let _ = write!(
        out,
        r#"<text class="unit" x="{}" y="{}" text-anchor="end">{}</text><text class="unit" x="{}" y="{}">{}</text>"#,
        LEFT - 3.0,
        TOP - 6.0,
        esc(units.0),
        LEFT + PLOT_W + 3.0,
        TOP - 6.0,
        esc(units.1)
    );
    // Time axis: the window's start, its middle, now.
    for (frac, anchor) in [(0.0, "start"), (0.5, "middle"), (1.0, "end")] {
        let ago = span.mul_f64(1.0 - frac);
        let label = if frac == 1.0 { "now".to_owned() } else { format!("−{}", duration(ago)) };
        let _ = write!(
            out,
            r#"<text class="tick time" x="{:.1}" y="{}" text-anchor="{anchor}">{label}</text>"#,
            LEFT + frac * PLOT_W,
            TOP + H + 11.0,
        );
    }
    for s in series.iter().filter(|s| s.points.len() >= 2) {
        let max = if s.axis == Axis::Left { left_max } else { right_max };
        let mut pts = String::new();
        for (t, v) in &s.points {
            let dx = t.duration_since(start).unwrap_or_default().as_secs_f64();
            let x = LEFT + dx / span.as_secs_f64() * PLOT_W;
            let y = TOP + H - (v / max).min(1.0) * H;
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
        let now = s.points.last().map_or(0.0, |p| p.1);
        let _ =
            write!(legend, r#"<tspan class="{}">■ {} {}</tspan>  "#, esc(s.class), esc(s.label), short(now));
    }
    let _ = write!(
        out,
        r#"<text class="label" x="{LEFT}" y="{}">{}</text></svg>"#,
        TOP + H + 25.0,
        legend.trim_end()
    );
    out
}

fn empty(title: &str) -> String {
    format!(r#"<p class="chart-empty">{}: waiting for samples…</p>"#, esc(title))
}

/// The smallest of 1, 2, 5 × 10ⁿ at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|c| *c >= v).unwrap_or(10.0 * mag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn draws_lines_on_rounded_axes_with_units_and_escapes_labels() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        let points =
            vec![(t0, 0.0), (t0 + Duration::from_secs(5), 80.0), (t0 + Duration::from_secs(10), 40.0)];
        let s = Series { label: "enqueued/s", class: "rate", axis: Axis::Right, points };
        let svg = render("q<1>", ("msgs", "msg/s"), &[s]);
        assert!(svg.starts_with("<svg") && svg.contains("<polyline"), "{svg}");
        // 80 × 1.25 = 100: the right axis runs to 100, the line's peak at 80 % of the height.
        assert!(svg.contains(">100</text>") && svg.contains(">50</text>"), "{svg}");
        assert!(svg.contains("40.0,108.0 190.0,44.0 340.0,76.0"), "{svg}");
        assert!(svg.contains("−10.0s") && svg.contains(">now<") && svg.contains("msg/s"), "{svg}");
        assert!(svg.contains("q&lt;1&gt;") && !svg.contains("q<1>"));
    }

    #[test]
    fn fewer_than_two_samples_over_time_draw_no_frame() {
        assert!(render("empty", ("", ""), &[]).contains("waiting for samples"));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        let one = Series { label: "lag", class: "lag", axis: Axis::Left, points: vec![(t0, 3.0)] };
        let out = render("one", ("msgs", "msg/s"), &[one]);
        assert!(out.contains("waiting for samples") && !out.contains("0ms"), "{out}");
    }

    #[test]
    fn ceilings_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(7.5), 10.0);
        assert_eq!(nice_ceiling(125.0), 200.0);
    }
}
