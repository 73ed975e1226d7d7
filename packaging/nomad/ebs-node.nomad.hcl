# ebs-node-agent as Nomad's CSI node plugin on every Linux client: `nomad job run ebs-node.nomad.hcl`.
# Needs on each client: the docker driver with `allow_privileged = true` and `volumes { enabled = true }`
# in its plugin block (privileged for mount(2); volumes for the host /dev and state bind mounts).
job "ebs-node-agent" {
  type = "system"

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "node" {
    task "plugin" {
      driver = "docker"

      config {
        # Built from packaging/container/Dockerfile: set your registry.
        image      = "ghcr.io/ebs-node-agent/ebs-node-agent:0.1.0"
        args       = ["serve"]
        privileged = true
        # The host's PID namespace, so that the agent sees every process's mount namespace (a
        # workload's bind of a raw block device keeps its device; docs/design.md).
        pid_mode = "host"

        # Docker's privileged /dev is a snapshot taken at start: volumes attached later would never
        # appear in it. The host's /dev does show them.
        mount {
          type   = "bind"
          source = "/dev"
          target = "/dev"
        }
        # The state file must outlive the task: it is how a restarted agent knows what it staged.
        mount {
          type   = "bind"
          source = "/var/lib/ebs-node-agent"
          target = "/var/lib/ebs-node-agent"
        }
        mount {
          type     = "bind"
          source   = "/run/udev"
          target   = "/run/udev"
          readonly = true
        }
      }

      env {
        # Nomad looks for the socket as csi.sock in mount_dir.
        CSI_ENDPOINT              = "unix:///csi/csi.sock"
        EBS_AGENT_MODE            = "node"
        EBS_AGENT_BACKEND         = "ebs"
        EBS_AGENT_STATE_DIR       = "/var/lib/ebs-node-agent"
        EBS_AGENT_LOG_FORMAT      = "json"
        EBS_AGENT_METRICS_ADDRESS = "127.0.0.1:9809"
      }

      csi_plugin {
        id                     = "ebs.csi.aws.com"
        type                   = "node"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
        # Start-up recovery re-checks staged volumes before Probe answers ready.
        health_timeout = "2m"
      }

      # Longer than the agent's shutdown grace (EBS_AGENT_SHUTDOWN_GRACE, 30s).
      kill_timeout = "45s"

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
