// Package baseline records the evaluation checklist's baseline of a cluster before its
// scheduler is switched: GPU nodes and types with their memory, allocatable against allocated
// GPU units per node and per queue, MIG and shared-GPU use, pending pods and their waits
// (p50/p99 over a sampled window), catalog coverage of the installed workload CRDs, and the
// objects the catalog could not map. A report is printed, or saved as JSON; Diff lists, field
// by field, what changed between two saved reports (before and after switching).
//
// Build is pure (tests feed it); Collect reads the cluster (read only).
package baseline

import (
	"fmt"
	"sort"
	"time"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
)

// Report is one baseline.
type Report struct {
	Time time.Time `json:"time"`
	// WindowSeconds is how long pending pods were sampled (0: one sample).
	WindowSeconds float64       `json:"windowSeconds"`
	Totals        Totals        `json:"totals"`
	Nodes         []Node        `json:"nodes"`
	GPUTypes      []GPUType     `json:"gpuTypes"`
	Queues        []Queue       `json:"queues"`
	Pending       Pending       `json:"pending"`
	Coverage      []Kind        `json:"coverage"`
	MappingErrors []MappingFail `json:"mappingErrors"`
}

// Totals over the cluster.
type Totals struct {
	GPUNodes int `json:"gpuNodes"`
	GPUs     int `json:"gpus"`
	// Allocated GPU units (a whole GPU is 1; MIG devices and shares their fraction), and
	// Utilisation, which is allocation: Allocated over GPUs.
	Allocated   float64 `json:"allocated"`
	Utilisation float64 `json:"utilisation"`
	// GPUUtilPercent is measured use: the mean over GPUs of dcgm-exporter's
	// DCGM_FI_DEV_GPU_UTIL averaged over the samples (only with --dcgm-url; nil without).
	// GPUsWithUtil counts the GPUs it covers; UnknownGPUsWithUtil the exporters' GPUs whose
	// UUID no node agent publishes.
	GPUUtilPercent      *float64 `json:"gpuUtilPercent,omitempty"`
	GPUsWithUtil        int      `json:"gpusWithUtil,omitempty"`
	UnknownGPUsWithUtil int      `json:"unknownGPUsWithUtil,omitempty"`
	WholeGPUs           int      `json:"wholeGPUs"`
	MIGGPUs             int      `json:"migGPUs"`
	SharedGPUs          int      `json:"sharedGPUs"`
	// CoveredKinds and UncoveredKinds count the served workload CRD versions with and
	// without a catalog definition.
	CoveredKinds   int `json:"coveredKinds"`
	UncoveredKinds int `json:"uncoveredKinds"`
	MappingErrors  int `json:"mappingErrors"`
}

// Node is one GPU node.
type Node struct {
	Name string `json:"name"`
	GPUs int    `json:"gpus"`
	// Allocatable GPU units (one per GPU) and allocated ones.
	Allocatable float64 `json:"allocatable"`
	Allocated   float64 `json:"allocated"`
	MIGGPUs     int     `json:"migGPUs"`
	SharedGPUs  int     `json:"sharedGPUs"`
	// MIG and shared GPUs with anything allocated on them.
	MIGInUse    int `json:"migInUse"`
	SharedInUse int `json:"sharedInUse"`
	// GPUUtilPercent is the mean measured utilisation of the node's GPUs that dcgm-exporter
	// reported (GPUsWithUtil of them); nil without --dcgm-url or samples.
	GPUUtilPercent *float64 `json:"gpuUtilPercent,omitempty"`
	GPUsWithUtil   int      `json:"gpusWithUtil,omitempty"`
}

// GPUType is a product and memory size, and how many GPUs of it there are.
type GPUType struct {
	Product     string `json:"product"`
	MemoryBytes int64  `json:"memoryBytes"`
	Count       int    `json:"count"`
}

// Queue is a queue's GPU units against its quota and limit.
type Queue struct {
	Name      string   `json:"name"`
	Allocated float64  `json:"allocated"`
	Quota     *float64 `json:"quota,omitempty"`
	Limit     *float64 `json:"limit,omitempty"`
}

// Pending is the pods waiting for a node and how long pods waited.
type Pending struct {
	// Pods waiting at the last sample.
	Pods int `json:"pods"`
	// Wait over every pod seen pending during the window: until it was bound, or until the
	// last sample for pods still waiting (seconds).
	Wait shadowreport.Distribution `json:"waitSeconds"`
}

// Kind is one served version of an installed CRD and the catalog definition that maps it
// ("" when none does).
type Kind struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Definition string `json:"definition,omitempty"`
}

// MappingFail is an object (a gang's PodGroup, or a shadow report's gang) whose pods the
// catalog could not map, and why.
type MappingFail struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Reason    string `json:"reason"`
	Message   string `json:"message,omitempty"`
}

// Input is what Build reads.
type Input struct {
	Now     time.Time
	Window  time.Duration
	Cluster overview.Cluster
	// Waits are the pods' waits in seconds (Sampler.Waits); PendingNow the pods pending at
	// the last sample.
	Waits      []float64
	PendingNow int
	Coverage   []Kind
	Mapping    []MappingFail
	// GPUUtil is each GPU's mean DCGM_FI_DEV_GPU_UTIL by UUID (UtilSampler.Means; nil when
	// not measured); GPUNodes the node of each GPU UUID (GPUNodes).
	GPUUtil  map[string]float64
	GPUNodes map[string]string
}

// Build makes the report.
func Build(in Input) Report {
	r := Report{Time: in.Now, WindowSeconds: in.Window.Seconds(), Nodes: []Node{}, GPUTypes: []GPUType{}, Queues: []Queue{},
		Coverage: append([]Kind{}, in.Coverage...), MappingErrors: append([]MappingFail{}, in.Mapping...)}
	types := map[GPUType]int{}
	for _, n := range in.Cluster.Nodes {
		if len(n.GPUs) == 0 {
			continue
		}
		node := Node{Name: n.Name, GPUs: len(n.GPUs), Allocatable: float64(len(n.GPUs))}
		for _, g := range n.GPUs {
			node.Allocated += g.Used
			switch g.Mode {
			case "mig":
				node.MIGGPUs++
				if g.Used > 0 {
					node.MIGInUse++
				}
			case "shared":
				node.SharedGPUs++
				if g.Used > 0 {
					node.SharedInUse++
				}
			default:
				r.Totals.WholeGPUs++
			}
			types[GPUType{Product: g.Product, MemoryBytes: g.MemoryBytes}]++
		}
		node.Allocated = round3(node.Allocated)
		r.Nodes = append(r.Nodes, node)
		r.Totals.GPUNodes++
		r.Totals.GPUs += node.GPUs
		r.Totals.Allocated += node.Allocated
		r.Totals.MIGGPUs += node.MIGGPUs
		r.Totals.SharedGPUs += node.SharedGPUs
	}
	r.Totals.Allocated = round3(r.Totals.Allocated)
	if r.Totals.GPUs > 0 {
		r.Totals.Utilisation = round3(r.Totals.Allocated / float64(r.Totals.GPUs))
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	for t, n := range types {
		t.Count = n
		r.GPUTypes = append(r.GPUTypes, t)
	}
	sort.Slice(r.GPUTypes, func(i, j int) bool { return typeKey(r.GPUTypes[i]) < typeKey(r.GPUTypes[j]) })
	for _, q := range in.Cluster.Queues {
		r.Queues = append(r.Queues, Queue{Name: q.Name, Allocated: round3(q.Allocated), Quota: q.Quota, Limit: q.Limit})
	}
	sort.Slice(r.Queues, func(i, j int) bool { return r.Queues[i].Name < r.Queues[j].Name })
	r.Pending = Pending{Pods: in.PendingNow, Wait: shadowreport.Distribute(in.Waits)}
	for _, k := range r.Coverage {
		if k.Definition != "" {
			r.Totals.CoveredKinds++
		} else {
			r.Totals.UncoveredKinds++
		}
	}
	sort.Slice(r.Coverage, func(i, j int) bool {
		return r.Coverage[i].APIVersion+r.Coverage[i].Kind < r.Coverage[j].APIVersion+r.Coverage[j].Kind
	})
	sort.Slice(r.MappingErrors, func(i, j int) bool {
		return r.MappingErrors[i].Namespace+"/"+r.MappingErrors[i].Name < r.MappingErrors[j].Namespace+"/"+r.MappingErrors[j].Name
	})
	r.Totals.MappingErrors = len(r.MappingErrors)
	utilisation(&r, in.GPUUtil, in.GPUNodes)
	return r
}

func typeKey(t GPUType) string { return fmt.Sprintf("%s/%020d", t.Product, t.MemoryBytes) }

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// mappingErrorReasons are the Mapped reasons of pods the catalog could not map.
var mappingErrorReasons = map[string]bool{
	v1alpha1.ReasonUnknownWorkload: true, v1alpha1.ReasonNoComponent: true, v1alpha1.ReasonCatalogUnavailable: true,
}

// MappingFailure returns the failure a Mapped condition reports, if it is one.
func MappingFailure(namespace, name, reason, message string) (MappingFail, bool) {
	if !mappingErrorReasons[reason] {
		return MappingFail{}, false
	}
	return MappingFail{Namespace: namespace, Name: name, Reason: reason, Message: message}, true
}
