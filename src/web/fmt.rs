//! Figures as an operator reads them: human bytes, relative times beside UTC, rates. Each
//! keeps the exact value in a `title` (and `data-value` for tests and scripts), so rounding
//! for the eye never hides the number.

use std::time::SystemTime;

use super::html::{esc, time};

/// `512 B`, `1.5 KiB`, `20.0 MiB`, with the exact count in the title.
pub(crate) fn bytes(n: u64) -> String {
    format!(r#"<span class="num" title="{n} bytes" data-value="{n}">{}</span>"#, human_bytes(n))
}

/// `512 B`, `1.5 KiB`, `20.0 MiB`, `3.2 GiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v < 10.0 { format!("{v:.1} {unit}") } else { format!("{v:.0} {unit}") }
}

/// `just now`, `3 min ago`, `in 59 min`, `2 h ago`, `in 3 d`: how far `t` is from `now`.
pub(crate) fn relative(t: SystemTime, now: SystemTime) -> String {
    let (d, future) = match t.duration_since(now) {
        Ok(d) => (d, true),
        Err(e) => (e.duration(), false),
    };
    let s = d.as_secs();
    let amount = match s {
        0 => return "just now".into(),
        1..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86400),
    };
    if future { format!("in {amount}") } else { format!("{amount} ago") }
}

/// A time as `3 min ago` with its UTC form beside it (what operators paste into forms).
pub(crate) fn when(t: SystemTime, now: SystemTime) -> String {
    let utc = time(t);
    format!(
        r#"<time datetime="{utc}" title="{utc}">{}</time> <small class="utc">{utc}</small>"#,
        esc(&relative(t, now))
    )
}

/// [`when`], or `-`.
pub(crate) fn opt_when(t: Option<SystemTime>, now: SystemTime) -> String {
    t.map_or_else(|| "-".into(), |t| when(t, now))
}

/// A rate per second with few digits (`0`, `0.4`, `12`, `1.2k`, `340k`), or `-` when unknown.
pub(crate) fn rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(v) => {
            format!(r#"<span class="num" data-value="{v:.3}" title="{v:.3} per second">{}</span>"#, short(v))
        }
    }
}

/// `0`, `0.4`, `12`, `1.2k`, `340k`, `2.1M`.
pub(crate) fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bytes_read_as_binary_units_with_the_exact_count_kept() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(20 << 20), "20 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert!(bytes(1536).contains(r#"data-value="1536""#));
    }

    #[test]
    fn times_read_relative_to_now_both_ways() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(relative(now, now), "just now");
        assert_eq!(relative(now - Duration::from_secs(180), now), "3 min ago");
        assert_eq!(relative(now + Duration::from_secs(59 * 60 + 30), now), "in 59 min");
        assert_eq!(relative(now - Duration::from_secs(7200), now), "2 h ago");
        assert_eq!(relative(now + Duration::from_secs(3 * 86400), now), "in 3 d");
        let w = when(now - Duration::from_secs(5), now);
        assert!(w.contains("5 s ago") && w.contains("2027-01-15T07:59:55.000Z"), "{w}");
    }

    #[test]
    fn rates_keep_few_digits() {
        assert_eq!(short(0.0), "0");
        assert_eq!(short(0.44), "0.4");
        assert_eq!(short(12.3), "12");
        assert_eq!(short(1234.0), "1.2k");
        assert_eq!(short(340_000.0), "340k");
        assert_eq!(rate(None), "-");
    }
}
