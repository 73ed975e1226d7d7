//! `recover`: the documented way out when the agent refuses its state file. The broken file is
//! kept (moved aside), never deleted; `--from-mounts` rebuilds staged volumes and publications from
//! /proc/self/mountinfo, `--reset` starts empty.
//!
//! A read-only raw block publication binds one of this agent's read-only loop devices laid over
//! the volume's (see the core's `node::read_only`): it is rebuilt as such (read-only, block), so the device
//! stays and unpublish detaches it; one this agent did not lay there is left alone and said so.
//! Start-up never detaches a read-only device the host shows in use, record or not.
//!
//! Records rebuilt from mounts do not know the access mode or mount flags the CO asked for: they
//! carry access mode 0 ("recovered"), which the compatibility checks treat as "accept the CO's".

use ebs_node_core::DevNum;
use std::path::{Path, PathBuf};

use ebs_node_core::records::{DeviceIdentity, Durability, LoopAttachment, LoopVolume, now_unix_ms};
use ebs_store::Store;

mod known;
mod mounts;
mod passed_over;

use crate::cli::RecoverArgs;
use crate::settings::STATE_FILE;
use ebs_node_backends::loopback::file_inode;
use ebs_node_core::node::ro_tag::AgentTag;
use ebs_node_host::loopdev;
use ebs_node_host::mount::table::MountTable;
use known::nvme_volumes;
use mounts::rebuild_mounts;

/// A device the agent can tell is one of its volumes.
#[derive(Clone)]
pub(super) struct Known {
    pub(super) volume_id: String,
    pub(super) device: PathBuf,
    pub(super) identity: DeviceIdentity,
}

pub fn run(args: RecoverArgs) -> i32 {
    if !args.from_mounts && !args.reset {
        eprintln!(
            "error: say how to recover: --from-mounts (rebuild from the mount table) or --reset"
        );
        return 2;
    }
    let path = args.state_dir.join(STATE_FILE);
    let node_id = args
        .node_id
        .unwrap_or_else(ebs_node_backends::nodeinfo::hostname);
    // Compared with the mount table's places, which are whole paths with no link in them.
    let state_dir = std::fs::canonicalize(&args.state_dir).unwrap_or(args.state_dir.clone());
    let bounds = passed_over::Bounds {
        state_dir: &state_dir,
        prefixes: &args.allowed_path_prefixes,
    };
    match rebuild(&bounds, &path, args.from_mounts, &node_id) {
        Ok(summary) => {
            println!("{summary}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn rebuild(
    bounds: &passed_over::Bounds,
    path: &Path,
    from_mounts: bool,
    node_id: &str,
) -> Result<String, String> {
    let state_dir = bounds.state_dir;
    // Held until the file is moved aside: no agent starts on it meanwhile. Only a lock proven
    // free lets the file go; any other answer refuses (a fifty-seventh fresh review's F2: a
    // check that failed for another reason let `--reset` move a live agent's file aside).
    let _held = if path.exists() {
        match Store::hold_locks(path) {
            Ok(held) => Some(held),
            Err(ebs_store::StoreError::Locked { .. }) => {
                return Err("the state file is in use: stop the agent first".into());
            }
            Err(e) => {
                return Err(format!(
                    "cannot tell whether an agent holds the state file ({e}); nothing was changed"
                ));
            }
        }
    } else {
        None
    };
    if path.exists() {
        let aside = path.with_extension(format!("redb.broken-{}", now_unix_ms()));
        std::fs::rename(path, &aside)
            .map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
        println!("moved the old state file to {}", aside.display());
    }
    let store = Store::open(path).map_err(|e| e.to_string())?;
    ebs_node_host::private::restrict_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // What recover writes is durable when it returns, and the file left readable by any agent.
    let closed = |said: String| {
        store
            .close_cleanly()
            .map(|()| said)
            .map_err(|e| e.to_string())
    };
    if !from_mounts {
        return closed("started an empty state file".into());
    }
    // Kept beside the state file, so the devices this agent attached and laid are still its.
    let agent_tag = ebs_node_host::instance::agent_tag(state_dir, path)
        .map_err(|e| format!("this agent's instance id: {e}"))?;
    let known = rebuild_loop_volumes(&store, state_dir, &agent_tag, node_id)?
        .into_iter()
        .chain(nvme_volumes())
        .collect::<Vec<_>>();
    let table = MountTable::read().map_err(|e| e.to_string())?;
    let (staged, published) = rebuild_mounts(&store, &known, &table, &agent_tag, bounds)?;
    closed(format!(
        "rebuilt {} staged volume(s) and {} publication(s) from the mount table",
        staged, published
    ))
}

/// The loop backend's volumes are the files under `<state>/volumes/`.
fn rebuild_loop_volumes(
    store: &Store,
    state_dir: &Path,
    agent_tag: &AgentTag,
    node_id: &str,
) -> Result<Vec<Known>, String> {
    let dir = state_dir.join("volumes");
    let mut known = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(known);
    };
    // The devices the mount table shows mounted (a volume's staging, its publications' binds).
    let mounted: std::collections::HashSet<DevNum> = MountTable::read()
        .map(|t| {
            t.entries()
                .iter()
                .map(|m| DevNum::new(m.major, m.minor))
                .collect()
        })
        .unwrap_or_default();
    for entry in entries.flatten() {
        let file = entry.path();
        let Some(id) = file
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".img"))
            .map(str::to_string)
        else {
            continue;
        };
        let Ok((st_dev, st_ino)) = file_inode(&file) else {
            continue;
        };
        let identity = DeviceIdentity::LoopFile {
            file: file.clone(),
            st_dev,
            st_ino,
        };
        let candidates = loopdev::all_over_inode(st_dev, st_ino).unwrap_or_default();
        let named = agent_tag.attached_tag(&id);
        let (device, made) = attachment_of(&id, candidates, &mounted, &named);
        let volume = LoopVolume {
            id: id.clone(),
            name: id.clone(),
            capacity_bytes: entry.metadata().map(|m| m.len()).unwrap_or(0),
            file: file.clone(),
            parameters: Default::default(),
            attachment: device.clone().map(|d| LoopAttachment {
                node_id: node_id.to_string(),
                // As the kernel shows it: a read-only attachment rebuilt as writable had a
                // writable device laid beside it at the next start, and the volume published
                // read-only was mounted and written read-write (a twenty-second fresh review's
                // F2). One whose access cannot be read is taken as read-only: the safe side.
                readonly: loopdev::read_only(&d).unwrap_or(true),
                device: d,
                made,
            }),
            created_unix_ms: now_unix_ms(),
            content_source: None,
        };
        store
            .write(Durability::Immediate, |w| w.put_loop_volume(&volume))
            .map_err(|e| e.to_string())?;
        if let Some(device) = device {
            known.push(Known {
                volume_id: id,
                device,
                identity,
            });
        }
    }
    Ok(known)
}

/// Which of the loop devices over a volume's file is its attachment, and whether the agent
/// counts it as its own (detached with the attachment). The one the mount table shows mounted
/// (the volume's live staging) is; with none mounted, a single one is (a crash's leftover of
/// the agent's attach, most likely), and of several none is chosen: who made which cannot be
/// told, and adopting an operator's device would detach it with the attachment (a seventeenth
/// fresh review's F2). Only a single device is counted as the agent's own.
fn attachment_of(
    id: &str,
    candidates: Vec<PathBuf>,
    mounted: &std::collections::HashSet<DevNum>,
    named: &str,
) -> (Option<PathBuf>, bool) {
    // The device this agent's controller attached carries its name: that one, whatever else an
    // operator laid over the file and mounted (a twenty-eighth fresh review's F1: the first
    // mounted device was taken, an operator's, and the volume's own was left unrecorded).
    let name_of = |d: &PathBuf| {
        let n = ebs_node_host::device::block_devnum(d).ok()?;
        ebs_node_host::loopdev::overlay::status_by_devnum(n)
            .ok()?
            .map(|o| o.tag)
    };
    let own: Vec<&PathBuf> = candidates
        .iter()
        .filter(|d| name_of(d).as_deref() == Some(named))
        .collect();
    if let [d] = own.as_slice() {
        return (Some((*d).clone()), true);
    }
    let several = candidates.len() > 1;
    let in_use: Vec<&PathBuf> = candidates
        .iter()
        .filter(|d| ebs_node_host::device::block_devnum(d).is_ok_and(|n| mounted.contains(&n)))
        .collect();
    if in_use.len() > 1 {
        println!(
            "volume {id}: {} loop devices over its file are mounted and none carries this \
             agent's name: no attachment recorded (whose is which cannot be told)",
            in_use.len()
        );
        return (None, false);
    }
    match (in_use.first(), candidates.as_slice()) {
        (Some(d), _) => ((*d).clone().into(), !several),
        (None, [only]) => (Some(only.clone()), true),
        (None, []) => (None, false),
        (None, _) => {
            println!(
                "volume {id}: {} loop devices lie over its file and none is mounted: no \
                 attachment recorded (ControllerPublishVolume attaches it again)",
                candidates.len()
            );
            (None, false)
        }
    }
}
