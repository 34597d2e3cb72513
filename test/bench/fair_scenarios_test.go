package bench

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// Labels of the benchmark's objects.
const (
	rackLabel  = "bench.tessera.dev/rack"  // node label: the rack (topology domain) of a node
	phaseLabel = "bench.tessera.dev/phase" // pod label: init (not measured), batch, warm or churn
	gangLabel  = "bench.tessera.dev/gang"  // pod label: the gang (PodGroup or the pod itself)
)

// Feature gates of the kube-scheduler v1.37 for its own gang scheduling (KEP-4671:
// the GangScheduling plugin, PodGroup objects in scheduling.k8s.io/v1beta1) and its
// topology-aware workload scheduling (KEP-5732: TopologyPlacementGenerator and
// PodGroupPodsCount). Both add their plugins to the default profile when on
// (pkg/scheduler/apis/config/v1/default_plugins.go).
const (
	gateGenericWorkload  = "GenericWorkload"
	gateTopologyWorkload = "TopologyAwareWorkloadScheduling"
)

// gangSpec is one gang of the workload: pods pods, each with one ResourceClaim of its own.
type gangSpec struct {
	pods     int    // pods in the gang; 1 is a lone pod (no PodGroup)
	gpus     int64  // whole GPUs per pod, when mig is empty
	mig      string // MIG profile of the pod's one device ("" whole GPUs)
	topology string // node label key the gang must stay within (one domain)
	node     string // pins the pod to a node by nodeSelector (init pods of the unfit shape)
}

// scenario is one row: a pair of equal semantics or a scheduler_perf shape.
type scenario struct {
	name, what string
	mig        bool     // nodes publish partitionable GPUs (whole GPU and MIG devices on shared counters)
	rackSize   int      // nodes per rack label; 0: no rack labels
	stockGates []string // kube-scheduler feature gates of this row
	catalog    bool     // tessera maps workloads through its catalog (a Job's pods to one gang); else every pod is a gang of one
	kcmFlags   []string // extra kube-controller-manager flags (its client QPS where its controllers create the measured pods)
	// init is placed by the same scheduler before the measured run (not measured): the
	// scheduler fills the cluster itself, as scheduler_perf's initPods.
	init  func(nodes int) []gangSpec
	batch func(nodes int) []gangSpec // the measured pods, all created before the measured scheduler starts
	churn bool                       // steady-state churn instead of a batch
	unfit bool                       // the batch cannot fit: what waiting costs
}

func ones(n int) []gangSpec {
	out := make([]gangSpec, n)
	for i := range out {
		out[i] = gangSpec{pods: 1, gpus: 1}
	}
	return out
}

func gangs(n, size int, topology string) []gangSpec {
	out := make([]gangSpec, n)
	for i := range out {
		out[i] = gangSpec{pods: size, gpus: 1, topology: topology}
	}
	return out
}

// scenarios of BenchmarkFair, in the order they run. Every node has 8 GPUs (G = 8 × nodes).
var scenarios = []scenario{
	{name: "gang1", what: "pair 1: G lone one-GPU pods on an empty cluster (fills it); kube-scheduler with DRA, MostAllocated",
		batch: func(n int) []gangSpec { return ones(8 * n) }},
	{name: "gang8", what: "pair 2: gangs of 8 one-GPU pods to 75% of G; upstream PodGroups (gang minCount 8) for both; kube-scheduler with GenericWorkload",
		stockGates: []string{gateGenericWorkload},
		batch:      func(n int) []gangSpec { return gangs(max(1, 3*n/4), 8, "") }},
	{name: "gang16-rack", what: "pair 2, topology: gangs of 16 one-GPU pods, each required in one rack of 4 nodes, to 75% of the full racks; kube-scheduler with GenericWorkload and TopologyAwareWorkloadScheduling",
		rackSize: 4, stockGates: []string{gateGenericWorkload, gateTopologyWorkload},
		batch: func(n int) []gangSpec { return gangs(max(1, 3*(n/4)/2), 16, rackLabel) }},
	{name: "empty", what: "shape: lone one-GPU pods to 25% of G on an empty cluster",
		batch: func(n int) []gangSpec { return ones(2 * n) }},
	{name: "half", what: "shape: lone one-GPU pods from 50% to 75% of G",
		init: func(n int) []gangSpec { return ones(4 * n) }, batch: func(n int) []gangSpec { return ones(2 * n) }},
	{name: "full", what: "shape: lone one-GPU pods from 75% to 100% of G (the last pods look for the last free GPUs)",
		init: func(n int) []gangSpec { return ones(6 * n) }, batch: func(n int) []gangSpec { return ones(2 * n) }},
	{name: "churn", what: "shape: steady-state churn at 50% of G: the oldest pods end and new lone one-GPU pods arrive at -fair-churn-rate for -fair-churn",
		init: func(n int) []gangSpec { return ones(4 * n) }, churn: true},
	{name: "mig", what: "shape: partitionable GPUs (H100 MIG profiles on shared counters); per node 2 whole-GPU, 4 3g.40gb and 14 1g.10gb pods (6 of 8 GPUs' worth), interleaved",
		mig: true, batch: migMix},
	{name: "unfit", what: "shape: every node holds 7 pinned one-GPU pods; 3 gangs of 8 two-GPU pods and a gang of nodes+1 one-GPU pods cannot fit; CPU and writes per second while they wait",
		stockGates: []string{gateGenericWorkload}, unfit: true,
		init: func(n int) []gangSpec {
			var out []gangSpec
			for i := 0; i < n; i++ {
				for j := 0; j < 7; j++ {
					out = append(out, gangSpec{pods: 1, gpus: 1, node: nodeName(i)})
				}
			}
			return out
		},
		batch: func(n int) []gangSpec {
			out := gangs(3, 8, "")
			for i := range out {
				out[i].gpus = 2
			}
			// Each of its pods fits (a node has a free GPU) but the gang does not: without
			// gang semantics n of its pods would be bound (a partial gang, counted as a
			// violation), which proves both schedulers hold it back whole.
			return append(out, gangSpec{pods: n + 1, gpus: 1})
		}},
}

// migMix is per node 2 whole GPUs, 4 × 3g.40gb (two per GPU) and 14 × 1g.10gb (seven per
// GPU): 6 of the 8 GPUs if packed, interleaved so that neither scheduler sees one kind first.
func migMix(n int) []gangSpec {
	var out []gangSpec
	for i := 0; i < n; i++ {
		kinds := []string{"whole", "whole", "3g.40gb", "3g.40gb", "3g.40gb", "3g.40gb"}
		for j := 0; j < 14; j++ {
			kinds = append(kinds, "1g.10gb")
		}
		// A fixed interleaving: whole, 3g, 1g, 1g, 1g, ... (no randomness: both see the same order).
		order := []int{0, 2, 6, 7, 8, 3, 9, 10, 11, 1, 12, 13, 14, 4, 15, 16, 17, 5, 18, 19}
		for _, k := range order {
			g := gangSpec{pods: 1, mig: kinds[k]}
			out = append(out, g)
		}
	}
	return out
}

func nodeName(i int) string { return fmt.Sprintf("n%05d", i) }

// createFairNode makes node i with 8 GPUs (whole, or partitionable with MIG devices), in rack
// i/rackSize when the scenario has racks.
func createFairNode(ctx context.Context, kube kubernetes.Interface, i int, sc scenario) error {
	name := nodeName(i)
	labels := map[string]string{"kubernetes.io/hostname": name}
	if sc.rackSize > 0 {
		labels[rackLabel] = fmt.Sprintf("rack-%04d", i/sc.rackSize)
	}
	node := fixture.Node(name, labels)
	node.UID = ""
	created, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Spec.Taints = nil // TaintNodesByCondition: no kubelet will clear not-ready
	if created, err = kube.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	created.Status = node.Status
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	slices := fixture.WholeGPUSlices(name, 8)
	if sc.mig {
		slices = fixture.PartitionableSlices(name, 8)
	}
	for _, s := range slices {
		s.UID = ""
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// createGangs creates the workload's objects, named prefix-<gang>[-<pod>]: for a gang of more
// than one pod an upstream PodGroup (scheduling.k8s.io/v1beta1, gang minCount = its pods, the
// topology as a scheduling constraint) that both schedulers read — tessera maps it to a gang
// of its own, the kube-scheduler's GangScheduling plugin schedules it — and per pod a
// ResourceClaim. The pods of both schedulers are the same but for spec.schedulerName (and
// tessera's queue label, which the kube-scheduler ignores).
func createGangs(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns, which, phase, prefix string, spec []gangSpec) {
	b.Helper()
	parallel(b, len(spec), func(g int) error {
		return createGang(ctx, kube, ns, which, phase, fmt.Sprintf("%s%05d", prefix, g), spec[g])
	})
}

func createGang(ctx context.Context, kube kubernetes.Interface, ns, which, phase, name string, g gangSpec) error {
	if g.pods > 1 {
		pg := &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(g.pods)},
			}},
		}
		if g.topology != "" {
			pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
				Topology: []schedulingv1beta1.TopologyConstraint{{Key: g.topology}},
			}
		}
		if _, err := kube.SchedulingV1beta1().PodGroups(ns).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("PodGroup %s: %w", name, err)
		}
	}
	for i := 0; i < g.pods; i++ {
		pod := name
		if g.pods > 1 {
			pod = fmt.Sprintf("%s-%02d", name, i)
		}
		if err := createFairPod(ctx, kube, ns, which, phase, pod, name, g); err != nil {
			return err
		}
	}
	return nil
}

// createFairPod makes one pod with a claim of its own (same name).
func createFairPod(ctx context.Context, kube kubernetes.Interface, ns, which, phase, name, gang string, g gangSpec) error {
	var c = fixture.GPUClaim(ns, name, max(g.gpus, 1))
	if g.mig != "" && g.mig != "whole" {
		c = fixture.MIGClaim(ns, name, g.mig)
	}
	c.UID = ""
	if _, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("claim %s: %w", name, err)
	}
	p := fixture.Pod(ns, name, name)
	p.UID = ""
	p.Labels = map[string]string{v1alpha1.QueueLabel: fairQueue, phaseLabel: phase, gangLabel: gang}
	if which == "stock" {
		p.Spec.SchedulerName = v1.DefaultSchedulerName
	}
	if g.pods > 1 {
		p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To(gang)}
	}
	if g.node != "" {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": g.node}
	}
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("pod %s: %w", name, err)
	}
	return nil
}

// fairQueue is tessera's queue of every benchmark pod (no quota).
const fairQueue = "bench"
