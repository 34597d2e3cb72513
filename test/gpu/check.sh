#!/usr/bin/env bash
# Read-only check of tessera on a real NVIDIA GPU node (H100/H200, also
# A100, B200): real NVML discovery, the ResourceSlices tessera would
# publish, CDI specs generated from the real driver root with nvcdi and
# validated, and a comparison of every GPU with tessera's model of its
# product (profiles, placements, memory, SMs, engines, instance counts).
#
# It only reads. It never changes MIG mode, compute mode, clocks or MIG
# instances and never resets a GPU: the nvidia-smi calls below are queries
# only, gpucheck makes NVML queries only and writes its specs to a temporary
# directory, and `tessera-node discover` publishes nothing.
#
# Usage (repository root, as root or a user that may query NVML):
#   test/gpu/check.sh [--driver-root=/run/nvidia/driver]
# Without Go on the node, build on another machine and copy:
#   go build -o gpucheck ./test/gpu/gpucheck && go build -o tessera-node ./cmd/tessera-node
#   GPUCHECK=./gpucheck TESSERA_NODE=./tessera-node test/gpu/check.sh
# The full output goes to ${OUT:-/tmp}/tessera-gpu-check.log (for
# docs/hardware.md). It stops itself after ${LIMIT:-280} seconds.
# BACKEND (default nvml) selects the NVML backend; test/gpu/script_test.go
# runs the script with a mock machine and a fake nvidia-smi.
set -uo pipefail

out_dir=${OUT:-/tmp}
log="$out_dir/tessera-gpu-check.log"
limit=${LIMIT:-280}
mkdir -p "$out_dir"
exec > >(tee "$log") 2>&1

step() { printf '\n### %s\n' "$*"; }
run() { # run with the remaining time budget; a failure is recorded, not fatal
	local left=$((limit - SECONDS))
	if ((left <= 0)); then
		echo "out of time for: $*"
		status=1
		return
	fi
	timeout "$left" "$@" || { echo "(exit $? from: $*)"; status=1; }
}
status=0
backend=${BACKEND:-nvml}

step "Node"
date -u +%Y-%m-%dT%H:%M:%SZ
uname -r
cat /proc/driver/nvidia/version 2>/dev/null || echo "no /proc/driver/nvidia/version: is the driver loaded?"

step "nvidia-smi (queries only)"
if command -v nvidia-smi >/dev/null; then
	run nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,mig.mode.current,mig.mode.pending,compute_mode,persistence_mode --format=csv
	run nvidia-smi mig -lgip
	run nvidia-smi mig -lgipp
	run nvidia-smi mig -lgi
	run nvidia-smi mig -lci
else
	echo "nvidia-smi not found on PATH"
fi

step "gpucheck: model comparison, discovery, slices, CDI from the driver root"
if [[ -n ${GPUCHECK:-} ]]; then
	run "$GPUCHECK" --backend="$backend" "$@"
elif command -v go >/dev/null; then
	CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" run go run ./test/gpu/gpucheck --backend="$backend" "$@"
else
	echo "neither \$GPUCHECK nor go: cannot run gpucheck"
	status=1
fi

step "tessera-node discover (what the agent would publish; publishes nothing)"
if [[ -n ${TESSERA_NODE:-} ]]; then
	run "$TESSERA_NODE" discover --backend="$backend"
elif command -v go >/dev/null; then
	CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" run go run ./cmd/tessera-node discover --backend="$backend"
fi

step "Done in ${SECONDS}s, status $status (log: $log)"
exit $status
