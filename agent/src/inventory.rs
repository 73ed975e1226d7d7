//! What the state file knows, as one JSON document: the Admin service's Status answer and what
//! `ebs-node-agent status` reads from the file when no agent runs. Its shape is stable (scripts
//! and tests read `status --json`).

use serde_json::{Value, json};

use ebs_store::Store;

/// Everything the store knows, one object per volume.
pub fn snapshot(store: &Store) -> Result<Value, ebs_store::StoreError> {
    let mut volumes = Vec::new();
    for id in store.known_volume_ids()? {
        let staged = store.staged(&id)?;
        let publications = store.publications(&id)?;
        let format = store.format(&id)?;
        let last = store.journal(&id)?.pop();
        volumes.push(json!({
            "volume_id": id,
            "staged": staged.as_ref().map(|s| json!({
                "staging_path": s.staging_path, "device": s.device,
                "progress": s.progress, "readonly": s.readonly, "access": s.access,
            })),
            "published": publications.iter().map(|p| json!({
                "target_path": p.target_path, "readonly": p.readonly, "progress": p.progress,
            })).collect::<Vec<_>>(),
            "filesystem": format.as_ref().map(|f| json!({
                "fs_type": f.fs_type, "uuid": f.uuid, "state": f.state,
            })),
            "last_step": last.as_ref().map(|s| json!({
                "op": s.op, "step": s.step, "phase": s.phase, "at_unix_ms": s.at_unix_ms,
            })),
        }));
    }
    let loop_volumes: Vec<Value> = store
        .loop_volumes()?
        .iter()
        .map(|v| {
            json!({
                "volume_id": v.id, "name": v.name, "capacity_bytes": v.capacity_bytes,
                "file": v.file, "attached": v.attachment.as_ref().map(|a| &a.device),
            })
        })
        .collect();
    Ok(json!({ "volumes": volumes, "loop_volumes": loop_volumes }))
}
