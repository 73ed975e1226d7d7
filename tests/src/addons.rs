//! Helpers for the CSI-Addons tests: the second socket, its clients, and what the backing
//! storage really holds.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ebs_proto::identity as aid;
use ebs_proto::reclaimspace as rs;
use tonic::transport::Channel;

use crate::{AgentOpts, Scratch, channel, sh};

pub const MIB: u64 = 1 << 20;

pub fn addons_socket(scratch: &Scratch) -> PathBuf {
    scratch.join("run/addons.sock")
}

pub fn opts(scratch: &Scratch, extra: &[&str]) -> AgentOpts {
    let mut args: Vec<String> = vec![
        "--backend".into(),
        "loop".into(),
        "--csi-addons-endpoint".into(),
        format!("unix://{}", addons_socket(scratch).display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    AgentOpts {
        args,
        ..AgentOpts::default()
    }
}

pub async fn addons_identity(scratch: &Scratch) -> aid::identity_client::IdentityClient<Channel> {
    aid::identity_client::IdentityClient::new(channel(&addons_socket(scratch)).await.unwrap())
}

pub async fn reclaimer(
    scratch: &Scratch,
) -> rs::reclaim_space_node_client::ReclaimSpaceNodeClient<Channel> {
    rs::reclaim_space_node_client::ReclaimSpaceNodeClient::new(
        channel(&addons_socket(scratch)).await.unwrap(),
    )
}

/// What the CSI-Addons sidecar sends: the staging path and an empty volume_path.
pub fn reclaim_req(volume: &str, staging: &Path) -> rs::NodeReclaimSpaceRequest {
    rs::NodeReclaimSpaceRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        ..Default::default()
    }
}

pub fn usage(r: &rs::NodeReclaimSpaceResponse) -> (u64, u64) {
    let bytes = |c: &Option<rs::StorageConsumption>| c.as_ref().expect("usage").usage_bytes as u64;
    (bytes(&r.pre_usage), bytes(&r.post_usage))
}

pub fn backing_file(device: &str) -> PathBuf {
    let name = Path::new(device).file_name().unwrap().to_str().unwrap();
    let raw = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    PathBuf::from(raw.trim())
}

pub fn discard_max_bytes(device: &str) -> u64 {
    let name = Path::new(device).file_name().unwrap().to_str().unwrap();
    std::fs::read_to_string(format!("/sys/block/{name}/queue/discard_max_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Bytes the file really occupies (st_blocks is in 512-byte units).
pub fn allocated(file: &Path) -> u64 {
    std::fs::metadata(file).unwrap().blocks() * 512
}

/// Writes `bytes` of non-zero data (zeroes could be skipped by a clever layer) and fsyncs.
pub fn fill(path: &Path, bytes: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    for _ in 0..bytes / MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

pub fn free_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    st.blocks_free() as u64 * st.fragment_size()
}

/// "Deleted" means the filesystem freed the blocks: xfs frees a deleted file's extents in a
/// background worker (inodegc), which syncfs does not wait for.
pub fn wait_freed(path: &Path, want_free: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while free_bytes(path) < want_free {
        assert!(std::time::Instant::now() < deadline, "blocks never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn service_types(caps: &[aid::Capability]) -> (Vec<i32>, Vec<i32>) {
    use aid::capability::Type;
    let mut services = Vec::new();
    let mut reclaim = Vec::new();
    for c in caps {
        match &c.r#type {
            Some(Type::Service(s)) => services.push(s.r#type),
            Some(Type::ReclaimSpace(r)) => reclaim.push(r.r#type),
            other => panic!("unexpected capability {other:?}"),
        }
    }
    services.sort();
    (services, reclaim)
}

/// Thaws a frozen filesystem when dropped, so a failing test never leaves I/O hanging.
/// Declare it after the `Agent`: a thread blocked on the frozen filesystem would keep the agent
/// from dying.
pub struct Thaw(PathBuf);

impl Thaw {
    pub fn freeze(mount: &Path) -> Thaw {
        sh(&format!("fsfreeze --freeze {}", mount.display()));
        Thaw(mount.to_path_buf())
    }
}

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .arg("--unfreeze")
            .arg(&self.0)
            .status();
    }
}
