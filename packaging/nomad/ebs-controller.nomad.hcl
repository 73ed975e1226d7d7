# The controller side for Nomad: the same image in controller mode, one or two instances per
# cluster. With the ebs backend its controller service is the forwarding shim: it takes Nomad's
# CreateVolume/ControllerPublishVolume calls on the local socket and forwards them to the EBS
# controller you run (see `ebs-node-agent serve --help` for the shim's upstream settings).
# Nomad calls it for `nomad volume create` and for attaching volumes to clients.
job "ebs-controller" {
  type = "service"

  group "controller" {
    count = 2

    task "plugin" {
      driver = "docker"

      config {
        # Built from packaging/container/Dockerfile: set your registry.
        image = "ghcr.io/ebs-node-agent/ebs-node-agent:0.1.0"
        args  = ["serve"]
        # No privileges: a controller mounts nothing.
      }

      env {
        CSI_ENDPOINT         = "unix:///csi/csi.sock"
        EBS_AGENT_MODE       = "controller"
        EBS_AGENT_BACKEND    = "ebs"
        EBS_AGENT_STATE_DIR  = "/local/state"
        EBS_AGENT_LOG_FORMAT = "json"
      }

      csi_plugin {
        id             = "ebs.csi.aws.com"
        type           = "controller"
        mount_dir      = "/csi"
        health_timeout = "1m"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
