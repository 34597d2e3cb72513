package snapshot

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// The policy charges every bound pod to its queue in every cycle: its requests and its
// claims' GPU units. Under churn a cycle runs up to 20 times a second over hundreds of bound
// pods, and deriving those again each time was most of a steady cycle's cost
// (docs/benchmarks.md, churn). For the objects a Cache snapshot was derived from, the
// incremental state keeps them: a pod's requests from when the pod was first seen, a claim's
// units from when they were first asked for while the devices they are priced by (the
// nodes' slices, which node publishes which pool) have not changed since.

// Requests returns PodRequests(pod). For a bound pod of the input a Cache snapshot was
// derived from (the same object), it is the sum the incremental state keeps for the pod,
// not computed again. The list must not be changed.
func (s *Snapshot) Requests(pod *v1.Pod) v1.ResourceList {
	if pe := s.boundPodEntry(pod); pe != nil {
		return pe.requests
	}
	return PodRequests(pod)
}

// RequestedCPUMemory returns Requests(pod)'s CPU (cores) and memory (bytes) as floats
// (Quantity.AsApproximateFloat64; 0 where absent), kept like Requests.
func (s *Snapshot) RequestedCPUMemory(pod *v1.Pod) (cpu, memory float64) {
	if pe := s.boundPodEntry(pod); pe != nil {
		return pe.cpu, pe.memory
	}
	return cpuMemory(PodRequests(pod))
}

func cpuMemory(req v1.ResourceList) (cpu, memory float64) {
	if q, ok := req[v1.ResourceCPU]; ok {
		cpu = q.AsApproximateFloat64()
	}
	if q, ok := req[v1.ResourceMemory]; ok {
		memory = q.AsApproximateFloat64()
	}
	return cpu, memory
}

// boundPodEntry is the incremental state's entry of pod when s is the Cache's latest
// snapshot's state and pod the object it knows, bound; else nil.
func (s *Snapshot) boundPodEntry(pod *v1.Pod) *podEntry {
	if s.inc == nil || s.inc.cfg.Cache == nil {
		return nil
	}
	c := s.inc.cfg.Cache
	c.incMu.Lock()
	defer c.incMu.Unlock()
	if c.inc != s.inc {
		return nil
	}
	if pe := s.inc.pods[keyOf(&pod.ObjectMeta)]; pe != nil && pe.pod == pod && pe.node != "" {
		return pe
	}
	return nil
}

// ClaimUnits returns AllocationUnits(claim.Status.Allocation). For a claim of the input a
// Cache snapshot was derived from (the same object), the incremental state keeps the sum
// while the devices that price it are the snapshot's (devicesEpoch): a snapshot derived
// after a slice, node or pool owner changed computes it again, and an older snapshot
// computes its own without keeping it.
func (s *Snapshot) ClaimUnits(claim *resourceapi.ResourceClaim) float64 {
	if claim.Status.Allocation == nil {
		return 0
	}
	if s.inc == nil || s.inc.cfg.Cache == nil || s.devicesEpoch == 0 {
		return s.AllocationUnits(claim.Status.Allocation)
	}
	c := s.inc.cfg.Cache
	c.incMu.Lock()
	defer c.incMu.Unlock()
	ce := s.inc.claims[keyOf(&claim.ObjectMeta)]
	if c.inc != s.inc || s.devicesEpoch != s.inc.devicesEpoch || ce == nil || ce.claim != claim {
		return s.AllocationUnits(claim.Status.Allocation)
	}
	if ce.unitsEpoch != s.devicesEpoch {
		// AllocationUnits reads only this snapshot's nodes and costs, never the lock's state.
		ce.units, ce.unitsEpoch = s.AllocationUnits(claim.Status.Allocation), s.devicesEpoch
	}
	return ce.units
}
