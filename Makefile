# tessera build entry points. `make demo` and `make test` are the two commands
# the README promises work on a fresh machine.

GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/tessera-gpu/tessera/cmd/internal/version.gitVersion=$(VERSION)
# go-nvml's header marks NVML calls deprecated in CUDA 13; tessera does not call them, but
# cgo compiles a wrapper for every one, and gcc warns about each on a cold build.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# Packages whose tests are the slow end-to-end suites; `test-unit` skips them.
E2E_PKGS  := ./test/e2e/...
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build cli k8s-bin operators-bin kueue-bin node-bin helm-bin test test-unit test-e2e bench bench-e2e bench-e2e-short fuzz chaos lint fmt generate demo clean

all: build

# One line per binary with its build time (a cold build downloads and
# compiles every dependency and takes minutes); go's own output, module
# downloads included, is shown only if the build fails.
build: BINARIES := tessera tessera-node tessera-scheduler
build cli:
	@for b in $(BINARIES); do \
	  start=$$(date +%s); printf '  %-20s building...' "$(BIN)/$$b"; \
	  if ! out=$$($(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/$$b ./cmd/$$b 2>&1); then echo " failed:"; echo "$$out"; exit 1; fi; \
	  echo " built in $$(( $$(date +%s) - start ))s"; \
	done

cli: BINARIES := tessera

# The Kubernetes binaries of the pinned release (etcd, kube-apiserver,
# kube-controller-manager, kubectl, kube-scheduler) from the Go module proxy;
# cached in ~/.cache/tessera, linked as bin/k8s.
k8s-bin:
	hack/build-k8s.sh

# Real workload operators (JobSet, LWS, KubeRay, MPI Operator, Trainer v2,
# training-operator, Kueue) from the Go module proxy; cached in bin/operators.
operators-bin:
	hack/build-operators.sh

# Kueue's manager alone (the fair harness's queue pair); operators-bin builds it too.
kueue-bin:
	hack/build-operators.sh kueue

# The binaries of a real node (kubelet, containerd, its runc shim, ctr, a
# pause binary) from the Go module proxy; cached in bin/node. The real-node
# tests (test/e2e/realnode) also need root and Debian's runc,
# containernetworking-plugins and busybox-static; without them they skip.
node-bin:
	hack/build-node.sh

# The Helm CLI, for the chart's Helm end-to-end test; linked as bin/helm.
helm-bin:
	hack/build-helm.sh

# All tests: unit tests with the race detector, then the end-to-end suites.
test: k8s-bin operators-bin node-bin helm-bin
	$(MAKE) test-unit
	$(MAKE) test-e2e

test-unit: k8s-bin operators-bin helm-bin
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/e2e)

test-e2e: k8s-bin operators-bin node-bin helm-bin
	$(GO) test -count=1 -timeout 30m $(E2E_PKGS)

# All benchmarks; BENCH selects some (e.g. BENCH=Solve). The end-to-end
# scheduler benchmarks (test/bench BenchmarkEndToEnd, 2,000 nodes, and
# BenchmarkFair at its default 100 nodes x 3 runs each) take 10 minutes or more.
BENCH ?= .
bench: k8s-bin
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -timeout 60m $$($(GO) list ./... | grep -v /test/e2e)

# The fair end-to-end harness (test/bench BenchmarkFair, docs/benchmarks.md): tessera
# against the kube-scheduler v1.37.2 in equal-semantics pairs and scheduler_perf shapes
# (the sub-benchmarks gang1 gang8 gang16-rack empty half full churn mig unfit, and kueue:
# tessera's queues against Kueue v0.17.0 + the kube-scheduler;
# FAIR_SCENARIOS is a regexp of them), FAIR_NODES nodes x 8 GPUs, FAIR_RUNS runs of each
# scheduler on a fresh control plane, order alternated. The full mode is run by hand
# (hours at 1,000 nodes on a loaded 2-core machine); bench-e2e-short (5 nodes, one run
# each, short churn and waiting windows) only checks that every scenario works, for CI
# (6-9 minutes on the shared 2-core machine). Never part of `make test`.
FAIR_NODES ?= 1000
FAIR_RUNS  ?= 3
FAIR_SCENARIOS ?= .
# e.g. FAIR_ARGS='-fair-stock-percentage=100 -fair-churn=1m' (see the flags in test/bench/fair_test.go)
FAIR_ARGS  ?=
bench-e2e: k8s-bin kueue-bin
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkFair$$/$(FAIR_SCENARIOS)' -benchtime 1x -timeout 600m ./test/bench/ -args -fair-nodes=$(FAIR_NODES) -fair-runs=$(FAIR_RUNS) $(FAIR_ARGS)

bench-e2e-short:
	$(MAKE) bench-e2e FAIR_NODES=5 FAIR_RUNS=1 FAIR_ARGS='-fair-churn=5s -fair-unfit-window=3s -fair-stall=20s -fair-cpu-profile=$(CURDIR)/$(BIN)/bench-profiles'

# The chaos run (test/chaos, docs/reliability.md): the real control plane,
# 8 simulated GPU nodes with tessera-node processes, two tessera-scheduler
# replicas, a seeded load generator and faults at seeded random times, with
# the invariants checked every few seconds. CHAOS_SEED reproduces a run's
# choices; CHAOS_REPORT=file.json keeps its report; CHAOS_FAULTS (a regexp
# of the fault kinds' names) injects only those. Never part of `make test`.
CHAOS_DURATION ?= 15m
CHAOS_SEED     ?=
CHAOS_FAULTS   ?=
chaos: k8s-bin
	CHAOS_DURATION=$(CHAOS_DURATION) CHAOS_SEED=$(CHAOS_SEED) CHAOS_FAULTS='$(CHAOS_FAULTS)' $(GO) test -count=1 -v -run '^TestChaos$$' -timeout 90m ./test/chaos/

# Every fuzz target, each for FUZZTIME (not part of `make test`: there
# the seed corpora under testdata/fuzz run as ordinary tests). A crasher
# is written to the package's testdata/fuzz/<target>/ and fails the run;
# keep it there as a regression seed. docs/reliability.md lists the targets.
# New inputs are minimized for at most FUZZMINIMIZE (the default 60 s stalls
# the fuzzer on large seeds).
FUZZTIME     ?= 30s
FUZZMINIMIZE ?= 5s
FUZZPARALLEL ?= 2
FUZZ_TARGETS := \
	./draplugin/checkpoint:FuzzDecode \
	./draplugin/api/v1alpha1:FuzzDecode \
	./nodeagent/partition:FuzzParse \
	./nodeagent/deviceplugin:FuzzParseConfig \
	./nodeagent/deviceplugin:FuzzPreferred \
	./nodeagent/devicename:FuzzParse \
	./catalog:FuzzLoadDefinitions \
	./catalog:FuzzMap \
	./cmd/tessera-scheduler:FuzzFlags
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "== $$pkg $$name ($(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) -parallel $(FUZZPARALLEL) $$pkg || exit 1; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

generate:
	$(GO) generate ./...

# The sandbox builds the Kubernetes binaries it needs itself (not
# kube-scheduler), one progress line per binary.
demo: cli
	@$(BIN)/tessera sandbox up --scenario demo $(DEMO_ARGS)

clean:
	rm -rf $(BIN)/tessera $(BIN)/tessera-node $(BIN)/tessera-scheduler
