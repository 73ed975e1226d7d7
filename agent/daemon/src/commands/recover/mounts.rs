//! The records `--from-mounts` rebuilds from the mount table: a volume's first filesystem mount
//! is its staging, binds of it its publications, binds of its device node its raw block staging
//! and publications (a device a filesystem is mounted from has none).

use std::collections::HashMap;
use std::path::PathBuf;

use ebs_node_backends::kubelet_names::{handle_named_by, said_by_kubelet};
use ebs_node_core::DevNum;
use ebs_node_core::node::ro_tag::AgentTag;
use ebs_node_core::probe::ProbeOutcome;
use ebs_node_core::records::{
    AccessRecord, DeviceIdentity, Durability, FormatRecord, FormatState, Progress, Publication,
    StagedVolume, now_unix_ms,
};
use ebs_node_host::blkid;
use ebs_node_host::device::block_devnum;
use ebs_node_host::mount::table::MountTable;
use ebs_store::Store;

use super::Known;
use super::known::{block_bound, handle_device};
use super::passed_over::{Bounds, passed_over};

pub(super) fn rebuild_mounts(
    store: &Store,
    known: &[Known],
    table: &MountTable,
    agent_tag: &AgentTag,
    bounds: &Bounds,
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
    let mut taken: Vec<&ebs_node_host::mount::table::MountEntry> = Vec::new();
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
        if k.is_some()
            && let Some(why) = passed_over(m, block_bind, table, &taken, bounds)
        {
            println!(
                "{}: none of a volume's mounts ({why}); left alone",
                m.mount_point.display()
            );
            continue;
        }
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
                // A raw block staging's binds are its publications, each read-only or not on its
                // own (a sixty-seventh fresh review's F3: a read-only one's bind, rebuilt first,
                // made every later publication read-only).
                readonly: !block_bind && m.is_read_only(),
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
            taken.push(m);
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
        taken.push(m);
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
