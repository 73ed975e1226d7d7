//! The cost of the metrics the agent records on every call: `observe_rpc` and `observe_step`
//! (what each CSI call and each journaled step pays), and one exposition render with the label
//! sets a busy node has. Run: cargo bench -p ebs-node-agent --bench metrics_observe

use std::time::{Duration, Instant};

use ebs_node_agent::metrics::{Gauges, observe_rpc, observe_step, render};

const CALLS: usize = 400_000;
const RPCS: [&str; 4] = [
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
];
const STEPS: [&str; 4] = ["probe", "format", "mount", "bind"];

fn main() {
    let started = Instant::now();
    for i in 0..CALLS {
        observe_rpc(RPCS[i % 4], None, 1.5);
    }
    let rpc = started.elapsed();
    let started = Instant::now();
    for i in 0..CALLS {
        observe_step("stage", STEPS[i % 4], true, Duration::from_micros(300));
    }
    let step = started.elapsed();
    let gauges = || Gauges {
        in_flight: 1,
        staged: Some(128),
        published: Some(128),
        ready: true,
        needing_attention: 0,
        ebs: None,
    };
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..2_000 {
        bytes += render(&gauges()).len();
    }
    let scrape = started.elapsed();
    println!(
        "observe_rpc {:.0} ns, observe_step {:.0} ns, render {:.1} us ({} bytes)",
        rpc.as_nanos() as f64 / CALLS as f64,
        step.as_nanos() as f64 / CALLS as f64,
        scrape.as_micros() as f64 / 2_000.0,
        bytes / 2_000
    );
}
