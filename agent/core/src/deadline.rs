//! A caller's deadline as gRPC over HTTP/2 spells it in the `grpc-timeout` header. Plain text
//! from the outside: parsed here, without the wire, so the parser is fuzzed without the daemon.

use std::time::Duration;

/// The gRPC spec's largest TimeoutValue: "a positive integer as ASCII string of at most 8 digits".
const MAX_TIMEOUT_DIGITS: usize = 8;

/// `TimeoutValue TimeoutUnit` as gRPC over HTTP/2 spells it (`100m`, `5S`, `1H`); anything else
/// (a sign, more than 8 digits, an unknown unit) is no deadline rather than a wrapped or
/// panicking multiplication: even 99999999H fits a `Duration`.
pub fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    let digits = raw.len().checked_sub(1)?;
    let (num, unit) = (raw.get(..digits)?, raw.get(digits..)?);
    if num.is_empty() || num.len() > MAX_TIMEOUT_DIGITS || !num.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    match unit {
        "H" => n.checked_mul(3600).map(Duration::from_secs),
        "M" => n.checked_mul(60).map(Duration::from_secs),
        "S" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_millis(n)),
        "u" => Some(Duration::from_micros(n)),
        "n" => Some(Duration::from_nanos(n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit() {
        let t = parse_grpc_timeout;
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("7u"), Some(Duration::from_micros(7)));
        assert_eq!(t("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(t("0S"), Some(Duration::ZERO));
    }

    #[test]
    fn eight_digits_at_most() {
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse_grpc_timeout("100000000m"), None);
    }

    /// Used to overflow `n * 3600` (a panic in debug builds, a wrapped deadline in release).
    #[test]
    fn huge_values_are_no_deadline_not_a_panic() {
        assert_eq!(parse_grpc_timeout("18446744073709551615H"), None);
        assert_eq!(parse_grpc_timeout("5124095576030432M"), None);
        assert_eq!(parse_grpc_timeout("99999999999999999999S"), None);
    }

    #[test]
    fn malformed() {
        for raw in [
            "", "S", "5", "+5S", "-5S", " 5S", "5 S", "5s", "5SS", "0x5S", "5é", "é",
        ] {
            assert_eq!(parse_grpc_timeout(raw), None, "{raw:?}");
        }
    }
}
