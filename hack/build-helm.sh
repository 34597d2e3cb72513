#!/usr/bin/env bash
# Builds the Helm CLI from the Go module proxy, at the version of the Helm
# library in go.mod (the one deployments/ renders the chart with), for the
# end-to-end test that installs, upgrades and uninstalls the chart with Helm
# itself. The binary goes into ~/.cache/tessera/helm/<stamp>/helm, keyed by
# the version and `go version`, and bin/helm links to it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
stamp=$( (echo "$version"; go version) | sha256sum | cut -c1-16)
out=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/helm/$stamp

if [[ ! -x $out/helm ]]; then
  echo "building helm $version from the Go module proxy into $out (once)..."
  start=$(date +%s)
  mkdir -p "$(dirname "$out")"
  tmp=$(mktemp -d "$(dirname "$out")/.tmp.XXXXXX")
  # `go install pkg@version` builds with Helm's own go.mod, not tessera's.
  # Its output (module downloads) is shown only if it fails.
  # (Its own variable: this once reused $out, so a build that printed module
  # downloads went into a directory named after them, and one that printed
  # nothing failed at `mkdir -p ""` — found by a run with empty caches.)
  if ! log=$(GOBIN=$tmp CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$version" 2>&1); then
    echo "$log" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mkdir -p "$out"
  mv "$tmp/helm" "$out/helm"
  rmdir "$tmp"
  echo "built helm in $(( $(date +%s) - start ))s"
fi
mkdir -p "$root/bin"
ln -sfn "$out/helm" "$root/bin/helm"
echo "helm ready in bin/helm: $("$out/helm" version --short)"
