//! Two agents on one host, each with a state directory of its own (a nineteenth fresh review's
//! F1): neither sees the other's records or claims, so a loop device the other's controller
//! attached and nothing uses yet looks free. Each agent names the loop devices it attaches with
//! its instance id (as it names its read-only devices), and a node-local handle never takes a
//! device another agent named, nor one laid on such a device.

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::owners::{SIZE, handle_of, rwx_block, rwx_mount};

/// Agent B's handles on agent A's attached, never staged volume (mount: B would format it;
/// raw block: B's workload would read and write it; a loop device laid over it: the same bytes
/// one level down) are refused with FAILED_PRECONDITION, nothing is mounted, and A's device is
/// still blank: A's own stage then formats and mounts it.
#[tokio::test]
async fn a_handle_never_takes_a_device_another_agent_attached() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_handle_never_takes_a_device_another_agent_attached") {
        return;
    }
    let (sa, sb) = (Scratch::new("two-agents-a"), Scratch::new("two-agents-b"));
    let a = Agent::start(&sa, AgentOpts::default()).await;
    let b = Agent::start(&sb, AgentOpts::default()).await;
    let id = create_volume(&a, "v", SIZE, &[]).await;
    let v = attach(&a, &id).await;
    let mut node = b.node().await;
    let mut refused = async |what: &str, vol: &Vol, cap| {
        let h = handle_of(vol);
        let staging = b.work.join(format!("{}/staging", what.len()));
        let e = node
            .node_stage_volume(stage_req(&h, &staging, cap))
            .await
            .expect_err(&format!("{what}: agent b's handle took agent a's device"));
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert!(!super::is_mounted(&staging), "{what}: mounted anyway");
    };
    refused("mount", &v, rwx_mount()).await;
    refused("block", &v, rwx_block()).await;
    {
        let over = super::losetup("", &v.device);
        let _detach = super::owners::DetachOnDrop(over.clone());
        let stacked = Vol {
            id: String::new(),
            device: over,
        };
        refused("a loop device laid over it", &stacked, rwx_mount()).await;
    }
    let blank = sh(&format!("blkid -p {} || true", v.device));
    assert!(
        blank.stdout.is_empty(),
        "agent a's volume was written: {}",
        String::from_utf8_lossy(&blank.stdout)
    );
    let staging = a.work.join("v/staging");
    let mut mine = a.node().await;
    mine.node_stage_volume(stage_req(
        &v,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    ))
    .await
    .expect("agent a stages its own volume");
    mine.node_unstage_volume(unstage_req(&v, &staging))
        .await
        .expect("unstage");
}

/// A name is not the only sign (a twentieth fresh review's F1): a device attached before agents
/// named theirs, one whose name a workload erased (anyone who opens a loop device may rename
/// it), and an operator's loop device over the other agent's volume file all lie over a file in
/// that agent's state directory, and are refused for that. A restart names the agent's own
/// device again.
#[tokio::test]
async fn a_device_over_another_agents_file_is_refused_whatever_its_name() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_over_another_agents_file_is_refused_whatever_its_name") {
        return;
    }
    let (sa, sb) = (
        Scratch::new("two-agents-name-a"),
        Scratch::new("two-agents-name-b"),
    );
    let mut a = Agent::start(&sa, AgentOpts::default()).await;
    let b = Agent::start(&sb, AgentOpts::default()).await;
    let id = create_volume(&a, "v", SIZE, &[]).await;
    let v = attach(&a, &id).await;
    let name_of = |dev: &str| {
        let f = std::fs::File::open(dev).expect("open the device");
        let status = ebs_node_host::loopdev::overlay::status_of(&f, std::path::Path::new(dev));
        status.expect("status").expect("bound").tag
    };
    assert!(
        name_of(&v.device).starts_with("ebsna-lo:"),
        "{}",
        name_of(&v.device)
    );
    ebs_node_host::loopdev::rename(std::path::Path::new(&v.device), "").expect("erase the name");
    let file = a.state_dir.join(format!("volumes/{id}.img"));
    let operators = super::losetup("", file.display());
    let _detach = super::owners::DetachOnDrop(operators.clone());
    let mut node = b.node().await;
    for (what, dev) in [("nameless", &v.device), ("the operator's", &operators)] {
        let h = handle_of(&Vol {
            id: String::new(),
            device: dev.clone(),
        });
        let staging = b.work.join(format!("{}/staging", what.len()));
        let e = node
            .node_stage_volume(stage_req(&h, &staging, rwx_block()))
            .await
            .expect_err(&format!(
                "{what}: agent b's handle took agent a's volume file"
            ));
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert!(
            e.message().contains("another agent's state directory"),
            "{what}: {e:?}"
        );
        assert!(!super::is_mounted(&staging), "{what}: staged anyway");
    }
    a.restart(None).await;
    assert!(
        name_of(&v.device).starts_with("ebsna-lo:"),
        "a restart left the device nameless"
    );
}

/// A hard link of agent A's volume file outside A's state directory, with a loop device over it
/// (a twenty-third fresh review's F1): the name the kernel shows is not in A's directory and the
/// device's name is an operator's, but the file has a second name, and agent B refuses it.
#[tokio::test]
async fn a_device_over_a_hard_link_of_another_agents_file_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_over_a_hard_link_of_another_agents_file_is_refused") {
        return;
    }
    let (sa, sb) = (
        Scratch::new("two-agents-link-a"),
        Scratch::new("two-agents-link-b"),
    );
    let a = Agent::start(&sa, AgentOpts::default()).await;
    let b = Agent::start(&sb, AgentOpts::default()).await;
    let id = create_volume(&a, "v", SIZE, &[]).await;
    let file = a.state_dir.join(format!("volumes/{id}.img"));
    let link = sb.join("hl.img");
    std::fs::hard_link(&file, &link).expect("link");
    let dev = super::losetup("", link.display());
    let _detach = super::owners::DetachOnDrop(dev.clone());
    let h = handle_of(&Vol {
        id: String::new(),
        device: dev,
    });
    let staging = b.work.join("hl/staging");
    let e = b
        .node()
        .await
        .node_stage_volume(stage_req(&h, &staging, rwx_mount()))
        .await
        .expect_err("agent b's handle took agent a's file through a hard link");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!super::is_mounted(&staging), "staged anyway");
}

/// A bind mount gives agent A's volume file a second path outside A's state directory, and no
/// second link; a loop device over that path shows A's bytes. Agent B's handle on it is refused,
/// because A's own loop device over the same file, idle, carries A's name (a twenty-eighth fresh
/// review's F2: B staged it, read A's data and wrote to it).
#[tokio::test]
async fn a_device_over_a_bind_mounted_name_of_another_agents_file_is_refused() {
    let _shared = crate::NAMESPACE_COPY.read().await;
    if !require_root("a_device_over_a_bind_mounted_name_of_another_agents_file_is_refused") {
        return;
    }
    let (sa, sb) = (
        Scratch::new("two-agents-bind-a"),
        Scratch::new("two-agents-bind-b"),
    );
    let a = Agent::start(&sa, AgentOpts::default()).await;
    let b = Agent::start(&sb, AgentOpts::default()).await;
    let id = create_volume(&a, "v", SIZE, &[]).await;
    let _v = attach(&a, &id).await;
    let file = a.state_dir.join(format!("volumes/{id}.img"));
    let name = sb.join("elsewhere.img");
    std::fs::write(&name, "").expect("bind target");
    sh(&format!(
        "mount --bind {} {}",
        file.display(),
        name.display()
    ));
    let bound = Unmount(name.clone());
    let over = super::owners::DetachOnDrop(super::losetup("", name.display()));
    let h = Vol {
        id: format!("local-ebs://{}", over.0.trim_start_matches('/')),
        device: over.0.clone(),
    };
    let mut node = b.node().await;
    for (cap, what) in [(rwx_mount(), "mount"), (rwx_block(), "block")] {
        let staging = b.work.join(format!("{what}/staging"));
        let e = node
            .node_stage_volume(stage_req(&h, &staging, cap))
            .await
            .expect_err(&format!(
                "{what}: agent b's handle took agent a's file through a bind mount"
            ));
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert!(!super::is_mounted(&staging), "{what}: mounted anyway");
    }
    let loop_name = over.0.clone();
    drop(over);
    wait_unbound(&loop_name);
    drop(bound);
}
