//! The shipped unit's capability bounding set is enough for the whole volume lifecycle.

use std::process::{Command, Stdio};

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

/// The capabilities `CapabilityBoundingSet=` in the shipped unit grants, as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/ebs-node-agent.service"),
    )
    .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap();
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect()
}

fn cap_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| match n.as_str() {
            "dac_read_search" => 1u64 << 2,
            "mknod" => 1 << 27,
            "sys_admin" => 1 << 21,
            "sys_resource" => 1 << 24,
            "sys_chroot" => 1 << 18,
            "sys_ptrace" => 1 << 19,
            other => panic!("add {other} to cap_mask"),
        })
        .fold(0, |a, b| a | b)
}

#[tokio::test]
async fn the_units_capability_set_is_enough_for_the_volume_lifecycle() {
    if !require_root("the_units_capability_set_is_enough_for_the_volume_lifecycle") {
        return;
    }
    let mut caps = unit_capabilities();
    // systemd hosts have a devtmpfs /dev, where the kernel creates loop nodes itself; a sandbox
    // with a plain tmpfs /dev needs the loop backend's mknod fallback.
    let devtmpfs = String::from_utf8(
        Command::new("stat")
            .args(["-f", "-c", "%T", "/dev"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
        == "devtmpfs";
    if !devtmpfs {
        caps.push("mknod".into());
    }
    let scratch = Scratch::new("unit-caps");
    let mut agent = Agent::unstarted(&scratch, AgentOpts::default());
    let log = std::fs::File::create(&agent.log).unwrap();
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    // As the unit: only these capabilities, no new privileges, UMask=0077.
    let script = "umask 0077; exec \"$@\"";
    let child = Command::new("sh")
        .args([
            "-c",
            script,
            "sh",
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
        ])
        .arg(format!("--bounding-set={bounding}"))
        .arg(agent_bin())
        .args(agent.serve_args())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    agent.child = Some(child);
    agent.wait_ready().await;

    let cap_field = |pid: &str, field: &str| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap()
            .trim()
            .to_string();
        u64::from_str_radix(&hex, 16).unwrap()
    };
    // What the unit grants, within what this sandbox itself may hold.
    let expected = cap_mask(&caps) & cap_field("self", "CapBnd:");
    let held = cap_field(&agent.pid().to_string(), "CapEff:");
    assert_eq!(
        held, expected,
        "the agent holds other capabilities than the unit grants"
    );

    for fs in ["ext4", "xfs"] {
        let vol = create_attached(&agent, &format!("caps-{fs}"), 320 << 20).await;
        let staging = agent.work.join(format!("stage-{fs}"));
        let target = agent.work.join(format!("target-{fs}"));
        std::fs::create_dir_all(&staging).unwrap();
        let cap = mount_cap(fs, Mode::SingleNodeWriter);
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
            .await
            .unwrap();
        node.node_publish_volume(publish_req(&vol, &staging, &target, cap, false))
            .await
            .unwrap();
        std::fs::write(target.join("file"), b"data").unwrap();
        node.node_unpublish_volume(unpublish_req(&vol, &target))
            .await
            .unwrap();
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
    }
    assert!(
        agent.terminate().await.expect("exits").success(),
        "{}",
        agent.log_text()
    );
}

/// Whether this process has `cap` (a bit of CapEff in /proc/self/status).
pub fn has_effective_cap(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << bit) != 0
}
