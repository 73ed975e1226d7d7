//! `ebs-node-agent doctor`: can this host run the agent? One line per check, each with the fix,
//! and a non-zero exit when something the chosen backend and mode need is missing. It changes
//! nothing on the host (it only asks: capabilities, files, syscalls, the mount table, IMDS).

mod checks;
mod host_paths;
mod syscalls;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::endpoint::Endpoint;
use crate::settings::{BackendKind, DEFAULT_STATE_DIR, Mode};
use ebs_node_core::config::{DEFAULT_ENDPOINT, parse_duration};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The backend the agent will run with (the checks it needs differ).
    #[arg(long, env = "EBS_AGENT_BACKEND", value_enum, default_value = "ebs")]
    pub backend: BackendKind,
    /// The mode the agent will run in: node work needs mount(2) and the filesystem tools.
    #[arg(long, env = "EBS_AGENT_MODE", value_enum, default_value = "all")]
    pub mode: Mode,
    /// The CSI socket the agent will create (its directory must be writable).
    #[arg(long, env = "CSI_ENDPOINT", default_value = DEFAULT_ENDPOINT, value_parser = Endpoint::parse_arg)]
    pub endpoint: Endpoint,
    /// The agent's state directory (must be writable).
    #[arg(long, env = "EBS_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// kubelet's root directory: mounts below it must propagate to kubelet (shared).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// ebs: instance metadata, http://host[:port].
    #[arg(long, env = "EBS_AGENT_IMDS_ENDPOINT", default_value = ebs_node_backends::nodeinfo::imds::DEFAULT_ENDPOINT)]
    pub imds_endpoint: String,
    /// ebs: how long the instance-metadata check waits for an answer.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub imds_timeout: Duration,
    /// ebs: skip the instance-metadata check (not on EC2, or IMDS off by design).
    #[arg(long, env = "EBS_AGENT_IMDS_DISABLED")]
    pub skip_imds: bool,
}

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Missing, and the chosen backend and mode need it: the exit code says so.
    Missing,
    /// Missing, but only a feature or a speed-up depends on it.
    Warning,
    /// Not relevant here (another backend, no kubelet, --skip-imds).
    Skipped,
}

pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
    /// What to do about it; empty when nothing is to be done.
    pub fix: String,
}

impl Check {
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Check {
            name,
            outcome: Outcome::Ok,
            detail: detail.into(),
            fix: String::new(),
        }
    }

    /// A failed check: `Missing` when `needed`, else a `Warning`.
    pub fn lacking(
        name: &'static str,
        needed: bool,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Check {
            name,
            outcome: if needed {
                Outcome::Missing
            } else {
                Outcome::Warning
            },
            detail: detail.into(),
            fix: fix.into(),
        }
    }

    pub fn skipped(name: &'static str, why: impl Into<String>) -> Self {
        Check {
            name,
            outcome: Outcome::Skipped,
            detail: why.into(),
            fix: String::new(),
        }
    }
}

/// One line per check, aligned: `ok`, `MISSING`, `warning` or `skipped`, the check, what was
/// found, and the fix.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for c in checks {
        let mark = match c.outcome {
            Outcome::Ok => "ok",
            Outcome::Missing => "MISSING",
            Outcome::Warning => "warning",
            Outcome::Skipped => "skipped",
        };
        out.push_str(&format!("{mark:<9}{:<width$}{}", c.name, c.detail));
        if !c.fix.is_empty() {
            out.push_str(&format!(". Fix: {}", c.fix));
        }
        out.push('\n');
    }
    out
}

/// 1 when a needed check is missing, else 0.
pub fn exit_code(checks: &[Check]) -> i32 {
    i32::from(checks.iter().any(|c| c.outcome == Outcome::Missing))
}

pub async fn run(args: DoctorArgs) -> i32 {
    let checks = checks::all(&args).await;
    print!("{}", render(&checks));
    let missing = checks
        .iter()
        .filter(|c| c.outcome == Outcome::Missing)
        .count();
    let warnings = checks
        .iter()
        .filter(|c| c.outcome == Outcome::Warning)
        .count();
    let what = format!(
        "--backend {} --mode {}",
        args.backend.name(),
        args.mode.name()
    );
    if missing == 0 {
        println!("ready for {what} ({warnings} warning(s): features that will be off)");
    } else {
        println!("NOT ready for {what}: {missing} needed check(s) failed");
    }
    exit_code(&checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_needed_check_fails_the_run() {
        let mut checks = vec![
            Check::ok("CAP_SYS_ADMIN", "in the effective set"),
            Check::lacking(
                "CAP_SYS_RESOURCE",
                false,
                "not in the effective set",
                "grant it",
            ),
            Check::skipped("udev", "loop backend"),
        ];
        assert_eq!(exit_code(&checks), 0);
        let text = render(&checks);
        assert!(
            text.contains("warning  CAP_SYS_RESOURCE  not in the effective set. Fix: grant it\n"),
            "{text}"
        );
        assert!(text.starts_with("ok       CAP_SYS_ADMIN     in the effective set\n"));
        checks.push(Check::lacking("mkfs.ext4", true, "not found", "install"));
        assert_eq!(exit_code(&checks), 1);
        assert!(render(&checks).contains("MISSING  mkfs.ext4"));
    }
}
