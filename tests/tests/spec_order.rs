//! The order of checks the CSI spec implies (agent/daemon/src/grpc/spec_order.rs), the same through
//! v1, v0.3 and v0.1: a missing REQUIRED field is INVALID_ARGUMENT before anything else, an
//! unknown volume is NOT_FOUND before any path is looked at, then paths and states.

use std::collections::HashMap;
use std::path::Path;

use ebs_tests::csi::volume_capability::access_mode::Mode;
use ebs_tests::csi_req::*;
use ebs_tests::legacy::*;
use ebs_tests::*;
use tonic::Code;

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[tokio::test]
async fn every_version_checks_fields_then_the_volume_then_paths() {
    let scratch = Scratch::new("spec-order");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let known = create_volume(&agent, "known", 16 << 20, &[]).await;
    let target = agent.work.join("pods/p/mount");
    let staging = agent.work.join("staging/s");
    let outside = Path::new("/etc/not-allowed");
    let none = HashMap::new();
    let cap = || Some(mount_cap("ext4", Mode::SingleNodeWriter));
    let (mut n1, mut n0, mut n01) = (
        agent.node().await,
        v0_node(&agent).await,
        v01_node(&agent).await,
    );

    // (what, volume, staging, target, with a capability, expected code)
    let publishes: [(&str, &str, &Path, &Path, bool, Code); 6] = [
        (
            "no target: before the missing staging path",
            "vol-x",
            Path::new(""),
            Path::new(""),
            true,
            Code::InvalidArgument,
        ),
        (
            "no capability: before the unknown volume",
            "vol-x",
            &staging,
            &target,
            false,
            Code::InvalidArgument,
        ),
        (
            "unknown volume: before its bad path",
            "vol-x",
            &staging,
            outside,
            true,
            Code::NotFound,
        ),
        (
            "known volume, target outside the prefixes",
            &known,
            &staging,
            outside,
            true,
            Code::InvalidArgument,
        ),
        (
            "known volume, no staging path: a state",
            &known,
            Path::new(""),
            &target,
            true,
            Code::FailedPrecondition,
        ),
        (
            "known volume, not staged: a state",
            &known,
            &staging,
            &target,
            true,
            Code::FailedPrecondition,
        ),
    ];
    for (what, vol, stg, tgt, with_cap, want) in publishes {
        let mut r1 = csi::NodePublishVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: stg.display().to_string(),
            target_path: tgt.display().to_string(),
            volume_capability: cap(),
            ..Default::default()
        };
        if !with_cap {
            r1.volume_capability = None;
        }
        assert_eq!(code(n1.node_publish_volume(r1).await), want, "v1: {what}");
        let mut r0 = v0_publish(vol, &none, stg, tgt, "ext4");
        if !with_cap {
            r0.volume_capability = None;
        }
        assert_eq!(code(n0.node_publish_volume(r0).await), want, "v0.3: {what}");
        // v0.1 has no staging path of its own (the agent stages inside publish), so the cases
        // that differ only by it are the same request there.
        if stg.as_os_str().is_empty() && !tgt.as_os_str().is_empty() {
            continue;
        }
        let mut r01 = v01_publish(vol, &none, tgt, "ext4");
        if !with_cap {
            r01.volume_capability = None;
        }
        assert_eq!(
            code(n01.node_publish_volume(r01).await),
            want,
            "v0.1: {what}"
        );
    }

    // Stage: the same through v1 and v0.3.
    let stages: [(&str, &str, &Path, bool, Code); 3] = [
        (
            "no staging path",
            "vol-x",
            Path::new(""),
            true,
            Code::InvalidArgument,
        ),
        (
            "no capability",
            "vol-x",
            &staging,
            false,
            Code::InvalidArgument,
        ),
        (
            "unknown volume before its bad path",
            "vol-x",
            outside,
            true,
            Code::NotFound,
        ),
    ];
    for (what, vol, stg, with_cap, want) in stages {
        let r1 = csi::NodeStageVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: stg.display().to_string(),
            volume_capability: if with_cap { cap() } else { None },
            ..Default::default()
        };
        assert_eq!(
            code(n1.node_stage_volume(r1).await),
            want,
            "v1 stage: {what}"
        );
        let mut r0 = v0_stage(vol, &none, stg, "ext4");
        if !with_cap {
            r0.volume_capability = None;
        }
        assert_eq!(
            code(n0.node_stage_volume(r0).await),
            want,
            "v0.3 stage: {what}"
        );
    }

    // Stats and expansion ask where a volume is: an unknown volume, or a place the volume is
    // not (even one that is no absolute path), is NOT_FOUND; a missing field comes first.
    for (what, vol, path, want) in [
        ("no volume path", "vol-x", "", Code::InvalidArgument),
        (
            "unknown volume, relative path",
            "vol-x",
            "some/path",
            Code::NotFound,
        ),
        (
            "known volume, relative path",
            known.as_str(),
            "some/path",
            Code::NotFound,
        ),
        (
            "known volume, outside the prefixes",
            known.as_str(),
            "/etc",
            Code::NotFound,
        ),
    ] {
        let stats = csi::NodeGetVolumeStatsRequest {
            volume_id: vol.into(),
            volume_path: path.into(),
            ..Default::default()
        };
        assert_eq!(
            code(n1.node_get_volume_stats(stats).await),
            want,
            "stats: {what}"
        );
        let expand = csi::NodeExpandVolumeRequest {
            volume_id: vol.into(),
            volume_path: path.into(),
            ..Default::default()
        };
        assert_eq!(
            code(n1.node_expand_volume(expand).await),
            want,
            "expand: {what}"
        );
    }
    assert!(
        !target.exists() && !staging.exists(),
        "refusals leave nothing behind"
    );
}
