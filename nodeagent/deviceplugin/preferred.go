package deviceplugin

import (
	"context"
	"fmt"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GetPreferredAllocation answers, per container, which of the available
// devices to take: for whole GPUs the best NVLink-connected set
// (go-gpuallocator), for time-sliced replicas spread or pack, for MIG devices
// GPU and placement order. The kubelet may still choose otherwise.
func (s *server) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	logger := klog.FromContext(s.p.ctx).WithValues("resource", s.res.name)
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids, err := s.p.preferred(s.res, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "preferred allocation of %s: %v", s.res.name, err)
		}
		logger.V(3).Info("Preferred allocation", "size", cr.GetAllocationSize(), "available", len(cr.GetAvailableDeviceIDs()), "devices", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// preferred picks size device IDs of r from available, must-include first.
func (p *Plugin) preferred(r *resource, available, must []string, size int) ([]string, error) {
	if size < 0 {
		return nil, fmt.Errorf("allocation size %d is negative", size)
	}
	inAvail := map[string]bool{}
	var avail []*advertised
	for _, id := range available {
		a, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("available device %q is not a device of this resource", id)
		}
		if !inAvail[id] {
			inAvail[id] = true
			avail = append(avail, a)
		}
	}
	var req []*advertised
	inReq := map[string]bool{}
	for _, id := range must {
		a, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("must-include device %q is not a device of this resource", id)
		}
		if !inReq[id] {
			inReq[id] = true
			req = append(req, a)
		}
	}
	if len(req) >= size {
		return ids(req), nil
	}
	free := make([]*advertised, 0, len(avail))
	for _, a := range avail {
		if !inReq[a.id] {
			free = append(free, a)
		}
	}
	if len(req)+len(free) < size {
		return nil, fmt.Errorf("%d devices requested but only %d available", size, len(req)+len(free))
	}
	// Present the candidates in the resource's order (GPU index, MIG
	// placement, replica number), whatever order the kubelet sent.
	order := make(map[string]int, len(r.devices))
	for i, a := range r.devices {
		order[a.id] = i
	}
	sort.Slice(free, func(i, j int) bool { return order[free[i].id] < order[free[j].id] })

	switch {
	case r.replicated:
		return ids(pickReplicas(p.cfg.TimeSlicing.Policy, free, req, size)), nil
	case r.whole:
		if picked, ok := p.topo.pick(ids(append(append([]*advertised(nil), req...), free...)), ids(req), size); ok {
			return picked, nil
		}
	}
	return ids(append(req, free[:size-len(req)]...)), nil
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
