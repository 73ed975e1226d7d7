#!/usr/bin/env bash
# Writes DIR/deploy/kustomization.yaml: tests/k8s/loop (the shipped manifests plus the loop
# backend in mode `all` and the controller sidecars) with every host path moved under DIR
# (kubelet's root directory DIR/kubelet, the agent's state DIR/agent-state, /run/udev: DIR/udev,
# which the loop backend does not need) and the health and
# metrics ports on free ports. Deploy with `kubectl apply -k DIR/deploy`.
#   tests/k8s/overlay.sh DIR
set -euo pipefail
D=${1:?cluster directory}
here="$(cd "$(dirname "$0")" && pwd)"
K=$D/kubelet
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
HEALTH_PORT=${HEALTH_PORT:-$(free_port)}
METRICS_PORT=${METRICS_PORT:-$(free_port)}
SOCKET=${K8S_DRIVER_SOCKET:-$K/plugins/ebs.csi.aws.com/csi.sock}
# The agent's Kubernetes duties (startup taint, pre-stop) call the API server: on 127.0.0.1, as
# the service IP is not routed here (and nothing may leave the loopback).
API_PORT=$(sed -n 's/^API_PORT=//p' "$D/env" | tr -d '"')  # declare -p quotes it
mkdir -p "$D/deploy" "$D/sidecar" "$D/agent-state"
kubectl --kubeconfig "$D/kubeconfig" config view --raw --flatten >"$D/sidecar/kubeconfig"
printf 'HEALTH_PORT=%s\nMETRICS_PORT=%s\n' "$HEALTH_PORT" "$METRICS_PORT" >>"$D/env"
# kustomize reads bases only below or beside the overlay: link the tree in.
ln -sfn "$here" "$D/deploy/k8s"
cat >"$D/deploy/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - k8s/loop
patches:
  - target: {kind: DaemonSet, name: ebs-node-agent}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/name, value: ebs-node-agent}
      - {op: test, path: /spec/template/spec/containers/0/volumeMounts/0/name, value: kubelet-dir}
      - {op: replace, path: /spec/template/spec/containers/0/volumeMounts/0/mountPath, value: "$K"}
      - {op: test, path: /spec/template/spec/containers/0/ports/0/name, value: healthz}
      - {op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: $HEALTH_PORT}
  - target: {kind: DaemonSet, name: ebs-node-agent}
    patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: ebs-node-agent, namespace: kube-system}
      spec:
        template:
          spec:
            containers:
              - name: ebs-node-agent
                env:
                  - {name: EBS_AGENT_ALLOWED_PATH_PREFIXES, value: "$K"}
                  - {name: EBS_AGENT_METRICS_ADDRESS, value: "127.0.0.1:$METRICS_PORT"}
                  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
              - name: node-driver-registrar
                args: ["--csi-address=/csi/csi.sock", "--kubelet-registration-path=$SOCKET", "--v=2"]
                livenessProbe:
                  exec:
                    command: ["/csi-node-driver-registrar", "--kubelet-registration-path=$SOCKET",
                              "--mode=kubelet-registration-probe"]
              - name: liveness-probe
                args: ["--csi-address=/csi/csi.sock", "--health-port=$HEALTH_PORT"]
            volumes:
              - {name: kubelet-dir, hostPath: {path: "$K", type: Directory}}
              - {name: plugin-dir, hostPath: {path: "$K/plugins/ebs.csi.aws.com/", type: DirectoryOrCreate}}
              - {name: registration-dir, hostPath: {path: "$K/plugins_registry/", type: Directory}}
              - {name: state-dir, hostPath: {path: "$D/agent-state", type: DirectoryOrCreate}}
              - {name: sidecar-kubeconfig, hostPath: {path: "$D/sidecar", type: Directory}}
              - {name: udev-dir, hostPath: {path: "$D/udev", type: DirectoryOrCreate}}
YAML
