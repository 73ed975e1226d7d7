//! The crash-safe journal: kill the agent at every step boundary, restart it on the same state,
//! retry, and check that nothing was formatted twice, no data was lost, no mount was stacked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

fn crash_opts(point: Option<&str>) -> AgentOpts {
    let mut o = AgentOpts::default();
    if let Some(p) = point {
        o.args.push("--crash-after".into());
        o.args.push(p.into());
    }
    o
}

fn mount_count(path: &Path) -> usize {
    mounts_below(path)
        .iter()
        .filter(|m| m.as_path() == path)
        .count()
}

struct Cycle {
    vol: Vol,
    staging: PathBuf,
    target: PathBuf,
    cap: csi::VolumeCapability,
}

impl Cycle {
    /// A volume's staging and target paths under the agent's state dir, mounted as `fs`.
    fn new(agent: &Agent, vol: Vol, name: &str, fs: &str) -> Self {
        Cycle {
            vol,
            staging: agent.work.join(format!("staging/{name}")),
            target: agent.work.join(format!("pods/{name}/mount")),
            cap: mount_cap(fs, Mode::SingleNodeWriter),
        }
    }
}

/// A fresh agent started with `opts` on a scratch directory of its own, and one attached volume
/// of `bytes` with its staging and target paths, to be mounted as `fs`.
async fn agent_with_volume(
    scratch: &str,
    opts: AgentOpts,
    name: &str,
    bytes: i64,
    fs: &str,
) -> (Scratch, Agent, Cycle) {
    let scratch = Scratch::new(scratch);
    let agent = Agent::start(&scratch, opts).await;
    let vol = create_attached(&agent, name, bytes).await;
    let c = Cycle::new(&agent, vol, name, fs);
    (scratch, agent, c)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

async fn call(agent: &Agent, c: &Cycle, op: Op) -> Result<(), tonic::Status> {
    call_on(&mut agent.node().await, c, op).await
}

/// `op` for the volume of `c` over a connection the caller made (the storm's may fail).
async fn call_on(
    node: &mut csi::node_client::NodeClient<tonic::transport::Channel>,
    c: &Cycle,
    op: Op,
) -> Result<(), tonic::Status> {
    match op {
        Op::Stage => node
            .node_stage_volume(stage_req(&c.vol, &c.staging, c.cap.clone()))
            .await
            .map(drop),
        Op::Publish => node
            .node_publish_volume(publish_req(
                &c.vol,
                &c.staging,
                &c.target,
                c.cap.clone(),
                false,
            ))
            .await
            .map(drop),
        Op::Unpublish => node
            .node_unpublish_volume(unpublish_req(&c.vol, &c.target))
            .await
            .map(drop),
        Op::Unstage => node
            .node_unstage_volume(unstage_req(&c.vol, &c.staging))
            .await
            .map(drop),
    }
}

mod boot_log;
mod crash_matrix;
mod interrupted;
mod rebuilt_copies;
mod recovery;
mod releases;
mod storm;
