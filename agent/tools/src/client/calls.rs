//! The client's calls: build a request, send it with a deadline, turn the answer into JSON.

use csi::controller_client::ControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ebs_proto::csi::v1 as csi;
use serde_json::{Value, json};
use tonic::Request;
use tonic::transport::Channel;

use super::{Call, CapArgs, ClientArgs, ControllerCall, IdentityCall, ModeArg, NodeCall, to_map};

pub enum ClientError {
    Status(tonic::Status),
    Other(String),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Status(s)
    }
}

pub fn capability(c: &CapArgs) -> csi::VolumeCapability {
    use csi::volume_capability::access_mode::Mode;
    let mode = match c.mode {
        ModeArg::SingleNodeWriter => Mode::SingleNodeWriter,
        ModeArg::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
        ModeArg::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
        ModeArg::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
        ModeArg::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        ModeArg::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
        ModeArg::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
    };
    let access_type = if c.block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: c.fs_type.clone(),
            mount_flags: c.mount_flags.clone(),
            ..Default::default()
        })
    };
    csi::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn req<T>(msg: T, args: &ClientArgs) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(args.timeout);
    r
}

fn volume_json(v: &csi::Volume) -> Value {
    json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": v.volume_context,
        "accessible_topology": v.accessible_topology.iter().map(|t| &t.segments).collect::<Vec<_>>(),
    })
}

pub async fn run(args: &ClientArgs) -> Result<Value, ClientError> {
    let channel: Channel = super::connect::channel(&args.endpoint)
        .await
        .map_err(|e| ClientError::Other(e.to_string()))?;
    match &args.call {
        Call::Identity(call) => identity(channel, call, args).await,
        Call::Controller(call) => controller(channel, call, args).await,
        Call::Node(call) => node(channel, call, args).await,
        Call::Bench(_) => Err(ClientError::Other("bench runs through client::run".into())),
    }
}

async fn identity(
    ch: Channel,
    call: &IdentityCall,
    args: &ClientArgs,
) -> Result<Value, ClientError> {
    let mut c = IdentityClient::new(ch);
    Ok(match call {
        IdentityCall::Info => {
            let r = c
                .get_plugin_info(req(csi::GetPluginInfoRequest {}, args))
                .await?
                .into_inner();
            json!({"name": r.name, "vendor_version": r.vendor_version, "manifest": r.manifest})
        }
        IdentityCall::Capabilities => {
            let r = c
                .get_plugin_capabilities(req(csi::GetPluginCapabilitiesRequest {}, args))
                .await?
                .into_inner();
            json!({"capabilities": r.capabilities.iter().map(|c| format!("{:?}", c.r#type)).collect::<Vec<_>>()})
        }
        IdentityCall::Probe => {
            let r = c.probe(req(csi::ProbeRequest {}, args)).await?.into_inner();
            json!({"ready": r.ready})
        }
    })
}

async fn controller(
    ch: Channel,
    call: &ControllerCall,
    args: &ClientArgs,
) -> Result<Value, ClientError> {
    let mut c = ControllerClient::new(ch);
    Ok(match call {
        ControllerCall::CreateVolume {
            name,
            size,
            params,
            cap,
        } => {
            let r = c
                .create_volume(req(
                    csi::CreateVolumeRequest {
                        name: name.clone(),
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: *size as i64,
                            limit_bytes: 0,
                        }),
                        volume_capabilities: vec![capability(cap)],
                        parameters: to_map(params),
                        ..Default::default()
                    },
                    args,
                ))
                .await?
                .into_inner();
            r.volume.as_ref().map_or(Value::Null, volume_json)
        }
        ControllerCall::DeleteVolume { id } => {
            c.delete_volume(req(
                csi::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                },
                args,
            ))
            .await?;
            json!({"deleted": id})
        }
        ControllerCall::Publish {
            id,
            node_id,
            readonly,
            cap,
        } => {
            let r = c
                .controller_publish_volume(req(
                    csi::ControllerPublishVolumeRequest {
                        volume_id: id.clone(),
                        node_id: node_id.clone(),
                        volume_capability: Some(capability(cap)),
                        readonly: *readonly,
                        ..Default::default()
                    },
                    args,
                ))
                .await?
                .into_inner();
            json!({"publish_context": r.publish_context})
        }
        ControllerCall::Unpublish { id, node_id } => {
            c.controller_unpublish_volume(req(
                csi::ControllerUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: node_id.clone(),
                    ..Default::default()
                },
                args,
            ))
            .await?;
            json!({"unpublished": id})
        }
        ControllerCall::Expand { id, size } => {
            let r = c
                .controller_expand_volume(req(
                    csi::ControllerExpandVolumeRequest {
                        volume_id: id.clone(),
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: *size as i64,
                            limit_bytes: 0,
                        }),
                        ..Default::default()
                    },
                    args,
                ))
                .await?
                .into_inner();
            json!({"capacity_bytes": r.capacity_bytes, "node_expansion_required": r.node_expansion_required})
        }
        ControllerCall::ListVolumes {
            max_entries,
            starting_token,
        } => {
            let r = c
                .list_volumes(req(
                    csi::ListVolumesRequest {
                        max_entries: *max_entries,
                        starting_token: starting_token.clone(),
                    },
                    args,
                ))
                .await?
                .into_inner();
            json!({
                "entries": r.entries.iter().map(|e| json!({
                    "volume": e.volume.as_ref().map_or(Value::Null, volume_json),
                    "published_node_ids": e.status.as_ref().map(|s| s.published_node_ids.clone()).unwrap_or_default(),
                })).collect::<Vec<_>>(),
                "next_token": r.next_token,
            })
        }
        ControllerCall::Capacity => {
            let r = c
                .get_capacity(req(csi::GetCapacityRequest::default(), args))
                .await?
                .into_inner();
            json!({"available_capacity": r.available_capacity})
        }
        ControllerCall::Capabilities => {
            let r = c
                .controller_get_capabilities(req(csi::ControllerGetCapabilitiesRequest {}, args))
                .await?
                .into_inner();
            json!({"capabilities": r.capabilities.iter().map(|c| format!("{:?}", c.r#type)).collect::<Vec<_>>()})
        }
    })
}

async fn node(ch: Channel, call: &NodeCall, args: &ClientArgs) -> Result<Value, ClientError> {
    let mut c = NodeClient::new(ch);
    Ok(match call {
        NodeCall::Stage {
            id,
            staging_path,
            publish_context,
            volume_context,
            cap,
        } => {
            c.node_stage_volume(req(
                csi::NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    publish_context: to_map(publish_context),
                    staging_target_path: staging_path.clone(),
                    volume_capability: Some(capability(cap)),
                    volume_context: to_map(volume_context),
                    ..Default::default()
                },
                args,
            ))
            .await?;
            json!({"staged": id, "staging_path": staging_path})
        }
        NodeCall::Unstage { id, staging_path } => {
            c.node_unstage_volume(req(
                csi::NodeUnstageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging_path.clone(),
                },
                args,
            ))
            .await?;
            json!({"unstaged": id})
        }
        NodeCall::Publish {
            id,
            staging_path,
            target_path,
            readonly,
            cap,
        } => {
            c.node_publish_volume(req(
                csi::NodePublishVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging_path.clone(),
                    target_path: target_path.clone(),
                    volume_capability: Some(capability(cap)),
                    readonly: *readonly,
                    ..Default::default()
                },
                args,
            ))
            .await?;
            json!({"published": id, "target_path": target_path})
        }
        NodeCall::Unpublish { id, target_path } => {
            c.node_unpublish_volume(req(
                csi::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: target_path.clone(),
                },
                args,
            ))
            .await?;
            json!({"unpublished": id})
        }
        NodeCall::Stats { id, volume_path } => {
            let r = c
                .node_get_volume_stats(req(
                    csi::NodeGetVolumeStatsRequest {
                        volume_id: id.clone(),
                        volume_path: volume_path.clone(),
                        staging_target_path: String::new(),
                    },
                    args,
                ))
                .await?
                .into_inner();
            json!({
                "usage": r.usage.iter().map(|u| json!({
                    "unit": u.unit, "total": u.total, "used": u.used, "available": u.available,
                })).collect::<Vec<_>>(),
                "abnormal": r.volume_condition.as_ref().map(|c| c.abnormal),
                "message": r.volume_condition.as_ref().map(|c| c.message.clone()),
            })
        }
        NodeCall::Expand {
            id,
            volume_path,
            size,
        } => {
            let r = c
                .node_expand_volume(req(
                    csi::NodeExpandVolumeRequest {
                        volume_id: id.clone(),
                        volume_path: volume_path.clone(),
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: *size as i64,
                            limit_bytes: 0,
                        }),
                        ..Default::default()
                    },
                    args,
                ))
                .await?
                .into_inner();
            json!({"capacity_bytes": r.capacity_bytes})
        }
        NodeCall::Info => {
            let r = c
                .node_get_info(req(csi::NodeGetInfoRequest {}, args))
                .await?
                .into_inner();
            json!({
                "node_id": r.node_id,
                "max_volumes_per_node": r.max_volumes_per_node,
                "accessible_topology": r.accessible_topology.map(|t| t.segments),
            })
        }
        NodeCall::Capabilities => {
            let r = c
                .node_get_capabilities(req(csi::NodeGetCapabilitiesRequest {}, args))
                .await?
                .into_inner();
            json!({"capabilities": r.capabilities.iter().map(|c| format!("{:?}", c.r#type)).collect::<Vec<_>>()})
        }
    })
}

/// Text output: one `key: value` line per field.
pub fn print_human(v: &Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::String(s) => println!("{k}: {s}"),
                    other => println!("{k}: {other}"),
                }
            }
        }
        other => println!("{other}"),
    }
}
