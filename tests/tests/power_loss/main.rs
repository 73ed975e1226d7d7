//! Power loss at every flush point (issue 22). A QEMU guest runs the volume lifecycle with the
//! agent's state directory, and the volume itself, on a dm-log-writes device; the host rebuilds
//! that disk as of every FLUSH/FUA entry and every mark of the log, and for each: mounts the
//! state filesystem, reads `status`, starts the agent against the volume as the cut left it and
//! drives the workload to its end. Once with ext4 under the state directory (and on the volume),
//! once with xfs. See docs/power-loss.md.
//!
//! Besides those flush points, the run replays write prefixes: the disk right after a write
//! that no flush covered yet. POWERLOSS_POINTS: `all` (the default) or the most flush points per
//! filesystem (marks and the stage that runs mkfs always, the rest evenly spaced);
//! POWERLOSS_PREFIXES: `all` or how many write prefixes (default 24, evenly spaced). Root only;
//! skipped where QEMU is missing, except under CI=true.

mod check;
mod converge;
mod host;
mod points;
mod record;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ebs_tests::log_writes::Log;

use check::{Checked, Run};
use converge::StageOutcome;
use record::{Fs, Recorded, Recording};

/// `all`, or a number, from `var`; `default` when unset.
fn budget(var: &str, default: Option<usize>) -> Option<usize> {
    match std::env::var(var).as_deref() {
        Err(_) => default,
        Ok("all") => None,
        Ok(n) => Some(
            n.parse()
                .unwrap_or_else(|_| panic!("{var}: `all` or a number")),
        ),
    }
}

/// Write prefixes replayed per filesystem in the suite; POWERLOSS_PREFIXES=all replays them all.
const PREFIXES_IN_SUITE: usize = 24;

struct Report {
    fs: Fs,
    flush_total: usize,
    prefix_total: usize,
    checked: Vec<Checked>,
    took: Duration,
    recorded_in: Duration,
}

impl Report {
    fn failures(&self) -> Vec<String> {
        self.checked
            .iter()
            .filter(|c| !c.problems.is_empty())
            .map(|c| {
                format!(
                    "{} entry {} ({}): {}",
                    self.fs.name(),
                    c.point.index,
                    c.point.what,
                    c.problems.join("; ")
                )
            })
            .collect()
    }

    fn line(&self) -> String {
        let mut by: BTreeMap<StageOutcome, usize> = BTreeMap::new();
        let mut mkfs: BTreeMap<StageOutcome, usize> = BTreeMap::new();
        for c in &self.checked {
            let o = c.stage.unwrap_or(StageOutcome::Failed);
            *by.entry(o).or_default() += 1;
            if matches!(c.durable, check::Durable::Intent(_)) {
                *mkfs.entry(o).or_default() += 1;
            }
        }
        let n = |m: &BTreeMap<StageOutcome, usize>, o| m.get(&o).copied().unwrap_or(0);
        let converged = self
            .checked
            .iter()
            .filter(|c| c.problems.is_empty())
            .count();
        let prefixes = self.checked.iter().filter(|c| is_prefix(&c.point)).count();
        format!(
            "{}: {} of {} flush points (FLUSH/FUA entries and marks) and {} of {} write prefixes \
             replayed, {} of {} converged; first stage after the cut: {} already \
             complete, {} finished our mkfs, {} refused, {} formatted fresh; inside mkfs (intent \
             durable, done not): {} points, {} finished our mkfs, {} refused, {} already complete; \
             guest {:.1} s, replays {:.1} s",
            self.fs.name(),
            self.checked.len() - prefixes,
            self.flush_total,
            prefixes,
            self.prefix_total,
            converged,
            self.checked.len(),
            n(&by, StageOutcome::AlreadyComplete),
            n(&by, StageOutcome::FinishedOurMkfs),
            n(&by, StageOutcome::Refused),
            n(&by, StageOutcome::FormattedFresh),
            mkfs.values().sum::<usize>(),
            n(&mkfs, StageOutcome::FinishedOurMkfs),
            n(&mkfs, StageOutcome::Refused),
            n(&mkfs, StageOutcome::AlreadyComplete),
            self.recorded_in.as_secs_f64(),
            self.took.as_secs_f64(),
        )
    }
}

fn is_prefix(p: &points::Point) -> bool {
    p.what == "write" || p.what == "discard"
}

fn replay_all(rec: &Recording) -> Result<Report, String> {
    let started = Instant::now();
    let log = Log::open(&rec.log).map_err(|e| format!("{}: {e}", rec.log.display()))?;
    let timeline = points::Timeline::of(&log);
    let all = points::all(&log)?;
    let prefixes = points::prefixes(&log);
    let mut chosen = points::sample(&all, &log, budget("POWERLOSS_POINTS", None));
    chosen.extend(points::spread(
        &prefixes,
        budget("POWERLOSS_PREFIXES", Some(PREFIXES_IN_SUITE)),
    ));
    chosen.sort_by_key(|p| p.index);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let run = Run {
        rec,
        log: &log,
        timeline: &timeline,
    };
    let mut checked = Vec::new();
    for p in &chosen {
        let c = runtime.block_on(run.check(p));
        println!(
            "power-loss {} entry {:>4} {:<16} after {:<12} format {:<10} stage {:?}{}",
            rec.fs.name(),
            p.index,
            p.what,
            timeline.last_call(p.index),
            match &c.durable {
                check::Durable::Nothing => "none",
                check::Durable::Intent(_) => "intent",
                check::Durable::Done(_) => "done",
            },
            c.stage,
            if c.problems.is_empty() {
                c.refusal
                    .as_ref()
                    .map(|r| format!(": {}", r.chars().take(160).collect::<String>()))
                    .unwrap_or_default()
            } else {
                format!(" PROBLEMS: {}", c.problems.join("; "))
            }
        );
        checked.push(c);
    }
    Ok(Report {
        fs: rec.fs,
        flush_total: all.len(),
        prefix_total: prefixes.len(),
        checked,
        took: started.elapsed(),
        recorded_in: rec.took,
    })
}

#[test]
fn power_loss_at_every_flush_point() {
    if !ebs_tests::require_root("power_loss_at_every_flush_point") {
        return;
    }
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let started = Instant::now();
    // Both guests at once (two cores), then each filesystem's replays on its own thread.
    let reports: Vec<Result<Option<Report>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = [Fs::Ext4, Fs::Xfs]
            .map(|fs| {
                s.spawn(move || match record::record(fs)? {
                    Recorded::Missing(why) => {
                        assert!(!ci, "a prerequisite is missing under CI=true: {why}");
                        ebs_tests::skip("power_loss_at_every_flush_point", &why);
                        Ok(None)
                    }
                    Recorded::Done(rec) => replay_all(&rec).map(Some),
                })
            })
            .into_iter()
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect()
    });
    let mut failures = Vec::new();
    let mut lines = Vec::new();
    for r in reports {
        match r {
            Ok(Some(report)) => {
                failures.extend(report.failures());
                lines.push(report.line());
            }
            Ok(None) => return,
            Err(e) => failures.push(e),
        }
    }
    println!(
        "power-loss figure: {}; whole test {:.1} s",
        lines.join(" | "),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
