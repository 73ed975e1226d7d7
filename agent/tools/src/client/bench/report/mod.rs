//! The bench's report: a table for people, JSON for scripts, each agent figure beside the floor's
//! and the targets from the issue with the measured figure and a verdict.

use std::fmt::Write as _;

use serde_json::{Value, json};

mod grpc;
mod json;

use super::BenchArgs;
use super::cpu::CpuSpent;
use super::cycle::CycleResult;
use super::floor::FloorResult;
use super::restart::RestartReport;
use super::round::Measured;
use super::stats::{Series, ms, round};

#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryReport {
    pub idle_kib: u64,
    /// The largest VmRSS sampled during the measured cycle.
    pub peak_kib: u64,
    /// VmHWM after the cycle: the kernel's high-water mark since the agent started.
    pub hwm_kib: u64,
    pub after_kib: u64,
    /// The same, RssAnon only: the agent's own memory, without the binary's file pages.
    pub idle_anon_kib: u64,
    pub peak_anon_kib: u64,
    pub after_anon_kib: u64,
}

/// CPU spent during the measured cycles and during the floor runs (see `cpu`).
#[derive(Debug, Default)]
pub struct CpuReport {
    /// Volume cycles measured, over all rounds.
    pub cycles: usize,
    /// The agent's threads, and its tools (mkfs, fsck), during the cycles.
    pub agent: Option<CpuSpent>,
    /// This bench process during the cycles: gRPC client, Probe loop, RSS sampler.
    pub client: Option<CpuSpent>,
    /// This process during the floor runs: the floor's threads, and its tools.
    pub floor: Option<CpuSpent>,
}

impl CpuReport {
    fn per_cycle_ms(&self, d: std::time::Duration) -> f64 {
        ms(d) / self.cycles.max(1) as f64
    }
}

pub struct Report {
    pub endpoint: String,
    pub config: Value,
    pub with_stats: bool,
    pub warmup: Series,
    pub agent: CycleResult,
    pub floor: Option<FloorResult>,
    pub grpc_floor: Option<Measured>,
    pub probe: Series,
    pub memory: Option<MemoryReport>,
    pub cpu: CpuReport,
    pub restart: Option<RestartReport>,
    pub notes: Vec<String>,
    pub cleanup_problems: Vec<String>,
}

struct Row<'a> {
    rpc: &'static str,
    agent: &'a Series,
    floor: Option<(&'static str, &'a Series)>,
}

pub struct Target {
    pub name: &'static str,
    pub limit: String,
    pub measured: Option<String>,
    pub pass: Option<bool>,
}

impl Report {
    pub fn new(b: &BenchArgs, with_stats: bool) -> Report {
        let mut notes = Vec::new();
        if !with_stats {
            notes.push(
                "NodeGetVolumeStats skipped: the node does not advertise GET_VOLUME_STATS".into(),
            );
        }
        Report {
            endpoint: String::new(),
            config: json!({
                "volumes": b.volumes,
                "rounds": b.rounds,
                "concurrency": b.concurrency,
                "size_bytes": b.size,
                "fs_type": b.fs_type,
                "work_dir": b.work_dir,
                "probe_interval_ms": b.probe_interval.as_millis() as u64,
                "host_mounts": b.host_mounts,
                "floor_checks": b.floor_checks,
            }),
            with_stats,
            warmup: Series::default(),
            agent: CycleResult::default(),
            floor: None,
            grpc_floor: None,
            probe: Series::default(),
            memory: None,
            cpu: CpuReport::default(),
            restart: None,
            notes,
            cleanup_problems: Vec::new(),
        }
    }

    /// No call failed and nothing was left behind.
    pub fn clean(&self) -> bool {
        self.agent.errors() == 0
            && self.floor.as_ref().is_none_or(|f| f.errors() == 0)
            && self
                .grpc_floor
                .as_ref()
                .is_none_or(|g| g.cycle.errors() == 0)
            && self.cleanup_problems.is_empty()
            && self
                .restart
                .as_ref()
                .is_none_or(|r| r.cleanup_problems.is_empty())
    }

    fn rows(&self) -> Vec<Row<'_>> {
        let f = self.floor.as_ref();
        let mut rows = vec![
            Row {
                rpc: "NodeStageVolume",
                agent: &self.agent.stage,
                floor: f.map(|f| ("probe+e2fsck+mount", &f.stage)),
            },
            Row {
                rpc: "NodePublishVolume",
                agent: &self.agent.publish,
                floor: f.map(|f| ("mkdir+bind", &f.publish)),
            },
        ];
        if self.with_stats {
            rows.push(Row {
                rpc: "NodeGetVolumeStats",
                agent: &self.agent.stats,
                floor: f.map(|f| ("statvfs", &f.stats)),
            });
        }
        rows.push(Row {
            rpc: "NodeUnpublishVolume",
            agent: &self.agent.unpublish,
            floor: f.map(|f| ("umount+rmdir", &f.unpublish)),
        });
        rows.push(Row {
            rpc: "NodeUnstageVolume",
            agent: &self.agent.unstage,
            floor: f.map(|f| ("umount", &f.unstage)),
        });
        rows
    }

    pub fn targets(&self) -> Vec<Target> {
        let a = |s: &Series| s.summary();
        let floor = self.floor.as_ref();
        let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::INFINITY };
        let mut t = Vec::new();
        let stage = floor.map(|f| (a(&self.agent.stage).p50, a(&f.stage).p50));
        t.push(Target {
            name: "stage p50 (formatted volume)",
            limit: "<= 1.10 x floor".into(),
            measured: stage
                .map(|(x, y)| format!("{x:.2} ms = {:.2} x floor ({y:.2} ms)", ratio(x, y))),
            pass: stage.map(|(x, y)| x <= 1.10 * y),
        });
        let publish = floor.map(|f| (a(&self.agent.publish).p50, a(&f.publish).p50));
        t.push(Target {
            name: "publish p50",
            limit: "<= floor + 1 ms".into(),
            measured: publish
                .map(|(x, y)| format!("{x:.2} ms = floor ({y:.2} ms) + {:.2} ms", x - y)),
            pass: publish.map(|(x, y)| x <= y + 1.0),
        });
        t.push(Target {
            name: "cycle errors",
            limit: "0".into(),
            measured: Some(self.agent.errors().to_string()),
            pass: Some(self.agent.errors() == 0),
        });
        let wall = floor.map(|f| (ms(self.agent.wall), ms(f.wall)));
        t.push(Target {
            name: "cycle wall time",
            limit: "<= 1.25 x floor".into(),
            measured: wall
                .map(|(x, y)| format!("{x:.0} ms = {:.2} x floor ({y:.0} ms)", ratio(x, y))),
            pass: wall.map(|(x, y)| x <= 1.25 * y),
        });
        let p = a(&self.probe);
        t.push(Target {
            name: "Probe p99 under load",
            limit: "<= 5 ms".into(),
            // Under 100 calls the nearest-rank p99 is the slowest call: one scheduling hiccup
            // decides it, so the count and p95 are shown with it.
            measured: (p.count > 0).then(|| {
                let slowest = if p.count < 100 {
                    ": p99 is the slowest"
                } else {
                    ""
                };
                format!(
                    "{:.2} ms (p95 {:.2}, p50 {:.2} ms; {} calls{slowest}; {} errors)",
                    p.p99, p.p95, p.p50, p.count, p.errors
                )
            }),
            pass: (p.count > 0).then_some(p.p99 <= 5.0 && p.errors == 0),
        });
        let mem = self.memory;
        t.push(Target {
            name: "idle RSS",
            limit: "<= 12 MiB".into(),
            measured: mem.map(|m| mib(m.idle_kib)),
            pass: mem.map(|m| m.idle_kib <= 12 * 1024),
        });
        t.push(Target {
            name: "peak RSS during the cycle",
            limit: "<= 40 MiB".into(),
            measured: mem.map(|m| format!("{} (VmHWM {})", mib(m.peak_kib), mib(m.hwm_kib))),
            pass: mem.map(|m| m.peak_kib.max(m.hwm_kib) <= 40 * 1024),
        });
        let r = self.restart.as_ref();
        t.push(Target {
            name: "restart to ready",
            limit: "<= 300 ms".into(),
            measured: r.map(|r| {
                format!(
                    "{:.0} ms with {} volumes (rounds: {})",
                    r.median_ms(),
                    r.volumes,
                    r.rounds_ms
                        .iter()
                        .map(|x| format!("{x:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }),
            pass: r.map(|r| r.median_ms() <= 300.0),
        });
        t
    }

    pub fn to_table(&self) -> String {
        let mut o = String::new();
        let wall = self.agent.wall;
        let _ = writeln!(o, "bench: {}", self.config);
        let _ = writeln!(
            o,
            "{:<22} {:>5} {:>4} {:>8} {:>8} {:>8} {:>8} {:>7} | {:>9} {:>9} {:>7} {:>8}  floor work",
            "RPC",
            "count",
            "err",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "ops/s",
            "floor p50",
            "floor p99",
            "x p50",
            "+p50 ms"
        );
        for r in self.rows() {
            let s = r.agent.summary();
            let _ = write!(
                o,
                "{:<22} {:>5} {:>4} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.1} |",
                r.rpc,
                s.count,
                s.errors,
                s.p50,
                s.p95,
                s.p99,
                s.max,
                s.throughput(wall)
            );
            match r.floor {
                Some((what, f)) => {
                    let fs = f.summary();
                    let _ = writeln!(
                        o,
                        " {:>9.2} {:>9.2} {:>7.2} {:>8.2}  {what}",
                        fs.p50,
                        fs.p99,
                        ratio(s.p50, fs.p50),
                        s.p50 - fs.p50
                    );
                }
                None => o.push_str("         -         -       -        -\n"),
            }
        }
        let p = self.probe.summary();
        let _ = writeln!(
            o,
            "{:<22} {:>5} {:>4} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.1} |  (during the cycle, own connection)",
            "Probe",
            p.count,
            p.errors,
            p.p50,
            p.p95,
            p.p99,
            p.max,
            p.throughput(wall)
        );
        let _ = write!(o, "cycle wall time: {:.0} ms", ms(wall));
        if let Some(f) = &self.floor {
            let _ = write!(
                o,
                "; floor {:.0} ms; ratio {:.2}",
                ms(f.wall),
                ratio(ms(wall), ms(f.wall))
            );
        }
        o.push('\n');
        if let Some(f) = &self.floor {
            let _ = writeln!(
                o,
                "floor phases p50: probe {:.2} ms, e2fsck {:.2} ms, mount {:.2} ms, statvfs {:.3} ms",
                f.probe.summary().p50,
                f.check.summary().p50,
                f.mount.summary().p50,
                f.stats.summary().p50
            );
            if f.checks.summary().count > 0 {
                let _ = writeln!(
                    o,
                    "floor checks of one owner per device (two a stage) p50: {:.2} ms",
                    f.checks.summary().p50
                );
            }
            if let Some(e) = &f.first_error {
                let _ = writeln!(o, "floor error: {e}");
            }
        }
        self.grpc_table(&mut o);
        let w = self.warmup.summary();
        if w.count > 0 {
            let _ = writeln!(
                o,
                "warm-up stage with mkfs (not in the cycle): p50 {:.1} ms, max {:.1} ms",
                w.p50, w.max
            );
        }
        if let Some(m) = self.memory {
            let _ = writeln!(
                o,
                "agent RSS: idle {}, peak during the cycle {}, VmHWM {}, after {}",
                mib(m.idle_kib),
                mib(m.peak_kib),
                mib(m.hwm_kib),
                mib(m.after_kib)
            );
            let _ = writeln!(
                o,
                "  of which anonymous (RssAnon, the agent's own; the rest is the binary's pages): \
                 idle {}, peak {}, after {}",
                mib(m.idle_anon_kib),
                mib(m.peak_anon_kib),
                mib(m.after_anon_kib)
            );
        }
        if let (Some(a), Some(f)) = (self.cpu.agent, self.cpu.floor) {
            let c = &self.cpu;
            let client = c.client.unwrap_or_default();
            let _ = writeln!(
                o,
                "CPU per volume cycle: agent {:.2} ms + its tools {:.2} ms, bench client {:.2} ms; \
                 floor {:.2} ms + its tools {:.2} ms",
                c.per_cycle_ms(a.own),
                c.per_cycle_ms(a.children),
                c.per_cycle_ms(client.own),
                c.per_cycle_ms(f.own),
                c.per_cycle_ms(f.children)
            );
        }
        if let Some(r) = &self.restart {
            let _ = writeln!(
                o,
                "restart to ready with {} journaled volumes: median {:.0} ms (rounds {:?}), RSS then {}",
                r.volumes,
                r.median_ms(),
                r.rounds_ms.iter().map(|x| round(*x)).collect::<Vec<_>>(),
                r.rss_kib.map(mib).unwrap_or_else(|| "-".into())
            );
        }
        if let Some(e) = &self.agent.first_error {
            let _ = writeln!(o, "first error: {e}");
        }
        o.push_str("targets:\n");
        for t in self.targets() {
            let verdict = match t.pass {
                Some(true) => "ok",
                Some(false) => "MISSED",
                None => "not measured",
            };
            let _ = writeln!(
                o,
                "  {:<28} {:<18} {:<13} {}",
                t.name,
                t.limit,
                verdict,
                t.measured.unwrap_or_default()
            );
        }
        for n in self.notes.iter().chain(&self.cleanup_problems) {
            let _ = writeln!(o, "note: {n}");
        }
        o
    }
}

fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 { x / y } else { 0.0 }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
