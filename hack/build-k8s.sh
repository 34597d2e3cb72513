#!/usr/bin/env bash
# Builds the real Kubernetes binaries the tests and the sandbox run against —
# etcd, kube-apiserver, kube-controller-manager, kubectl and kube-scheduler
# (or only those named as arguments) — from the Go module proxy, with the code
# an installed `tessera sandbox up` uses (sandbox/k8sbin, driven by
# hack/build-k8s/main.go).
#
# The binaries go into ~/.cache/tessera/k8s/<stamp>, keyed by the hash of the
# pinned versions (test/k8s/go.mod, go.sum, etcd/main.go), the build flags and
# `go version`, so a second checkout on the same machine (CI clones afresh
# every run) and the installed CLI reuse them; bin/k8s in the checkout is a
# link to that directory. TESSERA_K8S_BIN, when set, names the directory to
# build into instead (no link).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(go run ./hack/build-k8s "$@")

if [[ -z ${TESSERA_K8S_BIN:-} ]]; then
  link=$root/bin/k8s
  mkdir -p "$(dirname "$link")"
  if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
  ln -sfn "$out" "$link"
fi
echo "Kubernetes binaries ready in ${link:-$out}: $("$out/kube-apiserver" --version)"
