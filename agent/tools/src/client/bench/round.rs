//! One measured cycle, as every server under test gets it (the agent, the gRPC floor): the
//! cycle's calls at the run's concurrency, Probe called meanwhile on a connection of its own, and
//! the CPU that the server and this process spent.

use std::time::Duration;

use super::cpu::{self, CpuSpent};
use super::cycle::{self, BenchVolume, Csi, CycleResult};
use super::probe::ProbeLoad;
use super::stats::Series;

/// What every measured cycle of a run shares: the volumes and the cycle's shape.
pub struct Plan<'a> {
    pub volumes: &'a [BenchVolume],
    pub fs_type: &'a str,
    pub concurrency: usize,
    pub with_stats: bool,
    pub probe_interval: Duration,
    pub timeout: Duration,
    /// The gRPC floor makes the checks of one owner per device (`--floor-checks`).
    pub floor_checks: bool,
}

/// What one or more measured cycles gave.
#[derive(Debug, Default)]
pub struct Measured {
    pub cycle: CycleResult,
    pub probe: Series,
    /// The server process and its tools.
    pub server: Option<CpuSpent>,
    /// This bench process meanwhile: the client's side of the calls, the Probe loop.
    pub client: Option<CpuSpent>,
}

impl Measured {
    pub fn merge(&mut self, o: Measured) {
        self.cycle.merge(o.cycle);
        self.probe.merge(o.probe);
        cpu::add(&mut self.server, o.server);
        cpu::add(&mut self.client, o.client);
    }
}

/// One measured cycle against `csi`, with Probe called on `endpoint` meanwhile, and the CPU of
/// the server (`server_pid`, when known) and of this process.
pub async fn measure(
    csi: &Csi,
    endpoint: &str,
    server_pid: Option<u32>,
    plan: &Plan<'_>,
) -> Result<Measured, String> {
    let probes = ProbeLoad::start(endpoint.to_string(), plan.probe_interval, plan.timeout);
    let (server_before, client_before) = (server_pid.and_then(cpu::read), cpu::read_self());
    let cycle = cycle::measured(
        csi,
        plan.volumes,
        plan.concurrency,
        plan.fs_type,
        plan.with_stats,
    )
    .await;
    let (server_after, client_after) = (server_pid.and_then(cpu::read), cpu::read_self());
    let mut m = Measured {
        cycle,
        probe: probes.finish().await?,
        ..Default::default()
    };
    cpu::add_spent(&mut m.server, server_before, server_after);
    cpu::add_spent(&mut m.client, client_before, client_after);
    Ok(m)
}
