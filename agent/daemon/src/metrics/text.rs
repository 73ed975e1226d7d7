//! What the hand-written part of the exposition shares (the EBS statistics, which must match the
//! upstream collector's Go formatting sample for sample): the text format's header lines and
//! label escaping. The agent's own families go through the prometheus crate (`families`).

use std::fmt::Write as _;

pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label values escape backslash, double quote and newline (text format 0.0.4).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
