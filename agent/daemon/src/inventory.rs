//! What the state file knows, as one JSON document: the Admin service's Status answer and what
//! `ebs-node-agent status` reads from the file when no agent runs. Its shape is stable (scripts
//! and tests read `status --json`).

use serde_json::{Value, json};

use ebs_store::Store;

/// Everything the store knows, one object per volume. A volume whose records do not decode shows
/// as `unreadable` with the error; the others are unaffected.
pub fn snapshot(store: &Store) -> Result<Value, ebs_store::StoreError> {
    let mut volumes = Vec::new();
    for id in store.known_volume_ids()? {
        volumes.push(volume(store, &id).unwrap_or_else(
            |e| json!({ "volume_id": id, "unreadable": e.to_string(), "published": [] }),
        ));
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

fn volume(store: &Store, id: &str) -> Result<Value, ebs_store::StoreError> {
    let staged = store.staged(id)?;
    let publications = store.publications(id)?;
    let format = store.format(id)?;
    let last = store.journal(id)?.pop();
    Ok(json!({
        "volume_id": id,
        "staged": staged.as_ref().map(|s| json!({
            "staging_path": s.staging_path, "device": s.device,
            "progress": s.progress, "readonly": s.readonly, "access": s.access,
            "access_mode": access_mode_name(s.access_mode),
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
    }))
}

/// The access mode a volume was staged with, by the CSI enum's name (what the CO asked for:
/// kubelet sends SINGLE_NODE_MULTI_WRITER for ReadWriteOnce, SINGLE_NODE_SINGLE_WRITER for
/// ReadWriteOncePod); a number the enum does not know is shown as the number.
fn access_mode_name(raw: i32) -> Value {
    use ebs_proto::csi::v1::volume_capability::access_mode::Mode;
    Mode::try_from(raw).map_or_else(|_| json!(raw), |m| json!(m.as_str_name()))
}

/// The running agent's marks (`node::attention`): each marked volume's `needs_attention`.
pub fn add_attention(doc: &mut Value, mut marks: std::collections::HashMap<String, Value>) {
    let Some(volumes) = doc["volumes"].as_array_mut() else {
        return;
    };
    for v in volumes.iter_mut() {
        if let Some(mark) = v["volume_id"].as_str().and_then(|id| marks.remove(id)) {
            v["needs_attention"] = mark;
        }
    }
    let mut rest: Vec<_> = marks.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for (id, mark) in rest {
        volumes.push(json!({ "volume_id": id, "published": [], "needs_attention": mark }));
    }
}

#[cfg(test)]
mod tests {
    use super::access_mode_name;

    #[test]
    fn access_modes_show_by_their_csi_names_and_unknown_ones_by_number() {
        assert_eq!(access_mode_name(7), "SINGLE_NODE_MULTI_WRITER");
        assert_eq!(access_mode_name(6), "SINGLE_NODE_SINGLE_WRITER");
        assert_eq!(access_mode_name(1), "SINGLE_NODE_WRITER");
        assert_eq!(access_mode_name(99), 99);
    }
}
