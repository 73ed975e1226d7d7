//! Times for people: ISO-8601 in UTC plus how long ago, from the journal's Unix milliseconds.

/// `2026-11-22T10:15:03Z` (UTC, to the second).
pub fn iso8601(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// "just now", "42 s ago", "3 min ago", "5 h ago", "2 days ago"; "in 3 min" for a time ahead of
/// this host's clock (another host's clock, or a clock set back).
pub fn relative(unix_ms: u64, now_ms: u64) -> String {
    let (delta, ahead) = if now_ms >= unix_ms {
        ((now_ms - unix_ms) / 1000, false)
    } else {
        ((unix_ms - now_ms) / 1000, true)
    };
    let span = match delta {
        0..10 => return "just now".to_string(),
        10..120 => format!("{delta} s"),
        120..7200 => format!("{} min", delta / 60),
        7200..172_800 => format!("{} h", delta / 3600),
        _ => format!("{} days", delta / 86_400),
    };
    if ahead {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// Both: `2026-11-22T10:15:03Z (3 min ago)`.
pub fn when(unix_ms: u64, now_ms: u64) -> String {
    format!("{} ({})", iso8601(unix_ms), relative(unix_ms, now_ms))
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's civil_from_days).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day in a century leap year) 12:34:56.789
        assert_eq!(iso8601(951_827_696_789), "2000-02-29T12:34:56Z");
        assert_eq!(iso8601(1_795_455_739_570), "2026-11-23T17:42:19Z");
    }

    #[test]
    fn relative_times() {
        let now = 1_000_000_000;
        assert_eq!(relative(now - 3_000, now), "just now");
        assert_eq!(relative(now - 42_000, now), "42 s ago");
        assert_eq!(relative(now - 180_000, now), "3 min ago");
        assert_eq!(relative(now - 5 * 3_600_000, now), "5 h ago");
        assert_eq!(relative(now - 3 * 86_400_000, now), "3 days ago");
        assert_eq!(relative(now + 180_000, now), "in 3 min");
    }
}
