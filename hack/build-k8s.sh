#!/usr/bin/env bash
# Builds the real control-plane binaries the tests and the sandbox run against:
# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes) and
# etcd (go.etcd.io/etcd/server/v3), all from the Go module proxy, into bin/k8s/.
#
# The build is skipped when bin/k8s/.stamp matches the hash of the pinned versions
# (test/k8s/go.mod, go.sum) and this script, so a warm run costs nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${TESSERA_K8S_BIN:-$root/bin/k8s}
mod=$root/test/k8s
kube_version=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")
stamp=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -d' ' -f1)

bins=(etcd kube-apiserver kube-controller-manager kube-scheduler)
if [[ -f $out/.stamp && $(cat "$out/.stamp") == "$stamp" ]]; then
  ok=1
  for b in "${bins[@]}"; do [[ -x $out/$b ]] || ok=0; done
  if [[ $ok == 1 ]]; then
    echo "control-plane binaries up to date in $out (kubernetes $kube_version)"
    exit 0
  fi
fi

mkdir -p "$out"
rm -f "$out/.stamp"
echo "building control-plane binaries (kubernetes $kube_version, etcd) into $out; the first build takes a few minutes..."
start=$(date +%s)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${kube_version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "${kube_version#v}" | cut -d. -f2)"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
cd "$mod"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
go build -trimpath -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler
go build -trimpath -ldflags "-s -w" -o "$out/etcd" ./etcd
echo "$stamp" > "$out/.stamp"
echo "built in $(( $(date +%s) - start ))s: $("$out/kube-apiserver" --version)"
