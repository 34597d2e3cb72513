#!/usr/bin/env bash
# Builds the real control-plane binaries the tests and the sandbox run against:
# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes) and
# etcd (go.etcd.io/etcd/server/v3), all from the Go module proxy.
#
# The binaries go into a cache directory keyed by the hash of the pinned
# versions (test/k8s/go.mod, go.sum) and the build flags below, so a second
# checkout on the same machine (CI clones afresh every run) reuses them;
# bin/k8s in the checkout is a link to that directory. TESSERA_K8S_BIN, when
# set, names the directory to build into instead (no link, no shared cache).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/test/k8s
kube_version=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${kube_version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "${kube_version#v}" | cut -d. -f2)"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
stamp=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod/etcd/main.go"; echo "$ldflags"; go version) | sha256sum | cut -c1-16)

if [[ -n ${TESSERA_K8S_BIN:-} ]]; then
  out=$TESSERA_K8S_BIN
  link=""
else
  out=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/k8s/$stamp
  link=$root/bin/k8s
fi

bins=(etcd kube-apiserver kube-controller-manager kube-scheduler)
complete() {
  [[ -f $out/.stamp && $(cat "$out/.stamp") == "$stamp" ]] || return 1
  for b in "${bins[@]}"; do [[ -x $out/$b ]] || return 1; done
}

if ! complete; then
  mkdir -p "$out"
  rm -f "$out/.stamp"
  echo "building control-plane binaries (kubernetes $kube_version, etcd) into $out; the first build takes a few minutes..."
  start=$(date +%s)
  (
    cd "$mod"
    export CGO_ENABLED=0
    go build -trimpath -ldflags "$ldflags" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler
    go build -trimpath -ldflags "-s -w" -o "$out/etcd" ./etcd
  )
  echo "$stamp" > "$out/.stamp"
  echo "built in $(( $(date +%s) - start ))s"
fi

if [[ -n $link ]]; then
  mkdir -p "$(dirname "$link")"
  if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
  ln -sfn "$out" "$link"
fi
echo "control-plane binaries ready in ${link:-$out}: $("$out/kube-apiserver" --version)"
