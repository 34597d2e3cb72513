package snapshot

import (
	v1 "k8s.io/api/core/v1"
)

// Requests returns PodRequests(pod). For a bound pod of the input a Cache snapshot was
// derived from (the same object), it is the sum the incremental state keeps for the pod
// (computed when the pod was first seen), not computed again: the policy charges every
// bound pod's requests to its queue each cycle. The list must not be changed.
func (s *Snapshot) Requests(pod *v1.Pod) v1.ResourceList {
	if s.inc != nil && s.inc.cfg.Cache != nil {
		c := s.inc.cfg.Cache
		c.incMu.Lock()
		var req v1.ResourceList
		if c.inc == s.inc {
			if pe := s.inc.pods[keyOf(&pod.ObjectMeta)]; pe != nil && pe.pod == pod && pe.node != "" {
				req = pe.requests
			}
		}
		c.incMu.Unlock()
		if req != nil {
			return req
		}
	}
	return PodRequests(pod)
}
