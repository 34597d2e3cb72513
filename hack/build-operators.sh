#!/usr/bin/env bash
# Builds the real workload operators that the operator e2e tests and
# `tessera sandbox up --operators` run: JobSet, LeaderWorkerSet, KubeRay, the
# MPI Operator, Kubeflow Trainer v2 and the training-operator (PyTorchJob), each
# from the Go module proxy at the version pinned in test/operators/modules/<name>
# (one nested module per operator: their k8s.io and controller-runtime versions
# differ, from v0.29 to v0.36, and cannot share one build list).
#
# Each operator goes into a cache directory keyed by the hash of its module
# (go.mod, go.sum, tools.go), its main package and the Go version, so a pin
# change rebuilds that operator only, and a fresh clone on the same machine
# reuses the others; bin/operators/<name> in the checkout links to it. Beside the
# binary (`manager`) the directory holds the operator's own CRDs, webhook
# configurations and (Trainer) training runtimes, copied from the same module.
# TESSERA_OPERATORS_BIN, when set, names the directory to build into instead
# (no link, no shared cache). Arguments select operators (default: all).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mods=$root/test/operators/modules
all=(jobset lws kuberay mpi-operator trainer training-operator)

# name: main package, then "dest=module-relative glob" pairs to copy.
spec() {
  case $1 in
  jobset) echo "sigs.k8s.io/jobset crds=config/components/crd/bases/*.yaml webhooks=config/components/webhook/manifests.yaml webhook-patches=config/components/webhook/patches/*-patch.yaml" ;;
  lws) echo "sigs.k8s.io/lws/cmd crds=config/crd/bases/*.yaml webhooks=config/webhook/manifests.yaml webhook-patches=config/webhook/*-patch.yaml" ;;
  kuberay) echo "github.com/ray-project/kuberay/ray-operator crds=config/crd/bases/*.yaml" ;;
  mpi-operator) echo "github.com/kubeflow/mpi-operator/cmd/mpi-operator crds=manifests/base/kubeflow.org_mpijobs.yaml" ;;
  trainer) echo "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager crds=manifests/base/crds/trainer.kubeflow.org_*.yaml webhooks=manifests/base/webhook/manifests.yaml webhook-patches=manifests/base/webhook/patch.yaml runtimes=manifests/base/runtimes/*_distributed.yaml" ;;
  # Only the PyTorchJob CRD: the MPIJob (kubeflow.org/v1) CRD of the
  # training-operator would collide with the MPI Operator's v2beta1 one.
  training-operator) echo "github.com/kubeflow/training-operator/cmd/training-operator.v1 crds=manifests/base/crds/kubeflow.org_pytorchjobs.yaml webhooks=manifests/base/webhook/manifests.yaml webhook-patches=manifests/base/webhook/patch.yaml" ;;
  *) return 1 ;;
  esac
}

names=("$@")
(( ${#names[@]} )) || names=("${all[@]}")
total=$(date +%s)
for name in "${names[@]}"; do
  read -r pkg copies < <(spec "$name") || { echo "unknown operator $name (known: ${all[*]})" >&2; exit 2; }
  mod=$mods/$name
  # The binary is keyed by the pin (and Go); the copied files by what is copied too.
  stamp=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go"; echo "$pkg"; go version) | sha256sum | cut -c1-16)
  files_stamp=$(echo "$stamp $copies" | sha256sum | cut -c1-16)
  if [[ -n ${TESSERA_OPERATORS_BIN:-} ]]; then
    out=$TESSERA_OPERATORS_BIN/$name
    link=""
  else
    out=${XDG_CACHE_HOME:-$HOME/.cache}/tessera/operators/$name/$stamp
    link=$root/bin/operators/$name
  fi
  modpath=$(awk '$1=="require" && NF==3 {print $2; exit}' "$mod/go.mod")
  if [[ ! -f $out/.stamp || $(cat "$out/.stamp") != "$stamp" || ! -x $out/manager ]]; then
    version=$(cd "$mod" && go list -m -f '{{.Version}}' "$modpath")
    echo "building $name ($modpath $version) into $out..."
    start=$(date +%s)
    rm -rf "$out"
    mkdir -p "$out"
    (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/manager" "$pkg")
    echo "$modpath $version" > "$out/.version"
    echo "$stamp" > "$out/.stamp"
    echo "built $name in $(( $(date +%s) - start ))s"
  fi
  if [[ ! -f $out/.files-stamp || $(cat "$out/.files-stamp") != "$files_stamp" ]]; then
    dir=$(cd "$mod" && go list -m -f '{{.Dir}}' "$modpath")
    for c in $copies; do
      dest=${c%%=*}
      rm -rf "${out:?}/$dest"
      mkdir -p "$out/$dest"
      # shellcheck disable=SC2086 # the glob is meant to expand
      for f in $dir/${c#*=}; do
        [[ -f $f ]] || { echo "$name: $f missing in $modpath" >&2; exit 1; }
        cp "$f" "$out/$dest/"
      done
    done
    chmod -R u+w "$out"
    echo "$files_stamp" > "$out/.files-stamp"
  fi
  if [[ -n $link ]]; then
    mkdir -p "$(dirname "$link")"
    if [[ -e $link && ! -L $link ]]; then rm -rf "$link"; fi
    ln -sfn "$out" "$link"
  fi
done
echo "operators ready in ${TESSERA_OPERATORS_BIN:-$root/bin/operators} ($(( $(date +%s) - total ))s): ${names[*]}"
