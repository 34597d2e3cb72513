#!/usr/bin/env bash
# Builds the binaries of a real node for the real-node tests and `tessera
# sandbox up --real-node`, all from the Go module proxy:
#   kubelet                   k8s.io/kubernetes/cmd/kubelet at the version test/k8s pins
#   containerd, containerd-shim-runc-v2, ctr
#                             github.com/containerd/containerd/v2 at the version test/containerd pins
#   pause                     sandbox/realnode/pause, the pods' sandbox image (no registry here)
# runc and the CNI plugins come from Debian's packages (runc,
# containernetworking-plugins); .ci/run installs them.
#
# The binaries go into a cache directory keyed by the hash of the pins and the
# build flags below (like hack/build-k8s.sh), and bin/node in the checkout links
# to it. TESSERA_NODE_BIN, when set, names the directory to build into instead.
#
# The kubelet is built from test/k8s, the module that builds the control plane,
# without touching its go.mod or go.sum (they are hack/build-k8s.sh's cache key):
# it needs a few go.sum lines that the control plane does not (k8s.io/cri-streaming,
# otelrestful), so it is built with -modfile against a copy, and the build
# fails if resolving them changed any version the original pins.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
k8smod=$root/test/k8s
ctrdmod=$root/test/containerd

# requires prints "module version" for every require line of a go.mod file.
requires() {
  awk '/^require \(/{inreq=1; next} inreq && /^\)/{inreq=0; next}
       inreq{print $1, $2; next} /^require [^(]/{print $2, $3}' "$1" | sort
}

kube_version=$(requires "$k8smod/go.mod" | awk '$1=="k8s.io/kubernetes"{print $2}')
containerd_version=$(requires "$ctrdmod/go.mod" | awk '$1=="github.com/containerd/containerd/v2"{print $2}')
[[ -n $kube_version && -n $containerd_version ]] || { echo "cannot read the pinned versions from test/k8s/go.mod and test/containerd/go.mod" >&2; exit 1; }

kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
kube_ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${kube_version#v}" | cut -d. -f1)"
kube_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "${kube_version#v}" | cut -d. -f2)"
kube_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
kube_ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
ctrd_tags="no_btrfs no_devmapper no_zfs"
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
ctrd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
stamp=$( (cat "$k8smod/go.mod" "$k8smod/go.sum" "$ctrdmod/go.mod" "$ctrdmod/go.sum" "$root/sandbox/realnode/pause/main.go"
  echo "$kube_ldflags|$ctrd_tags|$ctrd_ldflags"; go version) | sha256sum | cut -c1-16)

if [[ -n ${TESSERA_NODE_BIN:-} ]]; then
  out=$TESSERA_NODE_BIN
  link=""
else
  out=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/node/$stamp
  link=$root/bin/node
fi

bins=(kubelet containerd containerd-shim-runc-v2 ctr pause)
complete() {
  [[ -f $out/.stamp && $(cat "$out/.stamp") == "$stamp" ]] || return 1
  for b in "${bins[@]}"; do [[ -x $out/$b ]] || return 1; done
}

if ! complete; then
  mkdir -p "$out"
  rm -f "$out/.stamp"
  echo "building node binaries (kubelet $kube_version, containerd $containerd_version, pause) into $out; the first build takes several minutes..."
  start=$(date +%s)
  export CGO_ENABLED=0
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$k8smod/go.mod" "$work/kubelet.mod"
  cp "$k8smod/go.sum" "$work/kubelet.sum"
  (
    cd "$k8smod"
    go build -mod=mod -modfile="$work/kubelet.mod" -trimpath -ldflags "$kube_ldflags" -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet
  )
  changed=$(comm -23 <(requires "$k8smod/go.mod") <(requires "$work/kubelet.mod"))
  if [[ -n $changed ]]; then
    echo "building the kubelet would change these pins of test/k8s/go.mod:" >&2
    echo "$changed" >&2
    exit 1
  fi
  (
    cd "$ctrdmod"
    go build -trimpath -tags "$ctrd_tags" -ldflags "$ctrd_ldflags" -o "$out/" \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr
  )
  (cd "$root" && go build -trimpath -ldflags "-s -w" -o "$out/pause" ./sandbox/realnode/pause)
  echo "$stamp" > "$out/.stamp"
  echo "built in $(( $(date +%s) - start ))s"
fi

if [[ -n $link ]]; then
  mkdir -p "$(dirname "$link")"
  if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
  ln -sfn "$out" "$link"
fi
echo "node binaries ready in ${link:-$out}: kubelet $("$out/kubelet" --version 2>&1 | awk '{print $2}'), containerd $("$out/containerd" --version | awk '{print $3}')"
