//! Hooks for the test suite and the bench, compiled only with the cargo feature `test-hooks`:
//! `--crash-after op.step.phase` (the crash matrix: SIGKILL right after a journal record is
//! committed) and `--bench-lazy-journal` (every journal commit without fsync, to measure the
//! journal's share). Either one in a production agent would remove its crash safety, so a
//! release build has neither the flags (not in `--help`, the man pages or the completions; given
//! anyway, they are an error) nor their environment variables nor the code behind them.
//!
//! Both builds expose the same names, so the rest of the agent never mentions the feature:
//! `HookArgs` (flattened into `serve`'s flags; empty without the feature), `CrashPoint` (a
//! zero-sized no-op without it) and `apply`.

#[cfg(feature = "test-hooks")]
mod hooks {
    use std::str::FromStr;

    use ebs_node_core::records::Phase;
    use ebs_node_core::steps::{Op, Step};

    /// The hidden flags of test and bench builds.
    #[derive(clap::Args, Debug, Clone, Default)]
    pub struct HookArgs {
        /// Test builds only: abort right after a journal record `op.step.phase` is committed.
        #[arg(long, env = "EBS_AGENT_CRASH_AFTER", hide = true)]
        pub crash_after: Option<CrashAt>,
        /// Bench only: commit the journal without fsync, to measure the journal's share. Gives
        /// up crash safety.
        #[arg(long, env = "EBS_AGENT_BENCH_LAZY_JOURNAL", hide = true)]
        pub bench_lazy_journal: bool,
    }

    /// A crash point, `op.step.phase`: an operation and a step the journal writes (the core's
    /// names, which the crash matrix builds its points from), and a phase. A name the journal
    /// never writes (a typo, a renamed step) is refused when the flag is parsed; a pair of names
    /// that never meet (`publish.format.intent`) is not, and the crash tests see that no crash
    /// came.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct CrashAt {
        op: Op,
        step: Step,
        phase: Phase,
    }

    impl FromStr for CrashAt {
        type Err = String;

        fn from_str(raw: &str) -> Result<Self, String> {
            let mut parts = raw.split('.');
            let (Some(op), Some(step), Some(phase), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("{raw:?} is not op.step.phase"));
            };
            let phase = match phase {
                "intent" => Phase::Intent,
                "done" => Phase::Done,
                "failed" => Phase::Failed,
                other => return Err(format!("unknown phase {other:?}")),
            };
            Ok(CrashAt {
                op: op.parse()?,
                step: step.parse()?,
                phase,
            })
        }
    }

    /// Where the crash matrix kills the agent, if anywhere.
    #[derive(Debug, Clone, Default)]
    pub struct CrashPoint(Option<CrashAt>);

    impl CrashPoint {
        pub fn from_args(args: &HookArgs) -> Self {
            CrashPoint(args.crash_after)
        }

        /// Dies as SIGKILL would when `op.step.phase` is the crash point.
        pub fn reached(&self, op: Op, step: Step, phase: Phase) {
            if self.0 == Some(CrashAt { op, step, phase }) {
                tracing::error!(
                    op = op.name(),
                    step = step.name(),
                    ?phase,
                    "fault injection: killing the agent"
                );
                // Nothing is flushed first: lazily committed lines are lost exactly as in a
                // real crash, so the tests prove that resume never depends on them.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
        }
    }

    /// Applies the process-wide hooks at start.
    pub fn apply(args: &HookArgs) {
        if args.bench_lazy_journal {
            tracing::warn!("--bench-lazy-journal: commits are not fsynced; crash safety is off");
            ebs_store::bench_make_all_commits_lazy();
        }
    }
}

#[cfg(not(feature = "test-hooks"))]
mod hooks {
    use ebs_node_core::records::Phase;
    use ebs_node_core::steps::{Op, Step};

    /// No flags: a release build neither lists nor accepts the test hooks.
    #[derive(clap::Args, Debug, Clone, Default)]
    pub struct HookArgs {}

    /// No crash point: a release build never kills itself.
    #[derive(Debug, Clone, Default)]
    pub struct CrashPoint;

    impl CrashPoint {
        pub fn from_args(_: &HookArgs) -> Self {
            CrashPoint
        }

        #[inline(always)]
        pub fn reached(&self, _op: Op, _step: Step, _phase: Phase) {}
    }

    pub fn apply(_: &HookArgs) {}
}

pub use hooks::{CrashPoint, HookArgs, apply};

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `serve`'s flags as a command of their own (the man page and completions render these).
    #[derive(clap::Parser, Debug)]
    struct Serve {
        #[command(flatten)]
        args: crate::cli::ServeArgs,
    }

    fn parse(extra: &[&str]) -> Result<Serve, clap::Error> {
        use clap::Parser;
        let argv = ["serve", "--backend", "loop"].iter().chain(extra);
        Serve::try_parse_from(argv)
    }

    /// What `serve --help` and the man page list: hidden flags included, so that a hook cannot
    /// hide in a release build either.
    fn every_listed_flag() -> Vec<String> {
        let cmd = Serve::command();
        cmd.get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    }

    #[cfg(not(feature = "test-hooks"))]
    #[test]
    fn a_release_build_neither_lists_nor_accepts_the_hooks() {
        let listed = every_listed_flag();
        assert!(listed.iter().any(|f| f == "state-dir"), "{listed:?}");
        for hook in ["crash-after", "bench-lazy-journal"] {
            assert!(!listed.iter().any(|f| f == hook), "{hook} in {listed:?}");
        }
        let e = parse(&["--crash-after", "stage.format.intent"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
        let e = parse(&["--bench-lazy-journal"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
        let help = Serve::command().render_long_help().to_string();
        assert!(!help.contains("crash") && !help.contains("lazy"), "{help}");
        // Nothing is left to honour an environment variable either.
        assert_eq!(std::mem::size_of::<super::CrashPoint>(), 0);
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_test_build_takes_the_hooks_hidden() {
        let listed = every_listed_flag();
        assert!(listed.iter().any(|f| f == "crash-after"), "{listed:?}");
        let s = parse(&[
            "--crash-after",
            "stage.format.intent",
            "--bench-lazy-journal",
        ])
        .unwrap();
        assert_eq!(
            s.args.test_hooks.crash_after,
            Some("stage.format.intent".parse().unwrap())
        );
        assert!(s.args.test_hooks.bench_lazy_journal);
        // A point the journal never writes is refused at start, not waited for.
        for bad in [
            "stage.mkfs.intent",
            "stage.format.begun",
            "staging.format.intent",
            "stage.format",
            "stage.format.intent.x",
        ] {
            let e = parse(&["--crash-after", bad]).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad}: {e}"
            );
        }
        let help = Serve::command().render_long_help().to_string();
        assert!(!help.contains("crash-after"), "{help}");
    }
}
