package catalog

import (
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	resourcelisters "k8s.io/client-go/listers/resource/v1"

	"github.com/tessera-gpu/tessera/contract"
)

// ListerClaims resolves claims and claim templates through informer listers
// (either may be nil), for callers that watch them already, like the scheduler.
type ListerClaims struct {
	Templates resourcelisters.ResourceClaimTemplateLister
	Claims    resourcelisters.ResourceClaimLister
}

// ResourceClaimTemplate implements ClaimLookup.
func (l ListerClaims) ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool) {
	if l.Templates == nil {
		return nil, false
	}
	t, err := l.Templates.ResourceClaimTemplates(namespace).Get(name)
	return t, err == nil
}

// ResourceClaim implements ClaimLookup.
func (l ListerClaims) ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool) {
	if l.Claims == nil {
		return nil, false
	}
	c, err := l.Claims.ResourceClaims(namespace).Get(name)
	return c, err == nil
}

// ListerSlices adds GPUMemoryLookup to ListerClaims: the memory of the
// smallest GPU tessera's DRA driver publishes (whole or shared GPUs), so that
// shares of a GPU's memory count in GPU units without falling short.
type ListerSlices struct {
	ListerClaims
	Slices resourcelisters.ResourceSliceLister
}

// GPUMemory implements GPUMemoryLookup.
func (l ListerSlices) GPUMemory() (*resource.Quantity, bool) {
	if l.Slices == nil {
		return nil, false
	}
	slices, err := l.Slices.List(labels.Everything())
	if err != nil {
		return nil, false
	}
	return SmallestGPUMemory(slices)
}

// SmallestGPUMemory is the memory of the smallest whole or shared GPU among
// the slices of tessera's driver; false when there is none.
func SmallestGPUMemory(slices []*resourcev1.ResourceSlice) (*resource.Quantity, bool) {
	var best *resource.Quantity
	for _, s := range slices {
		if s.Spec.Driver != contract.DriverName {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if t := contract.TypeOf(d); t != contract.TypeGPU && t != contract.TypeShared {
				continue
			}
			if m := contract.Capacity(d, contract.CapMemory); m != nil && !m.IsZero() && (best == nil || m.Cmp(*best) < 0) {
				best = m
			}
		}
	}
	return best, best != nil
}
