//! The Controller service of the ebs backend: every call is forwarded unchanged to the remote
//! controller (`--controller-upstream`). Request, response, status code and message pass through
//! as they are; the caller's deadline and metadata go along. While the upstream is down, calls
//! answer UNAVAILABLE at once (with a backoff between attempts to reach it) and node work goes on.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use csi::controller_client::ControllerClient;
use csi::controller_server::Controller;
use ebs_proto::csi::v1 as csi;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::upstream::Upstream;

/// Headers that belong to one hop (HTTP/2 and gRPC framing), not to the call: the next hop sets
/// its own. `grpc-timeout` is re-set from the caller's deadline.
const HOP_HEADERS: &[&str] = &[
    "te",
    "content-type",
    "content-length",
    "user-agent",
    "host",
    "date",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
];

const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

fn strip_hop_headers(mut md: MetadataMap) -> MetadataMap {
    for h in HOP_HEADERS {
        md.remove(*h);
    }
    md
}

/// Whether the upstream can be tried now: closed while calls go through, open (failing fast)
/// after a transport failure until the backoff has passed, when one call may try again.
#[derive(Default)]
struct Link {
    down: Mutex<Option<Down>>,
}

struct Down {
    since: Instant,
    failures: u32,
    retry_at: Instant,
    error: String,
}

impl Link {
    /// `Ok` holds when the call was let through, to tell later whether it was a retry.
    fn admit(&self, url: &str) -> Result<Instant, Status> {
        let now = Instant::now();
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        let Some(d) = down.as_mut() else {
            return Ok(now);
        };
        if now < d.retry_at {
            return Err(Status::unavailable(format!(
                "controller upstream {url} is unreachable: {}; next attempt in {} ms",
                d.error,
                (d.retry_at - now).as_millis()
            )));
        }
        // This call tries; the others keep failing fast until it knows.
        d.retry_at = now + backoff(d.failures);
        Ok(now)
    }

    fn succeeded(&self, url: &str) {
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = down.take() {
            tracing::info!(
                upstream = url,
                down_ms = d.since.elapsed().as_millis() as u64,
                "controller upstream reachable again"
            );
        }
    }

    fn failed(&self, url: &str, error: String, admitted: Instant) {
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match down.as_mut() {
            // Calls already in flight when the link broke say nothing new.
            Some(d) if admitted < d.since => {}
            Some(d) => {
                d.failures = d.failures.saturating_add(1);
                d.retry_at = now + backoff(d.failures);
                d.error = error;
            }
            None => {
                tracing::warn!(
                    upstream = url,
                    %error,
                    "controller upstream unreachable: Controller calls answer UNAVAILABLE until \
                     it is back; node operations do not need it and go on"
                );
                *down = Some(Down {
                    since: now,
                    failures: 1,
                    retry_at: now + BACKOFF_FIRST,
                    error,
                });
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

/// What a failed forward means: the upstream's own answer (passed on unchanged), the caller's
/// deadline passing, or a broken link (hyper's "canceled" included: the connection went away).
enum Failure {
    Answered(Status),
    Deadline(Status),
    Link(String),
}

fn classify(st: Status) -> Failure {
    // A status decoded from the upstream's trailers has no source; one made on this side
    // (connect, TLS, HTTP/2, timeout) carries the error that caused it.
    let Some(source) = std::error::Error::source(&st) else {
        return Failure::Answered(st);
    };
    let mut cause = Some(source);
    let mut chain = vec![st.message().to_string()];
    while let Some(e) = cause {
        if e.is::<tonic::TimeoutExpired>() {
            return Failure::Deadline(Status::deadline_exceeded(
                "the call's deadline passed while the controller upstream was working on it",
            ));
        }
        let text = e.to_string();
        if !chain.contains(&text) {
            chain.push(text);
        }
        cause = e.source();
    }
    Failure::Link(chain.join(": "))
}

pub struct ControllerShim {
    upstream: Upstream,
    link: Link,
}

impl ControllerShim {
    pub fn new(upstream: Upstream) -> Self {
        ControllerShim {
            upstream,
            link: Link::default(),
        }
    }

    /// Tries the upstream once in the background so an operator sees at start whether it is
    /// reachable; the answer goes to the log only.
    pub fn check_at_start(self: &std::sync::Arc<Self>) {
        let shim = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let req = Request::new(csi::ControllerGetCapabilitiesRequest {});
            let call = shim
                .forward(
                    "ControllerGetCapabilities",
                    String::new(),
                    req,
                    |mut c, r| async move { c.controller_get_capabilities(r).await },
                )
                .await;
            if call.is_ok() {
                tracing::info!(upstream = %shim.upstream.url, "controller upstream reachable");
            }
        });
    }

    async fn forward<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        subject: String,
        req: Request<Req>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(ControllerClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let started = Instant::now();
        let url = &self.upstream.url;
        let deadline = super::grpc_timeout(&req);
        let result = match self.link.admit(url) {
            Err(st) => Err(st),
            Ok(admitted) => {
                let (metadata, extensions, message) = req.into_parts();
                let mut out = Request::from_parts(strip_hop_headers(metadata), extensions, message);
                if let Some(d) = deadline {
                    out.set_timeout(d);
                }
                let client = ControllerClient::new(self.upstream.channel.clone());
                match call(client, out).await {
                    Ok(resp) => {
                        self.link.succeeded(url);
                        let (metadata, message, extensions) = resp.into_parts();
                        Ok(Response::from_parts(
                            strip_hop_headers(metadata),
                            message,
                            extensions,
                        ))
                    }
                    Err(st) => match classify(st) {
                        Failure::Answered(st) => {
                            self.link.succeeded(url);
                            // Code, message, details and the upstream's own trailers, unchanged.
                            Err(Status::with_details_and_metadata(
                                st.code(),
                                st.message().to_string(),
                                st.details().to_vec().into(),
                                strip_hop_headers(st.metadata().clone()),
                            ))
                        }
                        Failure::Deadline(st) => Err(st),
                        Failure::Link(error) => {
                            let st = Status::unavailable(format!(
                                "controller upstream {url} is unreachable: {error}"
                            ));
                            self.link.failed(url, error, admitted);
                            Err(st)
                        }
                    },
                }
            }
        };
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        crate::metrics::observe_rpc(rpc, result.as_ref().err().map(Status::code), ms);
        // Requests carry secrets: only the call's name and subject are logged, never its fields.
        match &result {
            Ok(_) => tracing::info!(rpc, volume = subject, ms = format!("{ms:.2}"), "forwarded"),
            Err(st) => tracing::warn!(rpc, volume = subject, ms = format!("{ms:.2}"),
                code = ?st.code(), error = st.message(), "forwarded; failed"),
        }
        result
    }
}

/// One forwarding method per Controller RPC: `method, "Name", Request, Response, |r| subject`.
macro_rules! forward_all {
    ($($method:ident, $rpc:literal, $req:ident, $resp:ident, |$r:ident| $subject:expr;)*) => {
        #[tonic::async_trait]
        impl Controller for ControllerShim {
            $(
                async fn $method(
                    &self,
                    req: Request<csi::$req>,
                ) -> Result<Response<csi::$resp>, Status> {
                    let subject = {
                        let $r = req.get_ref();
                        $subject.to_string()
                    };
                    self.forward($rpc, subject, req, |mut c, r| async move { c.$method(r).await })
                        .await
                }
            )*
        }
    };
}

forward_all! {
    create_volume, "CreateVolume", CreateVolumeRequest, CreateVolumeResponse, |r| r.name;
    delete_volume, "DeleteVolume", DeleteVolumeRequest, DeleteVolumeResponse, |r| r.volume_id;
    controller_publish_volume, "ControllerPublishVolume", ControllerPublishVolumeRequest,
        ControllerPublishVolumeResponse, |r| r.volume_id;
    controller_unpublish_volume, "ControllerUnpublishVolume", ControllerUnpublishVolumeRequest,
        ControllerUnpublishVolumeResponse, |r| r.volume_id;
    validate_volume_capabilities, "ValidateVolumeCapabilities", ValidateVolumeCapabilitiesRequest,
        ValidateVolumeCapabilitiesResponse, |r| r.volume_id;
    list_volumes, "ListVolumes", ListVolumesRequest, ListVolumesResponse, |_r| "";
    get_capacity, "GetCapacity", GetCapacityRequest, GetCapacityResponse, |_r| "";
    controller_get_capabilities, "ControllerGetCapabilities", ControllerGetCapabilitiesRequest,
        ControllerGetCapabilitiesResponse, |_r| "";
    create_snapshot, "CreateSnapshot", CreateSnapshotRequest, CreateSnapshotResponse,
        |r| r.source_volume_id;
    delete_snapshot, "DeleteSnapshot", DeleteSnapshotRequest, DeleteSnapshotResponse,
        |r| r.snapshot_id;
    list_snapshots, "ListSnapshots", ListSnapshotsRequest, ListSnapshotsResponse,
        |r| r.source_volume_id;
    get_snapshot, "GetSnapshot", GetSnapshotRequest, GetSnapshotResponse, |r| r.snapshot_id;
    controller_expand_volume, "ControllerExpandVolume", ControllerExpandVolumeRequest,
        ControllerExpandVolumeResponse, |r| r.volume_id;
    controller_get_volume, "ControllerGetVolume", ControllerGetVolumeRequest,
        ControllerGetVolumeResponse, |r| r.volume_id;
    controller_modify_volume, "ControllerModifyVolume", ControllerModifyVolumeRequest,
        ControllerModifyVolumeResponse, |r| r.volume_id;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), BACKOFF_FIRST);
        assert_eq!(backoff(2), BACKOFF_FIRST * 2);
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn upstream_answers_pass_unchanged() {
        let st = Status::new(Code::ResourceExhausted, "quota for gp3 volumes reached");
        match classify(st) {
            Failure::Answered(st) => {
                assert_eq!(st.code(), Code::ResourceExhausted);
                assert_eq!(st.message(), "quota for gp3 volumes reached");
            }
            _ => panic!("an upstream answer must pass unchanged"),
        }
    }

    #[test]
    fn link_fails_fast_then_lets_one_call_try() {
        let link = Link::default();
        let first = link.admit("u").unwrap();
        link.failed("u", "connection refused".into(), first);
        let st = link.admit("u").unwrap_err();
        assert_eq!(st.code(), Code::Unavailable);
        assert!(
            st.message().contains("connection refused"),
            "{}",
            st.message()
        );
        std::thread::sleep(BACKOFF_FIRST);
        assert!(link.admit("u").is_ok(), "after the backoff one call tries");
        assert!(link.admit("u").is_err(), "the others still fail fast");
        link.succeeded("u");
        assert!(link.admit("u").is_ok());
    }

    #[test]
    fn hop_headers_are_dropped_and_the_rest_kept() {
        let mut md = MetadataMap::new();
        md.insert("grpc-timeout", "100m".parse().unwrap());
        md.insert("te", "trailers".parse().unwrap());
        md.insert("csi.requestid", "42".parse().unwrap());
        let md = strip_hop_headers(md);
        assert!(md.get("grpc-timeout").is_none() && md.get("te").is_none());
        assert_eq!(md.get("csi.requestid").unwrap(), "42");
    }
}
