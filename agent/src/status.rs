//! `status`: what the agent knows, from the running agent (which holds the state file's lock)
//! or, when none runs, from the state file itself.

use serde_json::{Value, json};

use ebs_store::Store;

use crate::cli::StatusArgs;
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

pub fn print(value: &Value, as_json: bool) {
    if as_json {
        println!("{value}");
        return;
    }
    let empty = Vec::new();
    let volumes = value["volumes"].as_array().unwrap_or(&empty);
    if volumes.is_empty() {
        println!("no staged or published volumes");
    }
    for v in volumes {
        println!("{}", v["volume_id"].as_str().unwrap_or("?"));
        if let Some(f) = v["filesystem"].as_object() {
            println!(
                "  filesystem: {} {} ({})",
                f["fs_type"], f["uuid"], f["state"]
            );
        }
        if let Some(s) = v["staged"].as_object() {
            println!(
                "  staged at {} on {} ({})",
                s["staging_path"], s["device"], s["progress"]
            );
        }
        for p in v["published"].as_array().unwrap_or(&empty) {
            println!("  published at {} ({})", p["target_path"], p["progress"]);
        }
        if let Some(l) = v["last_step"].as_object() {
            println!(
                "  last step: {}.{} {} at {} ms",
                l["op"], l["step"], l["phase"], l["at_unix_ms"]
            );
        }
    }
    for v in value["loop_volumes"].as_array().unwrap_or(&empty) {
        println!(
            "loop volume {} ({}), {} bytes, attached: {}",
            v["volume_id"], v["name"], v["capacity_bytes"], v["attached"]
        );
    }
}

async fn from_agent(endpoint: &str) -> Option<Value> {
    let channel = crate::client::connect::channel(endpoint).await.ok()?;
    let mut admin = ebs_proto::admin::admin_client::AdminClient::new(channel);
    let mut req = tonic::Request::new(ebs_proto::admin::StatusRequest {});
    req.set_timeout(std::time::Duration::from_secs(10));
    let resp = admin.status(req).await.ok()?;
    serde_json::from_str(&resp.into_inner().json).ok()
}

pub async fn status(args: StatusArgs) -> i32 {
    if args.endpoint.path().exists()
        && let Some(v) = from_agent(&args.endpoint.url()).await
    {
        print(&v, args.json);
        return 0;
    }
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
