# Registers an existing EBS volume with Nomad: `nomad volume register volume.hcl`.
# Jobs then claim it with a `volume` block (type = "csi", source = "mysql-data").
id          = "mysql-data"
name        = "mysql-data"
type        = "csi"
plugin_id   = "ebs.csi.aws.com"
external_id = "vol-0123456789abcdef0"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

# Add a topology_request with the zone of the volume, using the key and value that the node
# plugin reports (`ebs-node-agent client --endpoint ... node info` shows them), so that Nomad
# places claims only on clients in that zone.
