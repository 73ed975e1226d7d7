//! Running the agent as operators do: systemd's notify protocol, the Prometheus endpoint, the logs
//! (one line per call, JSON on request, never a secret), the systemd unit's capability set, and
//! `doctor`; signals other than SIGTERM, and a damaged state file.

mod doctor;
mod logs;
mod metrics;
mod notify;
mod private_binds;
mod signals;
mod state_file;
mod syscall_filter;
mod unit_caps;

use std::path::PathBuf;

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

/// A staged and published ext4 volume under the agent's work dir (an allowed prefix).
pub async fn stage_and_publish(agent: &Agent, name: &str) -> (Vol, PathBuf, PathBuf) {
    let vol = create_attached(agent, name, 64 << 20).await;
    let staging = agent.work.join(format!("stage-{name}"));
    let target = agent.work.join(format!("target-{name}"));
    std::fs::create_dir_all(&staging).unwrap();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    agent
        .node()
        .await
        .node_stage_volume(stage_req(&vol, &staging, cap.clone()))
        .await
        .unwrap();
    agent
        .node()
        .await
        .node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
        .await
        .unwrap();
    (vol, staging, target)
}
