#!/usr/bin/env bash
# Builds the real workload operators that the operator e2e tests and
# `tessera sandbox up --operators` run — JobSet, LeaderWorkerSet, KubeRay, the
# MPI Operator, Kubeflow Trainer v2, the training-operator (PyTorchJob) and Kueue
# (the fair benchmark harness's queue pair), or only those named as arguments
# (jobset lws kuberay mpi-operator trainer training-operator kueue) — from the
# Go module proxy at the versions pinned in test/operators/modules/<name>, with
# the code an installed `tessera sandbox up --operators` uses (sandbox/opbin,
# driven by hack/build-operators/main.go).
#
# Each operator goes into ~/.cache/tessera/operators/<name>/<stamp>, keyed by
# the hash of its module (go.mod, go.sum, tools.go), its main package and the
# Go version, so a pin change rebuilds that operator only; beside the binary
# (manager) the directory holds the operator's own CRDs, webhook
# configurations and (Trainer) training runtimes. bin/operators/<name> in the
# checkout links to it. TESSERA_OPERATORS_BIN, when set, names the directory
# to build into instead (no link, no shared cache).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$(date +%s)
out=$(go run ./hack/build-operators "$@")

names=()
while read -r name dir; do
  names+=("$name")
  if [[ -z ${TESSERA_OPERATORS_BIN:-} ]]; then
    link=$root/bin/operators/$name
    mkdir -p "$(dirname "$link")"
    if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
    ln -sfn "$dir" "$link"
  fi
done <<< "$out"
echo "operators ready in ${TESSERA_OPERATORS_BIN:-$root/bin/operators} ($(( $(date +%s) - start ))s): ${names[*]}"
