//! Validation of everything a request carries: names, sequences, times, limits. Each check
//! answers a [`Failure`] with a message an operator can act on; handlers validate every input
//! before they change anything, so a bad request changes nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::failure::Failure;

/// The most messages or dead letters a page lists at once.
pub(crate) const MAX_LIST: usize = 500;

/// A queue or group name: the library's rule (`[A-Za-z0-9._-]`, 1 to `MAX_NAME_LEN` bytes),
/// checked here too so that the error page names the field.
pub(crate) fn name<'a>(what: &str, s: &'a str) -> Result<&'a str, Failure> {
    let ok = !s.is_empty()
        && s.len() <= crate::name::MAX_NAME_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(s)
    } else {
        Err(Failure::bad_request(format!(
            "{what} name {:?} is invalid: use 1 to {} characters from A-Z, a-z, 0-9, '.', '_' and '-'",
            clip(s),
            crate::name::MAX_NAME_LEN
        )))
    }
}

/// A sequence number (decimal, no sign).
pub(crate) fn seq(what: &str, s: &str) -> Result<u64, Failure> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Failure::bad_request(format!("{what} {:?} is not a sequence number", clip(s))));
    }
    t.parse().map_err(|_| Failure::bad_request(format!("{what} {:?} is too large", clip(s))))
}

/// An optional positive count, at most `max`; empty means `None`.
pub(crate) fn limit(what: &str, s: Option<&str>, max: u64) -> Result<Option<u64>, Failure> {
    match s.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(t) => {
            let n = seq(what, t)?;
            if n == 0 || n > max {
                return Err(Failure::bad_request(format!("{what} must be between 1 and {max}, not {n}")));
            }
            Ok(Some(n))
        }
    }
}

/// A point in time: RFC 3339 (`2026-11-25T01:00:00Z`, any offset), Unix seconds, or a
/// duration ago (`90s`, `15m`, `2h`, `1d`). Times in the future are refused (a reset there
/// would skip everything, which `latest` says more plainly).
pub(crate) fn time(s: &str, now: SystemTime) -> Result<SystemTime, Failure> {
    let t = s.trim();
    let bad = || {
        Failure::bad_request(format!(
            "time {:?} is not understood: give an RFC 3339 time (2026-11-25T01:00:00Z), Unix seconds, \
             or a duration ago (90s, 15m, 2h, 1d)",
            clip(s)
        ))
    };
    let at = if t.is_empty() {
        return Err(bad());
    } else if t.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = t.parse().map_err(|_| bad())?;
        UNIX_EPOCH.checked_add(Duration::from_secs(secs)).ok_or_else(bad)?
    } else if let Some(ago) = duration(t) {
        now.checked_sub(ago).ok_or_else(bad)?
    } else {
        let dt = chrono::DateTime::parse_from_rfc3339(t).map_err(|_| bad())?;
        let micros = u64::try_from(dt.timestamp_micros()).map_err(|_| bad())?;
        UNIX_EPOCH + Duration::from_micros(micros)
    };
    if at > now {
        return Err(Failure::bad_request(format!("time {:?} is in the future", clip(s))));
    }
    Ok(at)
}

/// `90s`, `15m`, `2h`, `1d`.
fn duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    Some(Duration::from_secs(n.checked_mul(mult)?))
}

/// At most 80 characters of an input, for an error message.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sequences_and_times_are_checked() {
        assert!(name("queue", "orders.dlq").is_ok());
        assert!(name("queue", "").is_err() && name("queue", "a b").is_err() && name("queue", "<x>").is_err());
        assert_eq!(seq("sequence", " 42 ").ok(), Some(42));
        assert!(seq("sequence", "-1").is_err() && seq("sequence", "99999999999999999999999").is_err());
        assert_eq!(limit("limit", Some(""), 10).ok(), Some(None));
        assert!(limit("limit", Some("0"), 10).is_err() && limit("limit", Some("11"), 10).is_err());
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(time("1700000000", now).ok(), Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        assert_eq!(time("15m", now).ok(), Some(now - Duration::from_secs(900)));
        assert_eq!(
            time("2023-11-14T22:13:20Z", now).ok(),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert!(time("yesterday", now).is_err() && time("1900000000", now).is_err());
        assert!(time("1969-01-01T00:00:00Z", now).is_err());
    }
}
