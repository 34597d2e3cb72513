package shadow

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// featuresOf reads the DRA features the cluster serves from the objects that use them. The
// scheduler finds them by dry-run creates; the shadow may not write, not even dry runs. The API
// server drops the fields of a feature it does not serve, so a stored slice with shared
// counters proves partitionable devices, a device that allows multiple allocations proves
// consumable capacity, a device taint (from the slice or a DeviceTaintRule, as the tracker
// applies them) proves device taints, and a claim with a prioritized list proves that feature.
// A feature no object uses cannot change a decision: the allocator only looks at it for
// devices and requests that use it.
func featuresOf(slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) structured.Features {
	f := structured.Features{AdminAccess: true}
	for _, s := range slices {
		if len(s.Spec.SharedCounters) > 0 {
			f.PartitionableDevices = true
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if len(d.ConsumesCounters) > 0 {
				f.PartitionableDevices = true
			}
			if d.AllowMultipleAllocations != nil {
				f.ConsumableCapacity = true
			}
			if len(d.Taints) > 0 {
				f.DeviceTaints = true
			}
		}
	}
	for _, c := range claims {
		for _, r := range c.Spec.Devices.Requests {
			if len(r.FirstAvailable) > 0 {
				f.PrioritizedList = true
			}
			if r.Exactly != nil && r.Exactly.Capacity != nil {
				f.ConsumableCapacity = true
			}
		}
	}
	return f
}

// featureCache keeps one CEL cache per feature set (compiled selectors are reused).
type featureCache struct {
	last  structured.Features
	cache *cel.Cache
}

func (c *featureCache) get(f structured.Features) *cel.Cache {
	if c.cache == nil || c.last != f {
		c.last, c.cache = f, snapshot.NewCELCache(f)
	}
	return c.cache
}

// costFunc prices allocations in GPU units with contract.Costs, the function quota uses.
type costFunc map[contract.DeviceRef]contract.Cost

func newCosts(slices []*resourceapi.ResourceSlice, drivers map[string]bool) costFunc {
	var own []*resourceapi.ResourceSlice
	for _, s := range slices {
		if drivers[s.Spec.Driver] {
			own = append(own, s)
		}
	}
	return contract.Costs(own)
}

func (c costFunc) allocation(a *resourceapi.AllocationResult) float64 {
	u := 0.0
	for i := range a.Devices.Results {
		r := &a.Devices.Results[i]
		if cost, ok := c[contract.DeviceRef{Driver: r.Driver, Pool: r.Pool, Device: r.Device}]; ok {
			u += cost.Result(r)
		}
	}
	return u
}

// nodeUnits is one node's GPU capacity and use in GPU units.
type nodeUnits struct{ total, used float64 }

// fragmentation is the share of free GPU units that lie on nodes partly in use: capacity a
// gang asking for whole nodes cannot use. 0 when nothing is free or every free unit is on an
// empty node.
func fragmentation(nodes []nodeUnits) float64 {
	free, stranded := 0.0, 0.0
	for _, n := range nodes {
		f := max(0, n.total-n.used)
		free += f
		if n.used > 1e-9 {
			stranded += f
		}
	}
	if free < 1e-9 {
		return 0
	}
	return stranded / free
}

// actualNodeUnits are the nodes' GPU units as tessera top counts them (overview, driver
// gpu.tessera.dev).
func actualNodeUnits(slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) []nodeUnits {
	in := overview.Input{}
	for _, s := range slices {
		in.Slices = append(in.Slices, *s)
	}
	for _, c := range claims {
		in.Claims = append(in.Claims, *c)
	}
	var out []nodeUnits
	for _, n := range overview.Build(in).Nodes {
		u := nodeUnits{total: float64(len(n.GPUs))}
		for _, g := range n.GPUs {
			u.used += g.Used
		}
		out = append(out, u)
	}
	return out
}

func snapshotNodeUnits(s *snapshot.Snapshot) []nodeUnits {
	out := make([]nodeUnits, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		if n.GPUTotal > 0 {
			out = append(out, nodeUnits{total: n.GPUTotal, used: n.GPUUsed})
		}
	}
	return out
}
