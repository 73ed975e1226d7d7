//! After the reboot: the calls kubelet makes again (stage, publish, unpublish, unstage), with
//! what each must find. The first stage either uses the filesystem the journal recorded,
//! finishes the journal's own mkfs, formats a volume on which nothing durable was written, or
//! refuses (FAILED_PRECONDITION) a volume that carries another mkfs's partial writes.

use std::path::PathBuf;

use csi::volume_capability::access_mode::Mode;
use ebs_tests::csi;
use ebs_tests::csi_req::mount_cap;
use ebs_tests::{Agent, mounts_below};
use tonic::Code;

use crate::check::Durable;
use crate::host::{Loop, VOLUME, fs_uuid};
use crate::record::Recording;

/// How the first stage after the cut ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StageOutcome {
    /// The recorded filesystem was mounted as it was (no mkfs).
    AlreadyComplete,
    /// The journal held a format intent: mkfs ran again with the intent's UUID.
    FinishedOurMkfs,
    /// Refused with FAILED_PRECONDITION: the device carries writes the intent cannot vouch for.
    Refused,
    /// Nothing durable yet (no intent, blank volume): formatted as a new volume.
    FormattedFresh,
    /// Any other outcome: a problem says which.
    Failed,
}

pub fn staging(rec: &Recording) -> PathBuf {
    rec.scratch.join(&format!("w/staging/{VOLUME}"))
}

pub fn target(rec: &Recording) -> PathBuf {
    rec.scratch.join("w/pods/pod-1/mount")
}

/// Lines of the agent's log that say it ran mkfs.
fn mkfs_runs(agent: &Agent) -> Vec<String> {
    agent
        .log_text()
        .lines()
        .filter(|l| l.contains("formatted") && l.contains("uuid"))
        .map(str::to_string)
        .collect()
}

pub async fn drive(
    agent: &Agent,
    rec: &Recording,
    vol: &Loop,
    durable: &Durable,
    acked: &dyn Fn(&str) -> bool,
    problems: &mut Vec<String>,
) -> (StageOutcome, Option<String>) {
    let (s, t) = (staging(rec), target(rec));
    let _ = std::fs::create_dir_all(t.parent().unwrap_or(&t));
    let cap = mount_cap(rec.fs.name(), Mode::SingleNodeWriter);
    let mut node = agent.node().await;
    let staged = node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: VOLUME.into(),
            staging_target_path: s.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await;
    let outcome = match staged {
        Ok(_) => classify(agent, vol, durable, problems),
        Err(st) if st.code() == Code::FailedPrecondition => {
            if !matches!(durable, Durable::Intent(_)) {
                problems.push(format!(
                    "stage refused with the format record {durable:?}: {}",
                    st.message()
                ));
            }
            if !mounts_below(&s).is_empty() {
                problems.push("the refused stage left a mount".into());
            }
            return (StageOutcome::Refused, Some(st.message().to_string()));
        }
        Err(st) => {
            problems.push(format!("stage: {:?}: {}", st.code(), st.message()));
            return (StageOutcome::Failed, None);
        }
    };
    let payload_at = |dir: &PathBuf, when: &str, problems: &mut Vec<String>| {
        if !acked("written") {
            return;
        }
        match std::fs::read_to_string(dir.join("data")) {
            Ok(d) if d == rec.payload => {}
            other => problems.push(format!(
                "{when}: the data written and synced before the cut reads {other:?}"
            )),
        }
    };
    payload_at(&s, "after stage", problems);
    let published = node
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: VOLUME.into(),
            staging_target_path: s.display().to_string(),
            target_path: t.display().to_string(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await;
    match published {
        Ok(_) => payload_at(&t, "after publish", problems),
        Err(st) => problems.push(format!("publish: {:?}: {}", st.code(), st.message())),
    }
    let unpublished = node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: VOLUME.into(),
            target_path: t.display().to_string(),
        })
        .await;
    if let Err(st) = unpublished {
        problems.push(format!("unpublish: {:?}: {}", st.code(), st.message()));
    }
    let unstaged = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: VOLUME.into(),
            staging_target_path: s.display().to_string(),
        })
        .await;
    if let Err(st) = unstaged {
        problems.push(format!("unstage: {:?}: {}", st.code(), st.message()));
    }
    (outcome, None)
}

/// What the successful stage did, checked against what the state file held.
fn classify(
    agent: &Agent,
    vol: &Loop,
    durable: &Durable,
    problems: &mut Vec<String>,
) -> StageOutcome {
    let runs = mkfs_runs(agent);
    let uuid = fs_uuid(&vol.dev);
    let expect_uuid = |want: &str, problems: &mut Vec<String>| {
        if uuid != want {
            problems.push(format!("the volume carries UUID {uuid:?}, expected {want}"));
        }
    };
    match durable {
        Durable::Done(u) => {
            if !runs.is_empty() {
                problems.push(format!(
                    "a volume recorded as formatted was formatted again: {runs:?}"
                ));
            }
            expect_uuid(u, problems);
            StageOutcome::AlreadyComplete
        }
        Durable::Intent(u) => {
            expect_uuid(u, problems);
            if runs.is_empty() {
                StageOutcome::AlreadyComplete
            } else {
                StageOutcome::FinishedOurMkfs
            }
        }
        Durable::Nothing => {
            if runs.len() != 1 || uuid.is_empty() {
                problems.push(format!(
                    "nothing was recorded, the stage ran mkfs {} times (UUID {uuid:?})",
                    runs.len()
                ));
            }
            StageOutcome::FormattedFresh
        }
    }
}
