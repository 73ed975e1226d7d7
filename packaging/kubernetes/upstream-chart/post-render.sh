#!/bin/sh
# Helm post-renderer: the chart's manifests on stdin, the same with ebs-plugin-patch.yaml applied
# on stdout (helm ... --post-renderer packaging/kubernetes/upstream-chart/post-render.sh).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/rendered.yaml"
cp "$here/kustomization.yaml" "$here/ebs-plugin-patch.yaml" "$work/"
kubectl kustomize "$work"
