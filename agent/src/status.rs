//! `status` and `recover`: what the agent knows, read from its state file.

use serde_json::{Value, json};

use ebs_store::Store;

use crate::cli::{RecoverArgs, StatusArgs};
use crate::server::STATE_FILE;

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
    Ok(json!({ "volumes": volumes }))
}

pub fn print(value: &Value, as_json: bool) {
    if as_json {
        println!("{value}");
        return;
    }
    let empty = Vec::new();
    let volumes = value["volumes"].as_array().unwrap_or(&empty);
    if volumes.is_empty() {
        println!("no volumes");
    }
    for v in volumes {
        println!("{}", v["volume_id"].as_str().unwrap_or("?"));
        if let Some(s) = v["staged"].as_object() {
            println!("  staged at {} ({})", s["staging_path"], s["progress"]);
        }
        for p in v["published"].as_array().unwrap_or(&empty) {
            println!("  published at {} ({})", p["target_path"], p["progress"]);
        }
        if let Some(l) = v["last_step"].as_object() {
            println!(
                "  last step: {}.{} {} at {}",
                l["op"], l["step"], l["phase"], l["at_unix_ms"]
            );
        }
    }
}

pub async fn status(args: StatusArgs) -> i32 {
    let path = args.state_dir.join(STATE_FILE);
    match Store::open_read_only(&path).and_then(|s| snapshot(&s)) {
        Ok(v) => {
            print(&v, args.json);
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

pub fn recover(args: RecoverArgs) -> i32 {
    let _ = args;
    eprintln!("error: recover is not implemented yet");
    1
}
