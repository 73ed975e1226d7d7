//! The gRPC floor's part of the report (`--grpc-floor`): its calls, and the agent against it.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::super::cycle::CycleResult;
use super::super::round::Measured;
use super::super::stats::{Series, ms, round};
use super::{Report, ratio};

impl Report {
    fn grpc_rows<'a>(&self, g: &'a CycleResult) -> Vec<(&'static str, &'a Series)> {
        let mut rows = vec![
            ("NodeStageVolume", &g.stage),
            ("NodePublishVolume", &g.publish),
        ];
        if self.with_stats {
            rows.push(("NodeGetVolumeStats", &g.stats));
        }
        rows.push(("NodeUnpublishVolume", &g.unpublish));
        rows.push(("NodeUnstageVolume", &g.unstage));
        rows
    }

    /// Per volume cycle: the server and its tools, and the client meanwhile.
    fn grpc_cpu_ms(&self, g: &Measured) -> Option<(f64, f64, f64)> {
        let cycles = g.cycle.stage.summary().count.max(1) as f64;
        let s = g.server?;
        let c = g.client.unwrap_or_default();
        Some((
            ms(s.own) / cycles,
            ms(s.children) / cycles,
            ms(c.own) / cycles,
        ))
    }

    pub(super) fn grpc_json(&self) -> Value {
        let Some(g) = &self.grpc_floor else {
            return Value::Null;
        };
        let mut rpcs = serde_json::Map::new();
        for (rpc, s) in self.grpc_rows(&g.cycle) {
            rpcs.insert(rpc.into(), s.summary().to_json(Some(g.cycle.wall)));
        }
        rpcs.insert("Probe".into(), g.probe.summary().to_json(None));
        let cpu = self.grpc_cpu_ms(g);
        let agent_cpu = self.cpu.agent.map(|a| {
            let c = self.cpu.cycles.max(1) as f64;
            (ms(a.own) + ms(a.children)) / c
        });
        json!({
            "rpcs": rpcs,
            "wall_ms": round(ms(g.cycle.wall)),
            "errors": g.cycle.errors(),
            "first_error": g.cycle.first_error,
            "cpu_per_cycle_ms": cpu.map(|(own, tools, client)| json!({
                "server": round(own), "server_tools": round(tools), "client": round(client),
            })),
            "ratios": {
                "agent_wall": round(ratio(ms(self.agent.wall), ms(g.cycle.wall))),
                "agent_cpu": match (agent_cpu, cpu) {
                    (Some(a), Some((own, tools, _))) => json!(round(ratio(a, own + tools))),
                    _ => Value::Null,
                },
                "vs_floor_wall": self.floor.as_ref()
                    .map(|f| round(ratio(ms(g.cycle.wall), ms(f.wall)))),
            },
        })
    }

    pub(super) fn grpc_table(&self, o: &mut String) {
        let Some(g) = &self.grpc_floor else {
            return;
        };
        let _ = write!(
            o,
            "gRPC floor (the floor's host work behind a bare tonic server): wall {:.0} ms",
            ms(g.cycle.wall)
        );
        if let Some(f) = &self.floor {
            let _ = write!(o, " = {:.2} x floor", ratio(ms(g.cycle.wall), ms(f.wall)));
        }
        let _ = writeln!(
            o,
            "; agent = {:.2} x it",
            ratio(ms(self.agent.wall), ms(g.cycle.wall))
        );
        let agent_rows = self.rows();
        for (rpc, s) in self.grpc_rows(&g.cycle) {
            let s = s.summary();
            let agent = agent_rows
                .iter()
                .find(|r| r.rpc == rpc)
                .map(|r| r.agent.summary().p50);
            let _ = writeln!(
                o,
                "  {rpc:<22} p50 {:>8.2} ms  p99 {:>8.2} ms  errors {}  (agent p50 {:.2} ms)",
                s.p50,
                s.p99,
                s.errors,
                agent.unwrap_or_default()
            );
        }
        if let Some((own, tools, client)) = self.grpc_cpu_ms(g) {
            let _ = writeln!(
                o,
                "  CPU per volume cycle: server {own:.2} ms + its tools {tools:.2} ms, bench client {client:.2} ms"
            );
        }
        if let Some(e) = &g.cycle.first_error {
            let _ = writeln!(o, "  gRPC floor error: {e}");
        }
    }
}
