package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/tessera-gpu/tessera/cmd/internal/gomemlimit"
	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/internal/secureserve"
)

type options struct {
	kubeconfig         string
	kubeAPIQPS         float32
	kubeAPIBurst       int
	schedulerName      string
	topologyKeys       []string
	spread             bool
	maxTries           int
	period             time.Duration
	minCycleInterval   time.Duration
	parallelism        int
	gpuDrivers         []string
	catalog            bool
	clusterDefinitions bool
	leaderElect        bool
	leaseNamespace     string
	leaseName          string
	leaseDuration      time.Duration
	renewDeadline      time.Duration
	retryPeriod        time.Duration
	probeNamespace     string
	starvation         time.Duration
	usageHalfLife      time.Duration
	usageWeight        float64
	consolidationMax   int
	unfitRetry         time.Duration
	formation          time.Duration
	volumeBind         time.Duration
	jointSteps         int64
	maxSteps           int64
	shadow             bool
	shadowSchedulers   []string
	shadowNamespace    string
	shadowDeadlock     time.Duration
	shadowReportTTL    time.Duration
	shadowAllGangs     bool
	logging            *logsapi.LoggingConfiguration
	featureGate        featuregate.MutableVersionedFeatureGate

	// serving: /metrics, /healthz, /readyz and /livez over HTTPS with
	// delegated authentication and authorization (the kube-scheduler's
	// flags), plain HTTP only with --metrics-bind-address.
	serving *secureserve.Options
	// profiling serves /debug/pprof beside /metrics (the kube-scheduler's --profiling).
	profiling bool
	// memoryLimitRatio is the share of the container's memory limit given to the Go
	// runtime as its soft limit (cmd/internal/gomemlimit).
	memoryLimitRatio float64
}

// DefaultSecurePort is where the HTTPS endpoint listens by default (the
// kube-scheduler's 10259 plus 100, so both fit on one host network).
const DefaultSecurePort = 10359

func newOptions() *options {
	o := &options{
		schedulerName:      "tessera-scheduler",
		kubeAPIQPS:         500,
		kubeAPIBurst:       1000,
		maxTries:           50000,
		period:             time.Second,
		minCycleInterval:   50 * time.Millisecond,
		parallelism:        16,
		gpuDrivers:         []string{contract.DriverName},
		catalog:            true,
		clusterDefinitions: true,
		leaderElect:        true,
		leaseNamespace:     os.Getenv("POD_NAMESPACE"),
		leaseName:          "tessera-scheduler",
		leaseDuration:      15 * time.Second,
		renewDeadline:      10 * time.Second,
		retryPeriod:        2 * time.Second,
		probeNamespace:     "default",
		starvation:         5 * time.Minute,
		usageHalfLife:      time.Hour,
		usageWeight:        1,
		consolidationMax:   16,
		unfitRetry:         30 * time.Second,
		formation:          2 * time.Minute,
		volumeBind:         10 * time.Minute,
		jointSteps:         10000,
		maxSteps:           500000,
		shadowSchedulers:   []string{"default-scheduler", "tessera-scheduler"},
		shadowNamespace:    os.Getenv("POD_NAMESPACE"),
		shadowDeadlock:     5 * time.Minute,
		shadowReportTTL:    24 * time.Hour,
		logging:            logsapi.NewLoggingConfiguration(),
		featureGate:        featuregate.NewFeatureGate(),
		serving:            secureserve.NewOptions("tessera-scheduler", DefaultSecurePort),
		profiling:          true,
		memoryLimitRatio:   gomemlimit.DefaultRatio,
	}
	if o.leaseNamespace == "" {
		o.leaseNamespace = "kube-system"
	}
	if o.shadowNamespace == "" {
		o.shadowNamespace = "kube-system"
	}
	if err := logsapi.AddFeatureGates(o.featureGate); err != nil {
		panic(fmt.Sprintf("register logging feature gates: %v", err)) // programming error, at init
	}
	return o
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "Kubeconfig file; empty: $KUBECONFIG, else the in-cluster service account.")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", o.kubeAPIQPS, "Client-side rate limit of API requests per second (the kube-scheduler's clientConnection.qps).")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", o.kubeAPIBurst, "Burst of API requests above --kube-api-qps (the kube-scheduler's clientConnection.burst).")
	fs.StringVar(&o.schedulerName, "scheduler-name", o.schedulerName, "spec.schedulerName of the pods this scheduler places.")
	fs.StringSliceVar(&o.topologyKeys, "topology-keys", o.topologyKeys, "Node label keys whose values are topology domains (host group, rack, block), most specific first: the levels of a topology when no Topology object names them. A gang without a constraint stays in one domain of the first key when it fits, else in as few domains of each level as it can.")
	fs.BoolVar(&o.spread, "spread", o.spread, "Prefer the emptiest nodes instead of packing GPUs onto the fullest.")
	fs.IntVar(&o.maxTries, "max-tries", o.maxTries, "Search budget per gang: node evaluations before the gang is declared unplaceable this cycle.")
	fs.DurationVar(&o.period, "period", o.period, "Time between scheduling cycles when no event triggers one.")
	fs.DurationVar(&o.minCycleInterval, "min-cycle-interval", o.minCycleInterval, "Least time between the starts of cycles that events trigger (a cycle starts at least min(this, 10ms) after the event that triggers it); shorter places pods sooner under a stream of events, at more CPU.")
	fs.IntVar(&o.parallelism, "parallelism", o.parallelism, "API writes in flight per commit, and gangs committed at once.")
	fs.StringSliceVar(&o.gpuDrivers, "gpu-drivers", o.gpuDrivers, "DRA drivers whose devices are counted in GPU units for queue quotas.")
	fs.BoolVar(&o.catalog, "catalog", o.catalog, "Map pods to gangs through the workload catalog (built-in definitions); when false every pod without a PodGroup annotation is a gang of one.")
	fs.BoolVar(&o.clusterDefinitions, "workload-definitions", o.clusterDefinitions, "With --catalog, follow the cluster's WorkloadDefinition objects (they override built-ins of the same kind; each gets an Accepted condition); needs the WorkloadDefinition CRD, else the built-ins alone apply.")
	fs.BoolVar(&o.leaderElect, "leader-elect", o.leaderElect, "Schedule only while holding the Lease (run several replicas for failover).")
	fs.StringVar(&o.leaseNamespace, "leader-elect-resource-namespace", o.leaseNamespace, "Namespace of the Lease.")
	fs.StringVar(&o.leaseName, "leader-elect-resource-name", o.leaseName, "Name of the Lease.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", o.leaseDuration, "Lease duration.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", o.renewDeadline, "Renew deadline of the leader.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", o.retryPeriod, "Retry period of the candidates.")
	fs.DurationVar(&o.usageHalfLife, "usage-half-life", o.usageHalfLife, "Half-life of each queue's usage history (status.usage, kept across restarts); 0 keeps none.")
	fs.Float64Var(&o.usageWeight, "usage-weight", o.usageWeight, "How much past usage lowers a queue's over-quota share (like KAI Scheduler's kValue); 0 ignores it.")
	fs.IntVar(&o.consolidationMax, "consolidation-max-pods", o.consolidationMax, "Most pods one consolidation moves (evicts, for their workloads to recreate elsewhere) to free whole nodes for a gang that does not fit only because the free GPUs are scattered; 0 disables consolidation.")
	fs.DurationVar(&o.unfitRetry, "unfit-retry", o.unfitRetry, "A gang that did not fit is searched again as soon as anything its search reads changes (nodes, slices, claims, pods, queues), and at least this often as a safety net; 0 searches waiting gangs every cycle.")
	fs.DurationVar(&o.starvation, "starvation-timeout", o.starvation, "A gang beyond its queue's quota that has not fit for this long (and would fit the empty cluster) holds back other such gangs until it is placed; negative disables.")
	fs.DurationVar(&o.formation, "gang-formation-timeout", o.formation, "A gang with fewer pods than minMember for this long says so: its PodGroup condition names the workload and how many pods it waits for, an Event is emitted and its pods get PodScheduled=False; negative disables.")
	fs.DurationVar(&o.volumeBind, "volume-bind-timeout", o.volumeBind, "How long a commit waits for the PV controller to bind a gang's WaitForFirstConsumer volumes before it fails and is undone.")
	fs.Int64Var(&o.jointSteps, "joint-steps", o.jointSteps, "Work bound of one joint device re-allocation of a gang's pods on a node, in structured-allocator steps.")
	fs.Int64Var(&o.maxSteps, "max-steps", o.maxSteps, "Work bound of one gang's search, in structured-allocator steps (with --max-tries node evaluations).")
	fs.StringVar(&o.probeNamespace, "feature-probe-namespace", o.probeNamespace, "Namespace in which DRA feature detection dry-runs a ResourceClaim.")
	fs.BoolVar(&o.shadow, "shadow", o.shadow, "Shadow mode: decide, do not act. Watch the pods of --shadow-scheduler-names, map them to gangs through the catalog, and write one ShadowReport per gang (what tessera would have decided against what the scheduler in use did) into --shadow-namespace; nothing else is written (no bindings, claims, evictions, pod conditions, PodGroups, Events or Leases: --leader-elect is ignored, run one replica).")
	fs.StringSliceVar(&o.shadowSchedulers, "shadow-scheduler-names", o.shadowSchedulers, "With --shadow: the spec.schedulerName values of the pods to watch (kube-scheduler, KAI, Volcano, tessera itself...).")
	fs.StringVar(&o.shadowNamespace, "shadow-namespace", o.shadowNamespace, "With --shadow: namespace of the ShadowReports (default $POD_NAMESPACE, else kube-system).")
	fs.DurationVar(&o.shadowDeadlock, "shadow-deadlock-after", o.shadowDeadlock, "With --shadow: a partly placed gang whose waiting pods are unschedulable and of which no pod was bound for this long is reported deadlocked.")
	fs.DurationVar(&o.shadowReportTTL, "shadow-report-ttl", o.shadowReportTTL, "With --shadow: reports of gangs that ended are deleted this long after; negative keeps them.")
	fs.BoolVar(&o.shadowAllGangs, "shadow-all-gangs", o.shadowAllGangs, "With --shadow: report every gang, not only AI gangs (more than one pod, or pods with ResourceClaims or extended resources).")
	o.serving.AddFlags(fs, "metrics-bind-address", "/metrics, /healthz, /readyz and /livez")
	fs.Float64Var(&o.memoryLimitRatio, "memory-limit-ratio", o.memoryLimitRatio, gomemlimit.FlagUsage)
	fs.BoolVar(&o.profiling, "profiling", o.profiling, "Serve Go profiles at /debug/pprof on the same endpoints as /metrics, behind the same authentication and authorization (get on the non-resource URL; the kube-scheduler's --profiling).")
	logsapi.AddFlags(o.logging, fs)
	o.featureGate.AddFlag(fs)
}

func (o *options) applyLogging() error {
	if err := logsapi.ValidateAndApply(o.logging, o.featureGate); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	return nil
}

func (o *options) validate() error {
	if err := gomemlimit.Validate(o.memoryLimitRatio); err != nil {
		return err
	}
	switch {
	case o.schedulerName == "":
		return errors.New("--scheduler-name must not be empty")
	case o.kubeAPIQPS <= 0 || o.kubeAPIBurst <= 0:
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %v and %d", o.kubeAPIQPS, o.kubeAPIBurst)
	case o.maxTries <= 0:
		return fmt.Errorf("--max-tries must be positive, got %d", o.maxTries)
	case o.period <= 0:
		return fmt.Errorf("--period must be positive, got %s", o.period)
	case o.minCycleInterval <= 0:
		return fmt.Errorf("--min-cycle-interval must be positive, got %s", o.minCycleInterval)
	case o.jointSteps <= 0:
		return fmt.Errorf("--joint-steps must be positive, got %d", o.jointSteps)
	case o.maxSteps <= 0:
		return fmt.Errorf("--max-steps must be positive, got %d", o.maxSteps)
	case o.volumeBind <= 0:
		return fmt.Errorf("--volume-bind-timeout must be positive, got %s", o.volumeBind)
	case o.usageHalfLife < 0:
		return fmt.Errorf("--usage-half-life must not be negative, got %s", o.usageHalfLife)
	case o.usageWeight < 0:
		return fmt.Errorf("--usage-weight must not be negative, got %g", o.usageWeight)
	case o.unfitRetry < 0:
		return fmt.Errorf("--unfit-retry must not be negative (0 searches waiting gangs every cycle), got %s", o.unfitRetry)
	case o.consolidationMax < 0:
		return fmt.Errorf("--consolidation-max-pods must not be negative (0 disables consolidation), got %d", o.consolidationMax)
	case o.shadow && len(o.shadowSchedulers) == 0:
		return errors.New("--shadow-scheduler-names must name at least one scheduler")
	case o.shadow && o.shadowDeadlock <= 0:
		return fmt.Errorf("--shadow-deadlock-after must be positive, got %s", o.shadowDeadlock)
	case o.parallelism <= 0:
		return fmt.Errorf("--parallelism must be positive, got %d", o.parallelism)
	case o.leaderElect && o.leaseDuration <= o.renewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be longer than --leader-elect-renew-deadline (%s)", o.leaseDuration, o.renewDeadline)
	case o.leaderElect && o.retryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period must be positive, got %s", o.retryPeriod)
	case o.leaderElect && o.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.retryPeriod)):
		// client-go's leader elector refuses this, but only once the
		// scheduler has started.
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be longer than %.1f × --leader-elect-retry-period (%s)", o.renewDeadline, leaderelection.JitterFactor, o.retryPeriod)
	}
	// Names the API server validates: one that is not valid would never
	// match (a scheduler name, a topology label key) or fail only at the
	// first write (the Lease, the probe claim).
	for _, n := range []struct {
		flag, value string
		check       func(string) []string
	}{
		{"--scheduler-name", o.schedulerName, validation.IsDNS1123Subdomain},
		{"--feature-probe-namespace", o.probeNamespace, validation.IsDNS1123Label},
	} {
		if errs := n.check(n.value); len(errs) > 0 {
			return fmt.Errorf("%s %q: %s", n.flag, n.value, strings.Join(errs, "; "))
		}
	}
	if o.leaderElect {
		if errs := validation.IsDNS1123Label(o.leaseNamespace); len(errs) > 0 {
			return fmt.Errorf("--leader-elect-resource-namespace %q: %s", o.leaseNamespace, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Subdomain(o.leaseName); len(errs) > 0 {
			return fmt.Errorf("--leader-elect-resource-name %q: %s", o.leaseName, strings.Join(errs, "; "))
		}
	}
	for _, k := range o.topologyKeys {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("--topology-keys: %q is not a label key: %s", k, strings.Join(errs, "; "))
		}
	}
	for _, d := range o.gpuDrivers {
		if errs := validation.IsDNS1123Subdomain(d); len(errs) > 0 {
			return fmt.Errorf("--gpu-drivers: %q is not a DRA driver name: %s", d, strings.Join(errs, "; "))
		}
	}
	if errs := o.serving.Validate(); len(errs) > 0 {
		return utilerrors.NewAggregate(errs)
	}
	return nil
}
