#!/usr/bin/env bash
# Writes DIR/NAME/kustomization.yaml: BASE (a kustomization of the shipped DaemonSet
# ebs-node-agent) with every host path moved under DIR (kubelet's root directory DIR/kubelet,
# the agent's state DIR/agent-state[-NAME], /run/udev: DIR/udev, which neither the loop backend
# nor the tests need; the path allow-list and the registrar's socket path follow), the health and
# metrics ports on free ports, and the API server at 127.0.0.1 (no service network here).
# Nothing else is changed but the agent's environment items in $AGENT_ENV (YAML flow mappings,
# one a line), e.g. the instance-metadata endpoint. Deploy with `kubectl apply -k DIR/NAME`.
#   tests/k8s/overlay.sh DIR                 # NAME deploy, BASE tests/k8s/loop (+ the sidecars' kubeconfig)
#   tests/k8s/overlay.sh DIR NAME BASE       # BASE: a directory, e.g. packaging/kubernetes
set -euo pipefail
D=${1:?cluster directory}
NAME=${2:-deploy}
here="$(cd "$(dirname "$0")" && pwd)"
BASE=${3:-$here/loop}
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
STATE=$D/agent-state
[[ $NAME == deploy ]] || STATE=$D/agent-state-$NAME
O=$D/$NAME
mkdir -p "$O" "$D/sidecar" "$STATE"
kubectl --kubeconfig "$D/kubeconfig" config view --raw --flatten >"$D/sidecar/kubeconfig"
printf 'HEALTH_PORT=%s\nMETRICS_PORT=%s\n' "$HEALTH_PORT" "$METRICS_PORT" >"$O/ports"
# kustomize reads bases only below or beside the overlay: link the tree in.
ln -sfn "$(cd "$BASE" && pwd)" "$O/base"
extra_volumes=""
[[ $NAME == deploy ]] && extra_volumes="              - {name: sidecar-kubeconfig, hostPath: {path: \"$D/sidecar\", type: Directory}}"
extra_env=""
while IFS= read -r item; do
  [[ -n $item ]] && extra_env+="                  - $item"$'\n'
done <<<"${AGENT_ENV:-}"
cat >"$O/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - base
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
                  - {name: CSI_ENDPOINT, value: "unix://$SOCKET"}
                  - {name: EBS_AGENT_METRICS_ADDRESS, value: "127.0.0.1:$METRICS_PORT"}
                  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
$extra_env              - name: node-driver-registrar
                args: ["--csi-address=/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock", "--kubelet-registration-path=$SOCKET", "--v=2"]
                livenessProbe:
                  exec:
                    command: ["/csi-node-driver-registrar", "--kubelet-registration-path=$SOCKET",
                              "--mode=kubelet-registration-probe"]
              - name: liveness-probe
                args: ["--csi-address=/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock", "--health-port=$HEALTH_PORT"]
            volumes:
              - {name: kubelet-dir, hostPath: {path: "$K", type: Directory}}
              - {name: plugin-dir, hostPath: {path: "$K/plugins/ebs.csi.aws.com/", type: DirectoryOrCreate}}
              - {name: registration-dir, hostPath: {path: "$K/plugins_registry/", type: Directory}}
              - {name: state-dir, hostPath: {path: "$STATE", type: DirectoryOrCreate}}
              - {name: udev-dir, hostPath: {path: "$D/udev", type: DirectoryOrCreate}}
$extra_volumes
YAML
