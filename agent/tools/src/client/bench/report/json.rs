//! The report as JSON, for scripts: the same figures as the table.

use serde_json::{Value, json};

use super::super::stats::{Series, Summary, ms, round};
use super::{Report, ratio};

impl Report {
    pub fn to_json(&self) -> Value {
        let wall = self.agent.wall;
        let mut rpcs = serde_json::Map::new();
        let mut ratios = serde_json::Map::new();
        for r in self.rows() {
            let s = r.agent.summary();
            rpcs.insert(r.rpc.into(), s.to_json(Some(wall)));
            if let Some((what, f)) = r.floor {
                let fs = f.summary();
                ratios.insert(
                    r.rpc.into(),
                    json!({
                        "floor_work": what,
                        "p50_ratio": round(ratio(s.p50, fs.p50)),
                        "p99_ratio": round(ratio(s.p99, fs.p99)),
                        "p50_diff_ms": round(s.p50 - fs.p50),
                    }),
                );
            }
        }
        rpcs.insert("Probe".into(), self.probe.summary().to_json(Some(wall)));
        let floor = self.floor.as_ref().map(|f| {
            let sum = |s: &Series| s.summary().to_json(None);
            json!({
                "stage": sum(&f.stage), "publish": sum(&f.publish), "stats": sum(&f.stats),
                "unpublish": sum(&f.unpublish), "unstage": sum(&f.unstage),
                "phases": {"probe": sum(&f.probe), "e2fsck": sum(&f.check), "mount": sum(&f.mount),
                    "checks": sum(&f.checks)},
                "wall_ms": round(ms(f.wall)),
                "errors": f.errors(),
                "first_error": f.first_error,
            })
        });
        if let Some(f) = &self.floor {
            ratios.insert("wall".into(), json!(round(ratio(ms(wall), ms(f.wall)))));
        }
        json!({
            "config": self.config,
            "rpcs": rpcs,
            "errors": self.agent.errors(),
            "first_error": self.agent.first_error,
            "wall_ms": round(ms(wall)),
            "stats_measured": self.with_stats,
            "warmup_stage": summary_or_null(&self.warmup.summary()),
            "floor": floor,
            "grpc_floor": self.grpc_json(),
            "ratios": ratios,
            "memory": self.memory.map(|m| json!({
                "idle_kib": m.idle_kib, "peak_kib": m.peak_kib, "hwm_kib": m.hwm_kib, "after_kib": m.after_kib,
                "idle_anon_kib": m.idle_anon_kib, "peak_anon_kib": m.peak_anon_kib, "after_anon_kib": m.after_anon_kib,
            })),
            "cpu_per_cycle_ms": {
                "agent": self.cpu.agent.map(|a| round(self.cpu.per_cycle_ms(a.own))),
                "agent_tools": self.cpu.agent.map(|a| round(self.cpu.per_cycle_ms(a.children))),
                "client": self.cpu.client.map(|c| round(self.cpu.per_cycle_ms(c.own))),
                "floor": self.cpu.floor.map(|f| round(self.cpu.per_cycle_ms(f.own))),
                "floor_tools": self.cpu.floor.map(|f| round(self.cpu.per_cycle_ms(f.children))),
            },
            "restart": self.restart.as_ref().map(|r| json!({
                "volumes": r.volumes,
                "median_ms": round(r.median_ms()),
                "rounds_ms": r.rounds_ms.iter().map(|x| round(*x)).collect::<Vec<_>>(),
                "rss_kib": r.rss_kib,
                "cleanup_problems": r.cleanup_problems,
            })),
            "targets": self.targets().into_iter().map(|t| json!({
                "name": t.name, "limit": t.limit, "measured": t.measured, "pass": t.pass,
            })).collect::<Vec<_>>(),
            "notes": self.notes,
            "cleanup_problems": self.cleanup_problems,
        })
    }
}

fn summary_or_null(s: &Summary) -> Value {
    if s.count == 0 {
        Value::Null
    } else {
        s.to_json(None)
    }
}
