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

use ebs_node_backends::kubelet_names::{handle_named_by, said_by_kubelet};
use ebs_node_core::DevNum;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ebs_node_core::records::{
    AccessRecord, DeviceIdentity, Durability, FormatRecord, FormatState, LoopAttachment,
    LoopVolume, Progress, Publication, StagedVolume, now_unix_ms,
};
use ebs_store::Store;

mod known;

use crate::cli::RecoverArgs;
use crate::settings::STATE_FILE;
use ebs_node_backends::loopback::file_inode;
use ebs_node_core::node::ro_tag::AgentTag;
use ebs_node_core::probe::ProbeOutcome;
use ebs_node_host::blkid;
use ebs_node_host::device::block_devnum;
use ebs_node_host::loopdev;
use ebs_node_host::mount::table::MountTable;
use known::{block_bound, handle_device, nvme_volumes};

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
    match rebuild(&args.state_dir, &path, args.from_mounts) {
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

fn rebuild(state_dir: &Path, path: &Path, from_mounts: bool) -> Result<String, String> {
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
    if !from_mounts {
        return Ok("started an empty state file".into());
    }
    // Kept beside the state file, so the devices this agent attached and laid are still its.
    let agent_tag = ebs_node_host::instance::agent_tag(state_dir, path)
        .map_err(|e| format!("this agent's instance id: {e}"))?;
    let known = rebuild_loop_volumes(&store, state_dir, &agent_tag)?
        .into_iter()
        .chain(nvme_volumes())
        .collect::<Vec<_>>();
    let table = MountTable::read().map_err(|e| e.to_string())?;
    let (staged, published) = rebuild_mounts(&store, &known, &table, &agent_tag)?;
    Ok(format!(
        "rebuilt {} staged volume(s) and {} publication(s) from the mount table",
        staged, published
    ))
}

/// The loop backend's volumes are the files under `<state>/volumes/`.
fn rebuild_loop_volumes(
    store: &Store,
    state_dir: &Path,
    agent_tag: &AgentTag,
) -> Result<Vec<Known>, String> {
    let dir = state_dir.join("volumes");
    let mut known = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(known);
    };
    let node_id = ebs_node_backends::nodeinfo::hostname();
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
                node_id: node_id.clone(),
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

fn rebuild_mounts(
    store: &Store,
    known: &[Known],
    table: &MountTable,
    agent_tag: &AgentTag,
) -> Result<(usize, usize), String> {
    let mut by_numbers: HashMap<DevNum, &Known> = HashMap::new();
    for k in known {
        if let Ok(n) = block_devnum(&k.device) {
            by_numbers.insert(n, k);
        }
    }
    let mut staging_of: HashMap<String, PathBuf> = HashMap::new();
    let mut owner_of: HashMap<String, Option<String>> = HashMap::new();
    let mut handles: HashMap<DevNum, Known> = HashMap::new();
    let (mut staged, mut published) = (0, 0);
    // The devices a filesystem is mounted from, wherever in the table: a bind of such a device's
    // node is none of its volume's publications, whichever was made first (a sixty-fifth fresh
    // review's F2: a bind made before the filesystem's mount rebuilt the volume as a raw block
    // staging, and a block publish then handed out the node of a mounted ext4).
    let fs_mounted: std::collections::HashSet<DevNum> = (table.entries().iter())
        .filter(|m| m.fs_type != "devtmpfs" && m.fs_type != "tmpfs")
        .map(|m| DevNum::new(m.major, m.minor))
        .collect();
    // mountinfo lists mounts in the order they were made: a volume's first mount is its staging.
    for m in table.entries() {
        let block_bind = m.fs_type == "devtmpfs" || m.fs_type == "tmpfs";
        let mut read_only_device = false;
        // A bind of a device node is known by the numbers of the node bound there, never by
        // the name of the bind's root: a directory of a tmpfs named `loop0` (kubelet's subPath
        // of a memory emptyDir) is nobody's publication (a sixteenth fresh review's F2).
        let k = if block_bind {
            block_bound(&m.mount_point, &by_numbers, agent_tag).map(|(k, ro)| {
                read_only_device = ro;
                k
            })
        } else {
            by_numbers.get(&DevNum::new(m.major, m.minor)).copied()
        };
        // A device that is none of the agent's volumes: a node-local handle's where kubelet's
        // layout names that handle (a thirty-first fresh review's F1: its mounts were left with
        // no record, its unpublish and unstage answered OK, and the device was refused for good).
        let k = match k {
            Some(k) => k.clone(),
            None => match handle_device(m, block_bind, agent_tag, &mut handles) {
                Some((k, ro)) => {
                    read_only_device = ro;
                    k
                }
                None => continue,
            },
        };
        let k = &k;
        // Whose the mounts are: the first (staging) mount's name says it where kubelet made it.
        let chosen = owner_of
            .entry(k.volume_id.clone())
            .or_insert_with(|| {
                if k.volume_id.starts_with("local-") {
                    return None;
                }
                handle_named_by(&k.volume_id, &k.device, &m.mount_point)
            })
            .clone();
        let (vol, acts_for) = match &chosen {
            Some(handle) => (handle.as_str(), Some(k.volume_id.clone())),
            None => (k.volume_id.as_str(), None),
        };
        let first = !staging_of.contains_key(vol);
        // A bind of the node of a device whose first mount is a filesystem's is none of the
        // volume's publications: a filesystem volume is published by binds of its staging (a
        // fifty-seventh fresh review's F3: rebuilt as a block publication, it held the volume
        // from its unstage and the controller's detach, and no call could remove it).
        if block_bind
            && (staging_of
                .get(vol)
                .is_some_and(|at| !at.as_os_str().is_empty())
                || block_devnum(&k.device).is_ok_and(|d| fs_mounted.contains(&d)))
        {
            println!(
                "volume {vol}: a bind of its device node at {} is none of its publications (it \
                 is staged with a filesystem); left alone",
                m.mount_point.display()
            );
            continue;
        }
        if first && chosen.is_none() && !said_by_kubelet(&m.mount_point) {
            println!(
                "volume {vol}: {} does not say whether it was made through the volume's own id or a \
                 node-local handle naming its device; rebuilt under {vol} (if it was a handle's, \
                 unpublish and unstage it as {vol})",
                m.mount_point.display()
            );
        }
        if first {
            let (access, staging_path) = if block_bind {
                (AccessRecord::Block, PathBuf::new())
            } else {
                (
                    AccessRecord::Mount {
                        fs_type: m.fs_type.clone(),
                        mount_flags: Vec::new(),
                    },
                    m.mount_point.clone(),
                )
            };
            let record = StagedVolume {
                volume_id: vol.to_string(),
                staging_path: staging_path.clone(),
                device: k.device.clone(),
                devnum: block_devnum(&k.device).ok().map(Into::into),
                identity: k.identity.clone(),
                access,
                access_mode: 0,
                readonly: m.is_read_only(),
                // A filesystem staging rebuilt from a mount is in progress: the next start asks
                // the stage's post-mount questions (is the device's node bound anywhere, another
                // view of its bytes used) before it completes it, as for a stage a crash cut
                // after its mount (a fifty-seventh fresh review's F1: rebuilt complete, a publish
                // handed out a device bound elsewhere). A raw block staging has binds of its own.
                progress: if block_bind {
                    Progress::Complete
                } else {
                    Progress::InProgress
                },
                at_unix_ms: now_unix_ms(),
                // A device with no identity to prove is kept across restarts by its attachment.
                attachment: (k.identity == DeviceIdentity::Unverified)
                    .then(|| block_devnum(&k.device).ok())
                    .flatten()
                    .and_then(ebs_node_host::attachment::of),
            };
            let format = match blkid::probe(&k.device) {
                Ok(ProbeOutcome::Found(sig)) if !block_bind && !sig.is_partition_table => {
                    sig.uuid.map(|uuid| FormatRecord {
                        volume_id: vol.to_string(),
                        fs_type: sig.type_name,
                        uuid,
                        identity: k.identity.clone(),
                        state: FormatState::Done,
                        at_unix_ms: now_unix_ms(),
                        attachment: None,
                    })
                }
                _ => None,
            };
            // The device is the rebuilt volume's from the same commit (one owner per device).
            let claim = ebs_node_core::records::claim_key(
                ebs_node_core::records::ClaimDoor::Node,
                &record.identity,
                record.devnum.map(ebs_node_core::DevNum::from),
            )
            .map(|key| {
                let claim = ebs_node_core::records::DeviceClaim {
                    volume_id: record.volume_id.clone(),
                    door: ebs_node_core::records::ClaimDoor::Node,
                    identity: record.identity.clone(),
                    at_unix_ms: now_unix_ms(),
                    acts_for: acts_for.clone(),
                };
                (key, claim)
            });
            store
                .write(Durability::Immediate, |w| {
                    if let Some((key, claim)) = &claim {
                        w.put_claim(key, claim)?;
                    }
                    w.put_staged(&record)?;
                    if let Some(f) = &format {
                        w.put_format(f)?;
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            staging_of.insert(vol.to_string(), staging_path);
            staged += 1;
            println!(
                "volume {vol}: staged at {} ({})",
                m.mount_point.display(),
                k.device.display()
            );
            if !block_bind {
                continue;
            }
        }
        let publication = Publication {
            volume_id: vol.to_string(),
            target_path: m.mount_point.clone(),
            staging_path: staging_of.get(vol).cloned().unwrap_or_default(),
            block: block_bind,
            // A bind's read-only flag does not reach a device node: a raw block publication is
            // read-only by the agent's read-only device it binds.
            readonly: match block_bind {
                true => read_only_device,
                false => m.is_read_only(),
            },
            access_mode: 0,
            mount_flags: Vec::new(),
            // A publication rebuilt from a bind is in progress: the next start makes the bind
            // what a publish's is (`nodev`; for raw block, the agent's read-only device where
            // read-only, no other view of the bytes in use) before it completes it (a
            // sixty-fourth fresh review's F1: root's own bind, rebuilt complete, was handed out
            // as it was; a sixty-fifth's F1, its raw block form).
            progress: Progress::InProgress,
            at_unix_ms: now_unix_ms(),
        };
        store
            .write(Durability::Immediate, |w| w.put_publication(&publication))
            .map_err(|e| e.to_string())?;
        published += 1;
        let how = if read_only_device {
            " (read-only raw block, through its read-only device: kept)"
        } else {
            ""
        };
        println!(
            "volume {vol}: published at {}{how}",
            m.mount_point.display()
        );
    }
    Ok((staged, published))
}
