package snapshot

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Selector elision: the allocator is not asked again what pre-selection already answered.
//
// The structured allocator evaluates a request's CEL selectors (its class's and its own) on
// every free device it reaches, converting each device back to the API type first (a copy
// of its attribute map), and it keeps the results for one claim in one call: a call that
// allocates eight pods of a gang on a node evaluates them eight times per device. On the
// node agent's dynamic-MIG slices (14 attributes per device) that was 45 % of the
// allocator's time in a 64-pod MIG gang (docs/benchmarks.md).
//
// Pre-selection has evaluated the same selectors on the same devices the same way
// (prefilter.go, evaluate). When the claims of a call have one alternative — every request
// ExactCount, of one class with the same selectors, no firstAvailable, no admin access —
// whose selectors raised no error on the node, and every device of the view matches it
// except devices in AllocatedDevices (kept because they are in use: the allocator skips
// them before it looks at selectors), then every device the allocator can select satisfies
// the selectors, and a selector it evaluated would be true. The call then gets copies of the
// claims without their selectors and a class lister whose copy of that class has none
// either: the devices tried, their order, the steps and the result are the same
// (TestPreselectionSameAllocation compares them with and without both). The class's config
// is kept, since the allocator copies it into the result.

// elidable reports whether every request of the claims is of the kind elision keeps exact:
// an ExactCount request of one class, without admin access or firstAvailable.
func elidable(claims []*resourceapi.ResourceClaim) bool {
	for _, c := range claims {
		for i := range c.Spec.Devices.Requests {
			r := &c.Spec.Devices.Requests[i]
			if r.Exactly == nil || len(r.FirstAvailable) > 0 ||
				r.Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount ||
				(r.Exactly.AdminAccess != nil && *r.Exactly.AdminAccess) {
				return false
			}
		}
	}
	return true
}

// elideSelectors returns copies of the claims without request selectors and a class lister
// that serves the claims' classes without selectors. Only what is changed is copied; the
// caller's claims are not modified.
func elideSelectors(claims []*resourceapi.ResourceClaim, classes structured.DeviceClassLister) ([]*resourceapi.ResourceClaim, structured.DeviceClassLister) {
	out := make([]*resourceapi.ResourceClaim, len(claims))
	names := map[string]bool{}
	for i, c := range claims {
		cp := *c
		cp.Spec.Devices.Requests = make([]resourceapi.DeviceRequest, len(c.Spec.Devices.Requests))
		for j := range c.Spec.Devices.Requests {
			r := c.Spec.Devices.Requests[j]
			exact := *r.Exactly
			exact.Selectors = nil
			r.Exactly = &exact
			cp.Spec.Devices.Requests[j] = r
			names[exact.DeviceClassName] = true
		}
		out[i] = &cp
	}
	return out, &withoutSelectors{inner: classes, names: names}
}

// withoutSelectors serves the named classes without their selectors, the others as they are.
type withoutSelectors struct {
	inner structured.DeviceClassLister
	names map[string]bool
}

func (w *withoutSelectors) List() ([]*resourceapi.DeviceClass, error) { return w.inner.List() }

func (w *withoutSelectors) Get(name string) (*resourceapi.DeviceClass, error) {
	c, err := w.inner.Get(name)
	if err != nil || !w.names[name] {
		return c, err
	}
	if c == nil {
		return nil, fmt.Errorf("device class %q not found", name)
	}
	cp := *c
	cp.Spec.Selectors = nil
	return &cp, nil
}
