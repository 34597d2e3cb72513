package snapshot

import (
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/contract"
)

// Fingerprint describes everything a snapshot holds that the solver, the allocator and the
// kube-scheduler's filters read, in a canonical form: two snapshots with the same
// fingerprint give the same decisions. Objects are named by pointer, so a snapshot that
// holds a stale copy of an object differs from one that holds the current one.
func Fingerprint(s *Snapshot, claims []*resourceapi.ResourceClaim) string {
	var b strings.Builder
	for _, ni := range s.Nodes {
		fmt.Fprintf(&b, "node %s %p pods=%d gpu=%v/%v plain=%v\n", ni.Name(), ni.Node, ni.Pods, ni.GPUTotal, ni.GPUUsed, ni.plainGPUs)
		for _, sl := range ni.Slices {
			fmt.Fprintf(&b, "  slice %s %p\n", sl.Name, sl)
		}
		fmt.Fprintf(&b, "  requested %s\n", requestsString(ni))
		fmt.Fprintf(&b, "  allocated %s\n", allocatedString(ni.Allocated))
		fmt.Fprintf(&b, "  costs %s\n", costsString(ni.costs))
		if s.byName[ni.Name()] != ni {
			fmt.Fprintf(&b, "  byName differs\n")
		}
		vi := s.Pods.Node(ni.Name())
		if vi == nil {
			fmt.Fprintf(&b, "  no view\n")
			continue
		}
		var uids []string
		for _, p := range vi.GetPods() {
			uids = append(uids, string(p.GetPod().UID)+"@"+p.GetPod().Spec.NodeName)
		}
		sort.Strings(uids)
		fmt.Fprintf(&b, "  view node=%p pods=%v requested=%+v nonzero=%+v ports=%v affinity=%d anti=%d wide=%d pvc=%v\n",
			vi.Node(), uids, vi.GetRequested(), vi.GetNonZeroRequested(), vi.GetUsedPorts(),
			len(vi.GetPodsWithAffinity()), len(vi.GetPodsWithRequiredAntiAffinity()), len(vi.GetPodsWithRequiredNonHostScopedAntiAffinity()), vi.GetPVCRefCounts())
	}
	list, _ := s.Pods.NodeInfos().List()
	fmt.Fprintf(&b, "view nodes=%d", len(list))
	for i, ni := range list {
		if i >= len(s.Nodes) || ni.Node().Name != s.Nodes[i].Name() {
			fmt.Fprintf(&b, " order differs at %d", i)
		}
	}
	for i := 0; i < 4; i++ {
		fmt.Fprintf(&b, " pvc-%d:%v", i, s.Pods.StorageInfos().IsPVCUsedByPods(fmt.Sprintf("ns/pvc-%d", i)))
	}
	b.WriteString("\n")
	for _, sl := range s.sharedSlices {
		fmt.Fprintf(&b, "shared slice %s %p\n", sl.Name, sl)
	}
	fmt.Fprintf(&b, "shared costs %s\nshared allocated %s\n", costsString(s.sharedCosts), allocatedString(s.sharedAllocated))
	var pools []string
	for k, n := range s.poolNode {
		pools = append(pools, k.driver+"/"+k.pool+"="+n)
	}
	sort.Strings(pools)
	fmt.Fprintf(&b, "pools %v\n", pools)
	for _, c := range claims {
		fmt.Fprintf(&b, "claim %s/%s %p\n", c.Namespace, c.Name, s.Claim(c.Namespace, c.Name))
	}
	return b.String()
}

func requestsString(ni *NodeInfo) string {
	var out []string
	for name, q := range ni.Requested {
		out = append(out, string(name)+"="+q.AsDec().String())
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func allocatedString(a structured.AllocatedState) string {
	var out []string
	for id := range a.AllocatedDevices {
		out = append(out, "d:"+id.String())
	}
	for id := range a.AllocatedSharedDeviceIDs {
		out = append(out, "s:"+id.String())
	}
	for id, c := range a.AggregatedCapacity {
		out = append(out, fmt.Sprintf("c:%s=%v", id.String(), c))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func costsString(c map[structured.DeviceID]contract.Cost) string {
	var out []string
	for id, cost := range c {
		m := ""
		if cost.Memory != nil {
			m = cost.Memory.String()
		}
		out = append(out, fmt.Sprintf("%s=%v/%s", id.String(), cost.Units, m))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// WhatIfSources returns how many what-ifs w derived from the state of the cycle's snapshot
// and how many it built with New.
func WhatIfSources(w *WhatIf) (fromCycle, fromNew int) { return w.fromCycle, w.fromNew }
