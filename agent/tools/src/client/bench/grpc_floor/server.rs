//! The gRPC floor's server: the floor's host work (`floor`'s functions) behind a bare tonic CSI
//! server with tonic's defaults, in a process of its own (`ebs-bench-grpc-floor`, which runs it
//! on a runtime like the agent's). No check, no journal, no layer: what any CSI plugin pays to do
//! this work over the protocol.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ebs_node_core::request::FsType;
use ebs_node_host::fstools::FsTools;
use ebs_proto::csi::v1 as csi;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use super::super::floor;

/// `ebs-bench-grpc-floor`'s arguments: started by the bench only.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The unix socket to serve on (made by this process).
    #[arg(long)]
    pub socket: PathBuf,
    /// Filesystem the volumes carry.
    #[arg(long)]
    pub fs_type: String,
    /// A file of `volume-id<TAB>device` lines: the device each volume's calls work on.
    #[arg(long)]
    pub devices: PathBuf,
    /// Make the checks of one owner per device around each stage's mount (`floor::owned`).
    #[arg(long)]
    pub checks: bool,
}

#[derive(Clone)]
struct GrpcFloor {
    tools: Arc<FsTools>,
    fs: FsType,
    devices: Arc<HashMap<String, PathBuf>>,
    checks: bool,
}

/// Serves until killed; returns an error only when it cannot start.
pub async fn serve(args: &ServeArgs) -> Result<(), String> {
    let fs = FsType::parse(&args.fs_type).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&args.devices)
        .map_err(|e| format!("reading {}: {e}", args.devices.display()))?;
    let devices = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(id, dev)| (id.to_string(), PathBuf::from(dev)))
        .collect();
    let listener = UnixListener::bind(&args.socket)
        .map_err(|e| format!("binding {}: {e}", args.socket.display()))?;
    // A bench killed outright cannot kill its server: the server notices it was orphaned.
    // (PR_SET_PDEATHSIG would fire when the spawning thread ends, not the bench.)
    let parent = nix::unistd::getppid();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            if nix::unistd::getppid() != parent {
                std::process::exit(1);
            }
        }
    });
    let service = GrpcFloor {
        tools: Arc::new(FsTools::detect()),
        fs,
        devices: Arc::new(devices),
        checks: args.checks,
    };
    tonic::transport::Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(service.clone()))
        .add_service(csi::node_server::NodeServer::new(service))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await
        .map_err(|e| format!("serving: {e}"))
}

impl GrpcFloor {
    fn device(&self, volume_id: &str) -> Result<PathBuf, Status> {
        self.devices
            .get(volume_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no device for {volume_id:?}")))
    }
}

/// Runs a call's host work off the async workers: a tool runs for tens of milliseconds, and an
/// unmount of a filesystem waits for its writes; a worker blocked there would leave the other
/// calls waiting while a core idles.
async fn done<T>(
    work: impl FnOnce() -> Result<(), String> + Send + 'static,
    reply: T,
) -> Result<Response<T>, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map(|()| Response::new(reply))
        .map_err(Status::internal)
}

/// Runs a call's host work in place: a bind, its unmount and statvfs do not wait for the disk,
/// and a hand-off to another thread would cost more than they do.
fn done_inline<T>(
    work: impl FnOnce() -> Result<(), String>,
    reply: T,
) -> Result<Response<T>, Status> {
    work()
        .map(|()| Response::new(reply))
        .map_err(Status::internal)
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl csi::node_server::Node for GrpcFloor {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Answer<csi::NodeStageVolumeResponse> {
        let req = req.into_inner();
        let (dev, this) = (self.device(&req.volume_id)?, self.clone());
        let stage = move || {
            let staging = Path::new(&req.staging_target_path);
            if this.checks {
                floor::owned(&dev)?;
            }
            floor::probe(&dev)?;
            floor::check(&this.tools, this.fs, &dev)?;
            floor::mount(this.fs, &dev, staging)?;
            if this.checks {
                floor::owned(&dev)?;
            }
            Ok(())
        };
        done(stage, csi::NodeStageVolumeResponse {}).await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Answer<csi::NodeUnstageVolumeResponse> {
        let staging = req.into_inner().staging_target_path;
        let unstage = move || floor::unstage(Path::new(&staging));
        done(unstage, csi::NodeUnstageVolumeResponse {}).await
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Answer<csi::NodePublishVolumeResponse> {
        let req = req.into_inner();
        let publish = move || {
            floor::publish(
                Path::new(&req.staging_target_path),
                Path::new(&req.target_path),
            )
        };
        done_inline(publish, csi::NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Answer<csi::NodeUnpublishVolumeResponse> {
        let target = req.into_inner().target_path;
        let unpublish = move || floor::unpublish(Path::new(&target));
        done_inline(unpublish, csi::NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Answer<csi::NodeGetVolumeStatsResponse> {
        let path = req.into_inner().volume_path;
        let stats = move || floor::stats(Path::new(&path));
        done_inline(stats, csi::NodeGetVolumeStatsResponse::default())
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Answer<csi::NodeExpandVolumeResponse> {
        Err(Status::unimplemented("the gRPC floor does not expand"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Answer<csi::NodeGetCapabilitiesResponse> {
        use csi::node_service_capability::{Rpc, Type, rpc};
        let cap = |t: rpc::Type| csi::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::StageUnstageVolume),
                cap(rpc::Type::GetVolumeStats),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Answer<csi::NodeGetInfoResponse> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: "grpc-floor".into(),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for GrpcFloor {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Answer<csi::GetPluginInfoResponse> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "grpc-floor.bench.invalid".into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Answer<csi::GetPluginCapabilitiesResponse> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Answer<csi::ProbeResponse> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
