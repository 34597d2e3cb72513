// Package overview builds a read-only picture of a tessera cluster — GPUs per
// node and what is allocated on them, queue usage against quota and limit, and
// gangs with the reason they wait — from the API objects alone. `tessera top`
// and `tessera get` render it.
package overview

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
)

// Driver is the DRA driver whose devices the overview counts.
const Driver = contract.DriverName

// Cluster is the overview at one moment.
type Cluster struct {
	Time   time.Time `json:"time"`
	Nodes  []Node    `json:"nodes"`
	Queues []Queue   `json:"queues"`
	Gangs  []Gang    `json:"gangs"`
	Totals Totals    `json:"totals"`
}

// Node is one node's GPUs.
type Node struct {
	Name string `json:"name"`
	GPUs []GPU  `json:"gpus"`
}

// GPU is one physical GPU and how much of it is allocated.
type GPU struct {
	Minor   int    `json:"minor"`
	Product string `json:"product,omitempty"`
	// MemoryBytes is the GPU's memory as its slices publish it (0 when unknown).
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Mode is how the GPU is offered: whole, mig (dynamic or static
	// partitions) or shared (fractions by consumable capacity).
	Mode string `json:"mode"`
	// Used is the allocated part in GPU units (0 to 1).
	Used float64 `json:"used"`
	// Detail says what is allocated: "whole", "3/7 slices: 1g.10gb×3",
	// "20Gi of 80Gi".
	Detail string `json:"detail,omitempty"`
	// Tainted is true while a health taint is on any of its devices.
	Tainted bool `json:"tainted,omitempty"`
	// Claims are the namespace/name of the claims holding parts of it.
	Claims []string `json:"claims,omitempty"`
}

// Queue is a queue's GPU usage against its quota and limit (GPU units).
type Queue struct {
	Name      string   `json:"name"`
	Parent    string   `json:"parent,omitempty"`
	Depth     int      `json:"depth"`
	Allocated float64  `json:"allocated"`
	Requested float64  `json:"requested"`
	Quota     *float64 `json:"quota,omitempty"`
	Limit     *float64 `json:"limit,omitempty"`
	Weight    int32    `json:"overQuotaWeight"`
}

// Gang is one PodGroup.
type Gang struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Queue     string `json:"queue,omitempty"`
	Phase     string `json:"phase"`
	MinMember int32  `json:"minMember"`
	Members   int32  `json:"members"`
	Scheduled int32  `json:"scheduled"`
	Running   int32  `json:"running"`
	Succeeded int32  `json:"succeeded,omitempty"`
	Failed    int32  `json:"failed,omitempty"`
	// Reason is why a pending gang waits, in the scheduler's words.
	Reason string `json:"reason,omitempty"`
	// ReasonCode is the same as one word: the condition's reason, such as
	// QuotaExceeded or Unschedulable (a metric label).
	ReasonCode string `json:"reasonCode,omitempty"`
	// Position is a waiting gang's place in line: in its queue and overall (status
	// queuePosition; nil when it is not waiting to be placed).
	Position *v1alpha1.QueuePosition `json:"position,omitempty"`
	// Waiting is how long a pending gang has waited since it was created.
	Waiting time.Duration `json:"waiting,omitempty"`
	Age     time.Duration `json:"age"`
}

// Totals summarise the cluster.
type Totals struct {
	GPUs          int           `json:"gpus"`
	GPUsUsed      float64       `json:"gpusUsed"`
	Utilisation   float64       `json:"utilisation"`
	GangsPending  int           `json:"gangsPending"`
	GangsRunning  int           `json:"gangsRunning"`
	GangsFinished int           `json:"gangsFinished"`
	LongestWait   time.Duration `json:"longestWait"`
	MeanWait      time.Duration `json:"meanWait"`
}

// Input is what Build reads.
type Input struct {
	Slices    []resourceapi.ResourceSlice
	Claims    []resourceapi.ResourceClaim
	Queues    []v1alpha1.Queue
	PodGroups []v1alpha1.PodGroup
	Now       time.Time
}

// Build computes the overview.
func Build(in Input) Cluster {
	c := Cluster{Time: in.Now}
	c.Nodes = buildNodes(in.Slices, in.Claims)
	c.Queues = buildQueues(in.Queues)
	c.Gangs = buildGangs(in.PodGroups, in.Now)
	for _, n := range c.Nodes {
		c.Totals.GPUs += len(n.GPUs)
		for _, g := range n.GPUs {
			c.Totals.GPUsUsed += g.Used
		}
	}
	if c.Totals.GPUs > 0 {
		c.Totals.Utilisation = c.Totals.GPUsUsed / float64(c.Totals.GPUs)
	}
	var waitSum time.Duration
	for _, g := range c.Gangs {
		switch g.Phase {
		case string(v1alpha1.PodGroupPending):
			c.Totals.GangsPending++
			waitSum += g.Waiting
			c.Totals.LongestWait = max(c.Totals.LongestWait, g.Waiting)
		case string(v1alpha1.PodGroupFinished):
			c.Totals.GangsFinished++
		default:
			c.Totals.GangsRunning++
		}
	}
	if c.Totals.GangsPending > 0 {
		c.Totals.MeanWait = waitSum / time.Duration(c.Totals.GangsPending)
	}
	return c
}

// gpuKey identifies a physical GPU: the pool (one per node) and its minor.
type gpuKey struct {
	pool  string
	minor int
}

type gpuInfo struct {
	node        string
	product     string
	mode        string
	memory      int64 // bytes
	slices      int   // MIG memory slices (counters), 0 if not MIG
	deviceSlice map[string]int
	tainted     bool
	usedUnits   float64
	whole       bool
	migUsed     map[string]int // profile → count
	sliceUsed   int
	sharedUsed  int64
	claims      map[string]bool
}

func buildNodes(slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) []Node {
	gpus := map[gpuKey]*gpuInfo{}
	get := func(k gpuKey, node string) *gpuInfo {
		g := gpus[k]
		if g == nil {
			g = &gpuInfo{node: node, mode: "whole", deviceSlice: map[string]int{}, migUsed: map[string]int{}, claims: map[string]bool{}}
			gpus[k] = g
		}
		return g
	}
	var own []*resourceapi.ResourceSlice
	for i := range slices {
		if slices[i].Spec.Driver == Driver {
			own = append(own, &slices[i])
		}
	}
	// What each device costs in GPU units: the same function the scheduler charges quota with.
	costs := contract.Costs(own)
	counterSlices := map[string]int{} // counter set name → number of memory-slice counters
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != Driver {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			for name := range cs.Counters {
				if contract.IsMemorySliceCounter(name) {
					counterSlices[s.Spec.Pool.Name+"/"+cs.Name]++
				}
			}
		}
	}
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != Driver {
			continue
		}
		node := s.Spec.Pool.Name
		if s.Spec.NodeName != nil {
			node = *s.Spec.NodeName
		}
		for _, d := range s.Spec.Devices {
			name, err := devicename.Parse(d.Name)
			if err != nil {
				continue
			}
			g := get(gpuKey{s.Spec.Pool.Name, name.Minor}, node)
			if len(d.Taints) > 0 {
				g.tainted = true
			}
			if p := contract.StringAttr(&d, contract.AttrProductName); p != "" {
				g.product = p
			}
			mem := d.Capacity[contract.CapMemory].Value
			switch name.Kind {
			case devicename.KindGPU:
				g.memory = mem.Value()
			case devicename.KindShared:
				g.mode = "shared"
				g.memory = mem.Value()
			case devicename.KindMIG:
				g.mode = "mig"
				n := 0
				for _, cc := range d.ConsumesCounters {
					g.slices = max(g.slices, counterSlices[s.Spec.Pool.Name+"/"+cc.CounterSet])
					for counter := range cc.Counters {
						if contract.IsMemorySliceCounter(counter) {
							n++
						}
					}
				}
				g.deviceSlice[d.Name] = n
			}
		}
	}
	for i := range claims {
		cl := &claims[i]
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != Driver {
				continue
			}
			name, err := devicename.Parse(r.Device)
			if err != nil {
				continue
			}
			g := gpus[gpuKey{r.Pool, name.Minor}]
			if g == nil {
				continue
			}
			g.claims[cl.Namespace+"/"+cl.Name] = true
			g.usedUnits += costs[contract.DeviceRef{Driver: r.Driver, Pool: r.Pool, Device: r.Device}].Result(&r)
			switch name.Kind {
			case devicename.KindGPU:
				g.whole = true
			case devicename.KindMIG:
				g.migUsed[name.Profile]++
				g.sliceUsed += g.deviceSlice[r.Device]
			case devicename.KindShared:
				if q, ok := r.ConsumedCapacity[contract.CapMemory]; ok {
					g.sharedUsed += q.Value()
				}
			}
		}
	}
	byNode := map[string][]GPU{}
	for k, g := range gpus {
		out := GPU{Minor: k.minor, Product: g.product, MemoryBytes: g.memory, Mode: g.mode, Used: math.Min(g.usedUnits, 1), Tainted: g.tainted}
		switch {
		case g.whole:
			out.Detail = "whole"
		case g.sliceUsed > 0:
			var parts []string
			for p, n := range g.migUsed {
				parts = append(parts, p+"×"+itoa(n))
			}
			sort.Strings(parts)
			out.Detail = itoa(g.sliceUsed) + "/" + itoa(g.slices) + " slices: " + strings.Join(parts, " ")
		case g.sharedUsed > 0:
			out.Detail = bytesString(g.sharedUsed) + " of " + bytesString(g.memory)
		}
		for c := range g.claims {
			out.Claims = append(out.Claims, c)
		}
		sort.Strings(out.Claims)
		byNode[g.node] = append(byNode[g.node], out)
	}
	nodes := make([]Node, 0, len(byNode))
	for name, list := range byNode {
		sort.Slice(list, func(i, j int) bool { return list[i].Minor < list[j].Minor })
		nodes = append(nodes, Node{Name: name, GPUs: list})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes
}

func buildQueues(queues []v1alpha1.Queue) []Queue {
	byName := map[string]*v1alpha1.Queue{}
	children := map[string][]string{}
	for i := range queues {
		q := &queues[i]
		byName[q.Name] = q
	}
	var roots []string
	for _, q := range queues {
		if q.Spec.Parent == "" || byName[q.Spec.Parent] == nil {
			roots = append(roots, q.Name)
		} else {
			children[q.Spec.Parent] = append(children[q.Spec.Parent], q.Name)
		}
	}
	sort.Strings(roots)
	var out []Queue
	seen := map[string]bool{}
	var walk func(name string, depth int)
	walk = func(name string, depth int) {
		if seen[name] { // a parent loop: the scheduler reports it on the queue
			return
		}
		seen[name] = true
		q := byName[name]
		row := Queue{Name: name, Parent: q.Spec.Parent, Depth: depth, Weight: 1}
		row.Allocated = quantity(q.Status.Allocated["gpu"])
		row.Requested = quantity(q.Status.Requested["gpu"])
		if gq := q.Spec.Resources.GPU; gq != nil {
			if gq.Quota != nil {
				v := quantity(*gq.Quota)
				row.Quota = &v
			}
			if gq.Limit != nil {
				v := quantity(*gq.Limit)
				row.Limit = &v
			}
			if gq.OverQuotaWeight != nil {
				row.Weight = *gq.OverQuotaWeight
			}
		}
		out = append(out, row)
		kids := children[name]
		sort.Strings(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return out
}

func buildGangs(groups []v1alpha1.PodGroup, now time.Time) []Gang {
	out := make([]Gang, 0, len(groups))
	for _, pg := range groups {
		g := Gang{
			Namespace: pg.Namespace, Name: pg.Name, Queue: pg.Spec.Queue, Phase: string(pg.Status.Phase),
			MinMember: pg.Spec.MinMember, Members: pg.Status.Members, Scheduled: pg.Status.Scheduled, Running: pg.Status.Running,
			Succeeded: pg.Status.Succeeded, Failed: pg.Status.Failed, Position: pg.Status.QueuePosition,
			Age: now.Sub(pg.CreationTimestamp.Time).Round(time.Second),
		}
		if g.Phase == "" {
			g.Phase = string(v1alpha1.PodGroupPending)
		}
		if g.Phase == string(v1alpha1.PodGroupPending) {
			g.Waiting = g.Age
			for _, t := range []string{"QueueResolved", "Mapped", "Scheduled"} {
				if c := meta.FindStatusCondition(pg.Status.Conditions, t); c != nil && c.Status != "True" && c.Message != "" {
					g.Reason, g.ReasonCode = c.Message, c.Reason
					break
				}
			}
		}
		out = append(out, g)
	}
	order := func(phase string) int {
		switch phase {
		case string(v1alpha1.PodGroupPending):
			return 0
		case string(v1alpha1.PodGroupFinished):
			return 2
		}
		return 1
	}
	sort.Slice(out, func(i, j int) bool {
		if oi, oj := order(out[i].Phase), order(out[j].Phase); oi != oj {
			return oi < oj
		}
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func quantity(q resource.Quantity) float64 { return q.AsApproximateFloat64() }

func itoa(n int) string {
	return resource.NewQuantity(int64(n), resource.DecimalSI).String()
}

// bytesString shows memory in Gi, with one decimal where it is not whole (an H100
// 80GB reports 81,559 MiB to NVML: "79.6Gi", not "81559Mi"); below 1Gi in Mi.
func bytesString(b int64) string {
	const gi = 1 << 30
	switch {
	case b%gi == 0:
		return itoa(int(b/gi)) + "Gi"
	case b >= gi:
		return strconv.FormatFloat(float64(b)/gi, 'f', 1, 64) + "Gi"
	}
	return resource.NewQuantity(b, resource.BinarySI).String()
}
