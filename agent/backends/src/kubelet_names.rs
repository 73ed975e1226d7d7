//! What a mount's path says about the id that made it: kubelet's layout (`vol_data.json`, the
//! staging directory named after the volume handle's SHA-256) and the agent's own v0.1 staging
//! directory tell a node-local handle's mounts from its volume's, which the device alone cannot.
//! The node-local backend adopts a handle's mount only at a path named for it (`named_for`);
//! `recover --from-mounts` tells whose a mount is (`handle_named_by`, `said_by_kubelet`).

use std::path::{Path, PathBuf};

use ebs_node_core::request::VolumeId;

/// The agent's v0.1 staging directories' parent, below its state directory: v0.1 has no
/// staging path of its own, so the agent stages there, in a directory named for the id.
pub const V01_STAGING_DIR: &str = "v01-staging";

/// Whether `staging` is a staging path named for `volume`: kubelet's
/// `<SHA-256 of the handle>/globalmount`, or the agent's v0.1 directory for it.
pub fn named_for(volume: &VolumeId, staging: &Path) -> bool {
    let name = staging.file_name().and_then(|n| n.to_str());
    let parent = staging
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str());
    match (name, parent) {
        (Some("globalmount"), Some(hash)) => hash == sha256_hex(volume.as_str()),
        (Some(name), Some(V01_STAGING_DIR)) => volume.file_name().as_deref() == Some(name),
        _ => false,
    }
}

/// The node-local handle (`local-ebs://dev/<name>`) whose staging directory kubelet made at
/// `staging` for the volume `volume_id` found on `device`, when it is one: kubelet names a CSI volume's staging directory
/// `…/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`, so a mount made
/// through a handle is told from one made through the volume's own id, which the device alone
/// cannot tell. The handle is one of the device's names in /dev (its own, or a link to it).
pub fn handle_named_by(volume_id: &str, device: &Path, staging: &Path) -> Option<String> {
    let said = kubelet_volume_handle(staging).is_some() || v01_staging_id(staging).is_some();
    // A staging directory named after the volume's own id is the volume's, not a handle's.
    if !said && staging.parent()?.file_name()?.to_str()? == sha256_hex(volume_id) {
        return None;
    }
    handle_at(device, staging)
}

/// The node-local handle kubelet's layout (or the agent's v0.1 staging directory) at `at` says
/// a mount of `device` was made through: its `vol_data.json` naming a handle of this very
/// device, or a staging directory named after the SHA-256 of one of the device's /dev names.
pub fn handle_at(device: &Path, at: &Path) -> Option<String> {
    let node = std::fs::canonicalize(device).ok()?;
    // kubelet's own record of the volume beside the mount says which handle it used; the
    // agent's v0.1 staging directory is named after the id itself.
    if let Some(handle) = kubelet_volume_handle(at).or_else(|| v01_staging_id(at)) {
        let named = VolumeId::parse(&handle).ok()?;
        let device = named.local_device()?;
        return std::fs::canonicalize(device)
            .is_ok_and(|d| d == node)
            .then_some(handle);
    }
    if at.file_name()? != "globalmount" {
        return None;
    }
    let hash = at.parent()?.file_name()?.to_str()?;
    if hash.len() != 64 {
        return None;
    }
    device_names(&node)
        .into_iter()
        .map(|name| format!("local-ebs://{}", name.trim_start_matches('/')))
        .find(|handle| sha256_hex(handle) == hash)
}

/// The `volumeHandle` kubelet wrote in `vol_data.json` for the volume mounted at `at`: beside a
/// filesystem staging or publication directory, and for a raw block publication
/// (`…/volumeDevices/publish/<pv>/<pod>`) in `…/volumeDevices/<pv>/data/`.
fn kubelet_volume_handle(at: &Path) -> Option<String> {
    let parent = at.parent()?;
    let mut candidates = vec![parent.join("vol_data.json")];
    if parent.parent()?.file_name()? == "publish" {
        let pv = parent.file_name()?;
        let devices = parent.parent()?.parent()?;
        candidates.push(devices.join(pv).join("data").join("vol_data.json"));
    }
    candidates.into_iter().find_map(|file| {
        let text = std::fs::read_to_string(file).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("volumeHandle")?.as_str().map(str::to_string)
    })
}

/// Whether kubelet's layout at `at` names the volume handle (its `vol_data.json`, or a staging
/// directory named after the handle's SHA-256).
pub fn said_by_kubelet(at: &Path) -> bool {
    kubelet_volume_handle(at).is_some() || at.file_name().is_some_and(|n| n == "globalmount")
}

/// The node-local handle a v0.1 staging directory (`<state>/v01-staging/<escaped id>`) stands
/// for: `VolumeId::file_name` turned back (`local-ebs:dev:xvdbz` is `local-ebs://dev/xvdbz`).
fn v01_staging_id(staging: &Path) -> Option<String> {
    if staging.parent()?.file_name()? != V01_STAGING_DIR {
        return None;
    }
    let name = staging.file_name()?.to_str()?;
    let rest = name.strip_prefix("local-ebs:")?;
    let id = format!("local-ebs://{}", rest.replace(':', "/"));
    let parsed = VolumeId::parse(&id).ok()?;
    (parsed.file_name().as_deref() == Some(name)).then_some(id)
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The paths in /dev that name `node` (itself, and the links to it at any depth; at most 100,000
/// entries are looked at).
fn device_names(node: &Path) -> Vec<String> {
    let mut names = vec![node.display().to_string()];
    let mut dirs = vec![(PathBuf::from("/dev"), 0)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = dirs.pop() {
        seen += 1;
        if seen > 100_000 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(kind) = e.file_type() else { continue };
            seen += 1;
            if kind.is_dir() && depth < 32 {
                dirs.push((path, depth + 1));
            } else if kind.is_symlink() && std::fs::canonicalize(&path).is_ok_and(|p| p == node) {
                names.push(path.display().to_string());
            }
        }
    }
    names
}
