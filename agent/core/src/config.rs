//! The small vocabulary the daemon and its client share: where the socket is by default, how a
//! `unix:` endpoint names its path, and how a duration is written on the command line.

use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "unix:///run/ebs-node-agent/csi.sock";

/// The socket path of a `unix:` endpoint: `unix:///abs/path` (the CSI spec's form) or
/// `unix:/abs/path` (one slash, as the upstream EBS chart sets CSI_ENDPOINT). `None` for anything
/// else, `unix://relative` included (Go reads its first part as a host name).
pub fn unix_socket_path(raw: &str) -> Option<&str> {
    let rest = raw.strip_prefix("unix:")?;
    let path = rest.strip_prefix("//").unwrap_or(rest);
    path.starts_with('/').then_some(path)
}

/// A duration flag's value that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDuration {
    #[error("invalid duration {0:?}")]
    NotANumber(String),
    #[error("invalid duration {0:?}: too long")]
    TooLong(String),
    #[error("invalid duration {0:?}: use ms, s or m")]
    Unit(String),
}

/// Durations such as `30s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, BadDuration> {
    let raw = raw.trim();
    let (num, unit) = raw
        .find(|c: char| !c.is_ascii_digit())
        .map_or((raw, "s"), |i| raw.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| BadDuration::NotANumber(raw.into()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| BadDuration::TooLong(raw.into())),
        _ => Err(BadDuration::Unit(raw.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("18446744073709551615m").is_err());
    }
}
