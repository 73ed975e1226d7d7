//! A stand-in for a remote CSI controller (the upstream EBS controller cannot run here): a tonic
//! server in the test process that records every request and its metadata, and answers with
//! scripted responses, errors or delays. Served on a unix socket, plain TCP, or TCP with TLS.

use std::any::Any;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::metadata::MetadataMap;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};

use crate::csi;
use csi::controller_server::{Controller, ControllerServer};

/// A request the fake saw.
pub struct Seen {
    pub rpc: &'static str,
    pub metadata: MetadataMap,
    pub request: Box<dyn Any + Send>,
}

#[derive(Default)]
struct State {
    seen: Vec<Seen>,
    replies: HashMap<&'static str, Box<dyn Any + Send>>,
    errors: HashMap<&'static str, (Code, String)>,
    delays: HashMap<&'static str, Duration>,
}

#[derive(Clone, Default)]
pub struct FakeController {
    state: Arc<Mutex<State>>,
}

impl FakeController {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers `rpc` with `resp` from now on (the default is the empty response).
    pub fn reply<T: Any + Clone + Send>(&self, rpc: &'static str, resp: T) {
        self.lock().replies.insert(rpc, Box::new(resp));
    }

    /// Answers `rpc` with this error from now on.
    pub fn fail(&self, rpc: &'static str, code: Code, message: &str) {
        self.lock().errors.insert(rpc, (code, message.to_string()));
    }

    /// Sleeps this long before answering `rpc`.
    pub fn delay(&self, rpc: &'static str, d: Duration) {
        self.lock().delays.insert(rpc, d);
    }

    pub fn count(&self) -> usize {
        self.lock().seen.len()
    }

    pub fn count_of(&self, rpc: &str) -> usize {
        self.lock().seen.iter().filter(|s| s.rpc == rpc).count()
    }

    /// The last request of type `T` seen for `rpc`, with its metadata.
    pub fn last<T: Any + Clone>(&self, rpc: &str) -> Option<(T, MetadataMap)> {
        let st = self.lock();
        let s = st.seen.iter().rev().find(|s| s.rpc == rpc)?;
        let req = s.request.downcast_ref::<T>()?.clone();
        Some((req, s.metadata.clone()))
    }

    async fn handle<Req, Resp>(
        &self,
        rpc: &'static str,
        req: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Any + Send,
        Resp: Any + Clone + Default + Send,
    {
        let (metadata, _, request) = req.into_parts();
        let (delay, error, reply) = {
            let mut st = self.lock();
            st.seen.push(Seen {
                rpc,
                metadata,
                request: Box::new(request),
            });
            (
                st.delays.get(rpc).copied(),
                st.errors.get(rpc).cloned(),
                st.replies
                    .get(rpc)
                    .and_then(|r| r.downcast_ref::<Resp>())
                    .cloned(),
            )
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if let Some((code, message)) = error {
            // Details and a trailer of its own, so tests can see that those pass through too.
            let mut trailers = MetadataMap::new();
            trailers.insert("x-upstream-error", "1".parse().expect("ascii"));
            let details = tonic::codegen::Bytes::from(format!("details: {message}"));
            return Err(Status::with_details_and_metadata(
                code, message, details, trailers,
            ));
        }
        let mut resp = Response::new(reply.unwrap_or_default());
        resp.metadata_mut()
            .insert("x-fake-upstream", "answered".parse().expect("ascii"));
        Ok(resp)
    }

    /// Serves on a unix socket until the handle is stopped or dropped.
    pub fn serve_unix(&self, path: &Path) -> Served {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).expect("bind fake controller socket");
        let incoming = UnixListenerStream::new(listener);
        let (tx, rx) = oneshot::channel::<()>();
        let svc = ControllerServer::new(self.clone());
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        Served {
            stop: Some(tx),
            task: Some(task),
            socket: Some(path.to_path_buf()),
        }
    }

    /// Serves on 127.0.0.1 (a free port), with TLS if given.
    pub async fn serve_tcp(&self, tls: Option<ServerTlsConfig>) -> (Served, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake controller port");
        let addr = listener.local_addr().expect("local addr");
        let incoming = TcpListenerStream::new(listener);
        let (tx, rx) = oneshot::channel::<()>();
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("server TLS config");
        }
        let router = builder.add_service(ControllerServer::new(self.clone()));
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        let served = Served {
            stop: Some(tx),
            task: Some(task),
            socket: None,
        };
        (served, addr)
    }
}

/// A running fake server; stops when dropped.
pub struct Served {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    socket: Option<PathBuf>,
}

impl Served {
    /// Stops accepting and closes its connections (HTTP/2 GOAWAY), as a restarting controller
    /// would, then removes the socket.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(s) = self.socket.take() {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(s) = self.socket.take() {
            let _ = std::fs::remove_file(s);
        }
    }
}

macro_rules! fake_all {
    ($($method:ident, $rpc:literal, $req:ident, $resp:ident;)*) => {
        #[tonic::async_trait]
        impl Controller for FakeController {
            $(
                async fn $method(
                    &self,
                    req: Request<csi::$req>,
                ) -> Result<Response<csi::$resp>, Status> {
                    self.handle($rpc, req).await
                }
            )*
        }
    };
}

fake_all! {
    create_volume, "CreateVolume", CreateVolumeRequest, CreateVolumeResponse;
    delete_volume, "DeleteVolume", DeleteVolumeRequest, DeleteVolumeResponse;
    controller_publish_volume, "ControllerPublishVolume", ControllerPublishVolumeRequest,
        ControllerPublishVolumeResponse;
    controller_unpublish_volume, "ControllerUnpublishVolume", ControllerUnpublishVolumeRequest,
        ControllerUnpublishVolumeResponse;
    validate_volume_capabilities, "ValidateVolumeCapabilities", ValidateVolumeCapabilitiesRequest,
        ValidateVolumeCapabilitiesResponse;
    list_volumes, "ListVolumes", ListVolumesRequest, ListVolumesResponse;
    get_capacity, "GetCapacity", GetCapacityRequest, GetCapacityResponse;
    controller_get_capabilities, "ControllerGetCapabilities", ControllerGetCapabilitiesRequest,
        ControllerGetCapabilitiesResponse;
    create_snapshot, "CreateSnapshot", CreateSnapshotRequest, CreateSnapshotResponse;
    delete_snapshot, "DeleteSnapshot", DeleteSnapshotRequest, DeleteSnapshotResponse;
    list_snapshots, "ListSnapshots", ListSnapshotsRequest, ListSnapshotsResponse;
    get_snapshot, "GetSnapshot", GetSnapshotRequest, GetSnapshotResponse;
    controller_expand_volume, "ControllerExpandVolume", ControllerExpandVolumeRequest,
        ControllerExpandVolumeResponse;
    controller_get_volume, "ControllerGetVolume", ControllerGetVolumeRequest,
        ControllerGetVolumeResponse;
    controller_modify_volume, "ControllerModifyVolume", ControllerModifyVolumeRequest,
        ControllerModifyVolumeResponse;
}
