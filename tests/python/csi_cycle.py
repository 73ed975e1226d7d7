"""A real gRPC C-core client (grpcio) through the agent's unix socket: Probe, then a full
create / attach / stage / publish / write / read / unpublish / unstage / detach / delete cycle.

grpcio sends the socket path as :authority (C-core >= 1.57); the agent must serve it anyway.
Then the CSI-Addons socket's GetIdentity, through the same kind of channel.
Usage: csi_cycle.py SOCKET STUB_DIR WORK_DIR ADDONS_SOCKET. Prints one JSON object; exits
non-zero on failure.
"""

import json
import os
import sys

sock, stubs, work, addons_sock = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, stubs)

import grpc  # noqa: E402
from csi.v1 import csi_pb2 as pb  # noqa: E402
from csi.v1 import csi_pb2_grpc as rpc  # noqa: E402
import identity_pb2 as addons_pb  # noqa: E402
import identity_pb2_grpc as addons_rpc  # noqa: E402

channel = grpc.insecure_channel("unix:" + sock)
identity = rpc.IdentityStub(channel)
controller = rpc.ControllerStub(channel)
node = rpc.NodeStub(channel)
timeout = 60

probe = identity.Probe(pb.ProbeRequest(), timeout=timeout)
info = identity.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=timeout)
node_id = node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=timeout).node_id

cap = pb.VolumeCapability(
    mount=pb.VolumeCapability.MountVolume(fs_type="ext4"),
    access_mode=pb.VolumeCapability.AccessMode(
        mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)
vol = controller.CreateVolume(
    pb.CreateVolumeRequest(
        name="grpcio-cycle",
        capacity_range=pb.CapacityRange(required_bytes=16 << 20),
        volume_capabilities=[cap],
    ),
    timeout=timeout,
).volume
attached = controller.ControllerPublishVolume(
    pb.ControllerPublishVolumeRequest(
        volume_id=vol.volume_id, node_id=node_id, volume_capability=cap
    ),
    timeout=timeout,
)
staging = os.path.join(work, "staging")
target = os.path.join(work, "target")
node.NodeStageVolume(
    pb.NodeStageVolumeRequest(
        volume_id=vol.volume_id,
        publish_context=attached.publish_context,
        staging_target_path=staging,
        volume_capability=cap,
    ),
    timeout=timeout,
)
node.NodePublishVolume(
    pb.NodePublishVolumeRequest(
        volume_id=vol.volume_id,
        publish_context=attached.publish_context,
        staging_target_path=staging,
        target_path=target,
        volume_capability=cap,
    ),
    timeout=timeout,
)
with open(os.path.join(target, "hello"), "w") as f:
    f.write("from grpcio")
with open(os.path.join(target, "hello")) as f:
    read_back = f.read()
stats = node.NodeGetVolumeStats(
    pb.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=target),
    timeout=timeout,
)
try:
    node.NodeGetVolumeStats(
        pb.NodeGetVolumeStatsRequest(volume_id="lv-unknown", volume_path="some/path"),
        timeout=timeout,
    )
    unknown = "OK"
except grpc.RpcError as e:
    unknown = e.code().name
node.NodeUnpublishVolume(
    pb.NodeUnpublishVolumeRequest(volume_id=vol.volume_id, target_path=target),
    timeout=timeout,
)
node.NodeUnstageVolume(
    pb.NodeUnstageVolumeRequest(volume_id=vol.volume_id, staging_target_path=staging),
    timeout=timeout,
)
controller.ControllerUnpublishVolume(
    pb.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id=node_id),
    timeout=timeout,
)
controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vol.volume_id), timeout=timeout)

addons = addons_rpc.IdentityStub(grpc.insecure_channel("unix:" + addons_sock))
addons_identity = addons.GetIdentity(addons_pb.GetIdentityRequest(), timeout=timeout)

print(
    json.dumps(
        {
            "grpc_version": grpc.__version__,
            "ready": probe.ready.value,
            "driver": info.name,
            "volume": vol.volume_id,
            "read_back": read_back,
            "stats_units": len(stats.usage),
            "unknown_volume_stats": unknown,
            "addons_driver": addons_identity.name,
        }
    )
)
