#!/usr/bin/env bash
# Builds the binaries of a real node for the real-node tests and `tessera
# sandbox up --real-node` — kubelet, containerd, containerd-shim-runc-v2, ctr,
# pause and nvidia-cdi-hook (or only those named as arguments) — from the Go
# module proxy, with the code an installed `tessera sandbox up --real-node`
# uses (sandbox/nodebin, driven by hack/build-node/main.go):
#   kubelet        k8s.io/kubernetes/cmd/kubelet at the version test/k8s pins
#   containerd, containerd-shim-runc-v2, ctr
#                  github.com/containerd/containerd/v2 at the version test/containerd pins
#   pause          sandbox/nodebin/pause, the pods' sandbox image (no registry here)
#   nvidia-cdi-hook
#                  the NVIDIA container toolkit's CDI hook at the version go.mod requires
# runc and the CNI plugins come from Debian's packages (runc,
# containernetworking-plugins); .ci/run installs them.
#
# The binaries go into ~/.cache/tessera/node/<stamp>, keyed by the hash of the
# pins, the build flags and `go version` (see sandbox/nodebin), and bin/node in
# the checkout links to it. TESSERA_NODE_BIN, when set, names the directory to
# build into instead (no link).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(go run ./hack/build-node "$@")

if [[ -z ${TESSERA_NODE_BIN:-} ]]; then
  link=$root/bin/node
  mkdir -p "$(dirname "$link")"
  if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
  ln -sfn "$out" "$link"
fi
echo "node binaries ready in ${link:-$out}: kubelet $("$out/kubelet" --version 2>&1 | awk '{print $2}'), containerd $("$out/containerd" --version | awk '{print $3}'), nvidia-cdi-hook $("$out/nvidia-cdi-hook" --version | awk '{print $NF; exit}')"
