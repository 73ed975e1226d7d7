//! What the Controller shim tests send and expect: one request with every field set for each
//! of the 15 Controller RPCs of CSI 1.12, a canned upstream response for each, and the check that
//! both cross the shim unchanged, with the caller's metadata.

use std::collections::HashMap;

use csi::controller_client::ControllerClient;
use csi::volume_capability::access_mode::Mode;
use tonic::Request;
use tonic::transport::Channel;

use crate::AgentOpts;
use crate::csi;
use crate::csi_req::{block_cap, mount_cap};
use crate::fake_controller::FakeController;

pub const SECRET: &str = "s3cr3t-never-in-logs";

/// Agent options for `--backend ebs --mode controller` forwarding to `upstream`.
pub fn shim_opts(upstream: &str, extra: &[&str]) -> AgentOpts {
    let mut args: Vec<String> = ["--backend", "ebs", "--mode", "controller"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--controller-upstream".to_string(), upstream.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    AgentOpts {
        args,
        ..Default::default()
    }
}

pub fn unix_url(path: &std::path::Path) -> String {
    format!("unix://{}", path.display())
}

pub fn secrets() -> HashMap<String, String> {
    HashMap::from([("key".to_string(), SECRET.to_string())])
}

pub fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: map(&[("topology.ebs.csi.aws.com/zone", zone)]),
    }
}

pub fn volume(id: &str) -> csi::Volume {
    csi::Volume {
        capacity_bytes: 5 << 30,
        volume_id: id.into(),
        volume_context: map(&[("fsType", "xfs")]),
        content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: "snap-1".into(),
                },
            )),
        }),
        accessible_topology: vec![topology("eu-west-1a")],
    }
}

pub fn snapshot(id: &str) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: 1 << 30,
        snapshot_id: id.into(),
        source_volume_id: "vol-0abc".into(),
        creation_time: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 42,
        }),
        ready_to_use: true,
        group_snapshot_id: "group-1".into(),
    }
}

pub fn last_like<T: Clone + 'static>(
    fake: &FakeController,
    rpc: &str,
    _like: &T,
) -> Option<(T, tonic::metadata::MetadataMap)> {
    fake.last::<T>(rpc)
}

/// Sends one request through `client` with trace metadata and checks that the upstream saw the
/// request and metadata unchanged and that its canned response came back unchanged.
macro_rules! check_forwarded {
    ($client:expr, $fake:expr, $method:ident, $rpc:literal, $req:expr, $resp:expr) => {{
        let req = $req;
        let resp = $resp;
        $fake.reply($rpc, resp.clone());
        let mut call = Request::new(req.clone());
        call.metadata_mut()
            .insert("x-trace-id", concat!("trace-", $rpc).parse().unwrap());
        call.metadata_mut().insert_bin(
            "x-blob-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01\xff"),
        );
        let got = $client
            .$method(call)
            .await
            .unwrap_or_else(|e| panic!("{} through the shim: {e:?}", $rpc));
        assert_eq!(
            got.get_ref(),
            &resp,
            "{}: response changed on the way",
            $rpc
        );
        assert_eq!(
            got.metadata()
                .get("x-fake-upstream")
                .map(|v| v.to_str().unwrap()),
            Some("answered"),
            "{}: response metadata lost",
            $rpc
        );
        let (seen, md) =
            last_like(&$fake, $rpc, &req).unwrap_or_else(|| panic!("{} not forwarded", $rpc));
        assert_eq!(seen, req, "{}: request changed on the way", $rpc);
        assert_eq!(md.get("x-trace-id").unwrap(), concat!("trace-", $rpc));
        assert_eq!(
            md.get_bin("x-blob-bin")
                .unwrap()
                .to_bytes()
                .unwrap()
                .as_ref(),
            b"\x00\x01\xff"
        );
    }};
}

/// Every Controller RPC through `client`, each checked against what `fake` saw and answered.
pub async fn check_all_rpcs(client: &mut ControllerClient<Channel>, fake: &FakeController) {
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    check_forwarded!(
        client,
        fake,
        create_volume,
        "CreateVolume",
        csi::CreateVolumeRequest {
            name: "pvc-1234".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 5 << 30,
                limit_bytes: 10 << 30
            }),
            volume_capabilities: vec![cap.clone(), block_cap(Mode::MultiNodeMultiWriter)],
            parameters: map(&[("type", "gp3"), ("iops", "4000")]),
            secrets: secrets(),
            volume_content_source: volume("x").content_source,
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology("eu-west-1a"), topology("eu-west-1b")],
                preferred: vec![topology("eu-west-1b")],
            }),
            mutable_parameters: map(&[("throughput", "250")]),
        },
        csi::CreateVolumeResponse {
            volume: Some(volume("vol-0abc"))
        }
    );
    check_forwarded!(
        client,
        fake,
        delete_volume,
        "DeleteVolume",
        csi::DeleteVolumeRequest {
            volume_id: "vol-0abc".into(),
            secrets: secrets()
        },
        csi::DeleteVolumeResponse {}
    );
    check_forwarded!(
        client,
        fake,
        controller_publish_volume,
        "ControllerPublishVolume",
        csi::ControllerPublishVolumeRequest {
            volume_id: "vol-0abc".into(),
            node_id: "i-0123456789abcdef0".into(),
            volume_capability: Some(cap.clone()),
            readonly: true,
            secrets: secrets(),
            volume_context: map(&[("fsType", "xfs")]),
        },
        csi::ControllerPublishVolumeResponse {
            publish_context: map(&[("devicePath", "/dev/xvdba")])
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_unpublish_volume,
        "ControllerUnpublishVolume",
        csi::ControllerUnpublishVolumeRequest {
            volume_id: "vol-0abc".into(),
            node_id: "i-0123456789abcdef0".into(),
            secrets: secrets(),
        },
        csi::ControllerUnpublishVolumeResponse {}
    );
    check_forwarded!(
        client,
        fake,
        validate_volume_capabilities,
        "ValidateVolumeCapabilities",
        csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "vol-0abc".into(),
            volume_context: map(&[("a", "b")]),
            volume_capabilities: vec![cap.clone()],
            parameters: map(&[("type", "io2")]),
            secrets: secrets(),
            mutable_parameters: map(&[("iops", "3000")]),
        },
        csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: map(&[("a", "b")]),
                volume_capabilities: vec![cap.clone()],
                parameters: map(&[("type", "io2")]),
                mutable_parameters: map(&[("iops", "3000")]),
            }),
            message: "confirmed by upstream".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        list_volumes,
        "ListVolumes",
        csi::ListVolumesRequest {
            max_entries: 7,
            starting_token: "tok-3".into()
        },
        csi::ListVolumesResponse {
            entries: vec![csi::list_volumes_response::Entry {
                volume: Some(volume("vol-1")),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: vec!["i-1".into(), "i-2".into()],
                    volume_condition: Some(csi::VolumeCondition {
                        abnormal: true,
                        message: "degraded".into()
                    }),
                }),
            }],
            next_token: "tok-4".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        get_capacity,
        "GetCapacity",
        csi::GetCapacityRequest {
            volume_capabilities: vec![cap.clone()],
            parameters: map(&[("type", "gp3")]),
            accessible_topology: Some(topology("eu-west-1c")),
        },
        csi::GetCapacityResponse {
            available_capacity: 1 << 40,
            maximum_volume_size: Some(16 << 40),
            minimum_volume_size: Some(1 << 30),
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_get_capabilities,
        "ControllerGetCapabilities",
        csi::ControllerGetCapabilitiesRequest {},
        csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![csi::ControllerServiceCapability {
                r#type: Some(csi::controller_service_capability::Type::Rpc(
                    csi::controller_service_capability::Rpc {
                        r#type: csi::controller_service_capability::rpc::Type::ModifyVolume as i32,
                    },
                )),
            }],
        }
    );
    check_forwarded!(
        client,
        fake,
        create_snapshot,
        "CreateSnapshot",
        csi::CreateSnapshotRequest {
            source_volume_id: "vol-0abc".into(),
            name: "snapshot-1".into(),
            secrets: secrets(),
            parameters: map(&[("tagSpecification_1", "k=v")]),
        },
        csi::CreateSnapshotResponse {
            snapshot: Some(snapshot("snap-1"))
        }
    );
    check_forwarded!(
        client,
        fake,
        delete_snapshot,
        "DeleteSnapshot",
        csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets()
        },
        csi::DeleteSnapshotResponse {}
    );
    check_forwarded!(
        client,
        fake,
        list_snapshots,
        "ListSnapshots",
        csi::ListSnapshotsRequest {
            max_entries: 3,
            starting_token: "t".into(),
            source_volume_id: "vol-0abc".into(),
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        },
        csi::ListSnapshotsResponse {
            entries: vec![csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot("snap-1"))
            }],
            next_token: "t2".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        get_snapshot,
        "GetSnapshot",
        csi::GetSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets()
        },
        csi::GetSnapshotResponse {
            snapshot: Some(snapshot("snap-1"))
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_expand_volume,
        "ControllerExpandVolume",
        csi::ControllerExpandVolumeRequest {
            volume_id: "vol-0abc".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 20 << 30,
                limit_bytes: 0
            }),
            secrets: secrets(),
            volume_capability: Some(cap.clone()),
        },
        csi::ControllerExpandVolumeResponse {
            capacity_bytes: 20 << 30,
            node_expansion_required: true
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_get_volume,
        "ControllerGetVolume",
        csi::ControllerGetVolumeRequest {
            volume_id: "vol-0abc".into()
        },
        csi::ControllerGetVolumeResponse {
            volume: Some(volume("vol-0abc")),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec!["i-1".into()],
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: false,
                    message: "ok".into()
                }),
            }),
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_modify_volume,
        "ControllerModifyVolume",
        csi::ControllerModifyVolumeRequest {
            volume_id: "vol-0abc".into(),
            secrets: secrets(),
            mutable_parameters: map(&[("iops", "6000"), ("throughput", "500")]),
        },
        csi::ControllerModifyVolumeResponse {}
    );
}
