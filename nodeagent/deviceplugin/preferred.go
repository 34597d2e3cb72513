package deviceplugin

import (
	"context"
	"sort"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GetPreferredAllocation answers, per container, which of the available
// devices to take: for whole GPUs the best NVLink-connected set
// (go-gpuallocator), for time-sliced replicas spread or pack, for MIG devices
// GPU and placement order. The answer is advice (the kubelet intersects it
// with what is available and falls back to its own choice), while an error
// fails the pod's admission; so device IDs this plugin does not know (say,
// from a checkpoint of the kubelet written before the plugin's devices
// changed) are passed through or left out and logged, never an error.
func (s *server) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	logger := klog.FromContext(s.p.ctx).WithValues("resource", s.res.name)
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		start := time.Now()
		ids, unknown := s.p.preferred(s.res, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		s.p.metrics.preferredDuration.WithLabelValues(s.res.name).Observe(time.Since(start).Seconds())
		if len(unknown) > 0 {
			logger.Info("Preferred allocation request names devices this plugin does not serve", "unknown", unknown)
		}
		logger.V(3).Info("Preferred allocation", "size", cr.GetAllocationSize(), "available", len(cr.GetAvailableDeviceIDs()), "devices", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// preferred picks size device IDs of r from available, must-include first.
// Unknown must-include IDs are kept (the kubelet has them allocated
// already), unknown available IDs are not picked; both are returned in
// unknown. With too few devices it returns what there is.
func (p *Plugin) preferred(r *resource, available, must []string, size int) (picked, unknown []string) {
	var req []*advertised
	var keep []string // must-include IDs, known or not, in the kubelet's order
	inReq := map[string]bool{}
	for _, id := range must {
		if inReq[id] {
			continue
		}
		inReq[id] = true
		keep = append(keep, id)
		if a, ok := r.byID[id]; ok {
			req = append(req, a)
		} else {
			unknown = append(unknown, id)
		}
	}
	if len(keep) >= size {
		return keep, unknown
	}
	var free []*advertised
	seen := map[string]bool{}
	for _, id := range available {
		if seen[id] || inReq[id] {
			continue
		}
		seen[id] = true
		a, ok := r.byID[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		free = append(free, a)
	}
	// Present the candidates in the resource's order (GPU index, MIG
	// placement, replica number), whatever order the kubelet sent.
	order := make(map[string]int, len(r.devices))
	for i, a := range r.devices {
		order[a.id] = i
	}
	sort.Slice(free, func(i, j int) bool { return order[free[i].id] < order[free[j].id] })
	want := size - (len(keep) - len(req)) // devices to pick besides unknown must-includes
	if len(req)+len(free) <= want {
		return append(keep, ids(free)...), unknown
	}
	var chosen []*advertised
	switch {
	case r.replicated:
		chosen = pickReplicas(p.cfg.TimeSlicing.Policy, free, req, want)
	case r.whole:
		if topoPicked, ok := p.topo.pick(ids(append(append([]*advertised(nil), req...), free...)), ids(req), want); ok {
			return append(unknownOnly(keep, r), topoPicked...), unknown
		}
		fallthrough
	default:
		chosen = append(append([]*advertised(nil), req...), free[:want-len(req)]...)
	}
	return append(unknownOnly(keep, r), ids(chosen)...), unknown
}

// unknownOnly keeps the IDs that r does not serve.
func unknownOnly(list []string, r *resource) []string {
	var out []string
	for _, id := range list {
		if _, ok := r.byID[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// pickReplicas extends req to size replicas from free (in resource order)
// following the policy:
//   - spread takes each next replica from the GPU this request uses least,
//     then from the GPU with the most free replicas (least shared);
//   - pack keeps to the GPUs the request already uses, then takes the GPU
//     whose free replicas fit what is left most tightly (already shared GPUs
//     first), else the one with the most free replicas.
func pickReplicas(policy ReplicaPolicy, free, req []*advertised, size int) []*advertised {
	type group struct {
		free  []*advertised
		taken int
		order int
	}
	groups := map[*unit]*group{}
	var list []*group
	get := func(u *unit) *group {
		g, ok := groups[u]
		if !ok {
			g = &group{order: len(list)}
			groups[u] = g
			list = append(list, g)
		}
		return g
	}
	for _, a := range req {
		get(a.unit).taken++
	}
	for _, a := range free {
		g := get(a.unit)
		g.free = append(g.free, a)
	}
	out := append([]*advertised(nil), req...)
	for len(out) < size {
		need := size - len(out)
		var best *group
		for _, g := range list {
			if len(g.free) == 0 {
				continue
			}
			if best == nil || better(policy, g.taken, len(g.free), g.order, best.taken, len(best.free), best.order, need) {
				best = g
			}
		}
		n := 1
		if policy == ReplicaPolicyPack {
			n = min(need, len(best.free))
		}
		out = append(out, best.free[:n]...)
		best.free = best.free[n:]
		best.taken += n
	}
	return out
}

// better reports whether group a (taken, free, order) beats group b.
func better(policy ReplicaPolicy, aTaken, aFree, aOrder, bTaken, bFree, bOrder, need int) bool {
	if policy == ReplicaPolicyPack {
		if (aTaken > 0) != (bTaken > 0) {
			return aTaken > 0
		}
		aFits, bFits := aFree >= need, bFree >= need
		if aFits != bFits {
			return aFits
		}
		if aFree != bFree {
			if aFits {
				return aFree < bFree // tightest fit
			}
			return aFree > bFree // biggest chunk
		}
		return aOrder < bOrder
	}
	if aTaken != bTaken {
		return aTaken < bTaken
	}
	if aFree != bFree {
		return aFree > bFree
	}
	return aOrder < bOrder
}

func ids(devs []*advertised) []string {
	out := make([]string, len(devs))
	for i, a := range devs {
		out[i] = a.id
	}
	return out
}
