//! The Node service at the gRPC boundary, in tables, over the core's recording double of the
//! host (`ebs_node_core::double`, the dev-dependency's `double` feature): each case is what the
//! host and the records hold before, one request in, and the code and the host calls out. The
//! lifecycle's tables run through the v1 door and the v0.3 door (the same request recoded: the
//! two share their field numbers), which must answer alike. The whole daemon side runs as it does in the agent (validation, the volume's guard, the blocking
//! pool, the mapping to a code); only the host is the double, so these run as any user. The root
//! tests (`tests/tests/`) prove the same doors on real devices.

use std::sync::Arc;
use std::time::Duration;

use ebs_node_core::double::Harness;
use ebs_node_core::double::host::GIB;
use ebs_node_core::node::Unobserved;
use ebs_proto::csi::v1 as csi;
use ebs_store::Store;
use tonic::{Code, Request};

use super::node::NodeService;
use crate::node::AgentCtx;
use csi::node_server::Node;
use ebs_node_backends::nodeinfo::{NodeInfo, NodeInfoSource};

const VOL: &str = ebs_node_core::double::VOL;

/// The agent's Node service over the double, ready (start-up recovery done).
pub struct Rig {
    pub h: Harness,
    pub svc: Arc<NodeService>,
}

impl Rig {
    pub fn new() -> Rig {
        let h = Harness::new();
        let store = Arc::new(Store::open(&h.dir.join("state.redb")).expect("store"));
        let ctx = AgentCtx {
            node: h.context(Arc::new(Unobserved)),
            store,
            health: Default::default(),
            attention: Default::default(),
        };
        ctx.health.set_ready();
        let info = NodeInfoSource::known(NodeInfo {
            node_id: "node-1".into(),
            max_volumes: 25,
            topology: Default::default(),
        });
        let svc = Arc::new(NodeService {
            roots: Arc::new(h.roots().clone()),
            ctx: Arc::new(ctx),
            info: Arc::new(info),
            device_wait: Duration::from_secs(2),
            stats_in_flight: Default::default(),
        });
        Rig { h, svc }
    }

    /// A request path under the allowed root.
    pub fn at(&self, rel: &str) -> String {
        self.h.dir.join("allowed").join(rel).display().to_string()
    }

    pub fn staging(&self) -> String {
        self.at(&format!("staging/{VOL}"))
    }

    pub fn target(&self) -> String {
        self.at("pods/p1/mount")
    }
}

/// What the host and the records hold before the case's request.
#[derive(Clone, Copy, Debug)]
pub enum Given {
    /// VOL's device is attached, blank.
    Attached,
    /// VOL is staged at `Rig::staging` (ext4, single writer).
    Staged,
    /// VOL is staged for raw block access.
    StagedBlock,
    /// VOL is published at `Rig::target` (after `Staged`).
    Published,
    /// VOL's device grew to 2 GiB (from 1).
    Grown,
    /// The double's next call of this name fails with this errno name.
    Failing(&'static str, &'static str),
}

pub fn mount_cap(fs: &str) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

pub fn block_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn stage_req(rig: &Rig, cap: csi::VolumeCapability) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: VOL.into(),
        staging_target_path: rig.staging(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn publish_req(rig: &Rig, cap: csi::VolumeCapability) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: VOL.into(),
        staging_target_path: rig.staging(),
        target_path: rig.target(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

/// Brings the rig to `given` through the service itself, then forgets the calls it made.
pub async fn arrange(rig: &Rig, given: &[Given]) {
    for g in given {
        match *g {
            Given::Attached => {
                rig.h.attach(VOL);
            }
            Given::Staged | Given::StagedBlock => {
                if rig.h.host.state().devices.is_empty() {
                    rig.h.attach(VOL);
                }
                let cap = match g {
                    Given::Staged => mount_cap("ext4"),
                    _ => block_cap(),
                };
                let req = Request::new(stage_req(rig, cap));
                rig.svc.node_stage_volume(req).await.expect("given: staged");
            }
            Given::Published => {
                let req = Request::new(publish_req(rig, mount_cap("ext4")));
                rig.svc
                    .node_publish_volume(req)
                    .await
                    .expect("given: published");
            }
            Given::Grown => {
                let device = rig.h.dir.join("dev").join(format!("dev-{VOL}"));
                let devnum = rig.h.host.devnum(&device);
                let mut state = rig.h.host.state();
                state.device_bytes.insert(devnum, 2 * GIB);
            }
            Given::Failing(call, why) => rig.h.host.fail(call, why),
        }
    }
    rig.h.host.state().calls.clear();
}

/// The code a call answered, `Ok` for success.
pub fn code<T>(answer: &Result<tonic::Response<T>, tonic::Status>) -> Code {
    match answer {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// One row: its name, what is there before, what it asks, the code and host calls expected.
pub struct Case<R> {
    pub name: &'static str,
    pub given: &'static [Given],
    pub request: fn(&Rig) -> R,
    pub code: Code,
    pub calls: &'static [&'static str],
}

/// The v0.3 door's request for a v1 request: the same fields under their old names, so the
/// same bytes.
pub fn to_v0<A: prost::Message, B: prost::Message + Default>(a: A) -> B {
    super::v0::recode(&a).expect("the v0.3 request shares the v1 request's field numbers")
}

/// The v0.3 Node door over the rig's v1 service.
pub fn v0_door(rig: &Rig) -> super::v0::node::V0Node {
    super::v0::node::V0Node {
        v1: Arc::clone(&rig.svc),
    }
}

/// Runs each row on a rig of its own through `rpc`; every mismatch is reported, then fails.
pub async fn run_table<R, T, F>(door: &str, rows: Vec<Case<R>>, rpc: F)
where
    F: AsyncFn(&Rig, R) -> Result<tonic::Response<T>, tonic::Status>,
{
    let mut wrong = Vec::new();
    for row in rows {
        let rig = Rig::new();
        arrange(&rig, row.given).await;
        let answer = rpc(&rig, (row.request)(&rig)).await;
        let calls = rig.h.host.calls();
        let want: Vec<String> = row.calls.iter().map(|c| c.to_string()).collect();
        if code(&answer) != row.code || calls != want {
            let got = code(&answer);
            let status = answer.err().map(|s| s.message().to_string());
            wrong.push(format!(
                "{door}: {}: got {got:?} {calls:?} ({status:?}), want {:?} {want:?}",
                row.name, row.code
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A table's test: its rows through the v1 door, then the same rows through the v0.3 door.
macro_rules! through_both_doors {
    ($rpc:ident, $rows:ident, $v0_request:ident) => {
        #[tokio::test]
        async fn $rpc() {
            use ebs_proto::csi::v0;
            use tonic::Request;
            use v0::node_server::Node as _;
            run_table("v1", $rows(), async |rig: &Rig, r| {
                rig.svc.$rpc(Request::new(r)).await
            })
            .await;
            run_table("v0.3", $rows(), async |rig: &Rig, r| {
                let r = to_v0::<_, v0::$v0_request>(r);
                v0_door(rig).$rpc(Request::new(r)).await
            })
            .await;
        }
    };
}

mod publish;
mod queries;
mod reclaim;
mod stage;
