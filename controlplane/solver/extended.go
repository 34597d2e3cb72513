package solver

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// ExtendedClaimName is the in-memory name of a pod's extended-resource claim until the
// committer creates it (with generateName); like the kube-scheduler's, it is not a valid
// object name, so it cannot clash with a real claim.
const ExtendedClaimName = "<extended-resources>"

// ExtendedClaim is the ResourceClaim for a pod's extended resources that DeviceClasses back
// (KEP-5004 "DRA extended resources"): a pod asking nvidia.com/gpu: 1 on a node that does not
// advertise nvidia.com/gpu gets a claim for one device of the class that maps the name. The
// committer creates it (owned by the pod, annotated resource.kubernetes.io/extended-resource-claim)
// and writes the mapping into the pod's status.extendedResourceClaimStatus, as the
// kube-scheduler does.
type ExtendedClaim struct {
	Claim      *resourceapi.ResourceClaim
	Allocation *resourceapi.AllocationResult
	Mappings   []v1.ContainerExtendedResourceRequest
}

// extendedClaim builds the claim of pod p's extended resources for node, or nil when the node
// serves all of them through its allocatable (a device plugin) or the pod has none.
func (st *search) extendedClaim(p *podInfo, node *snapshot.NodeInfo) *ExtendedClaim {
	if len(p.extended) == 0 {
		return nil
	}
	var names []v1.ResourceName
	for name := range p.extended {
		if q, ok := node.Node.Status.Allocatable[name]; ok && !q.IsZero() {
			continue // the device plugin serves it; NodeResourcesFit checks the amount
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	pod := p.pod
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pod.Namespace,
			Name:         ExtendedClaimName,
			GenerateName: pod.Name + "-extended-resources-",
			UID:          types.UID("extended-" + string(pod.UID)),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true),
			}},
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
		},
	}
	var mappings []v1.ContainerExtendedResourceRequest
	containers := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, name := range names {
		class := st.snap.ExtendedClass(name)
		// Containers that run for the pod's lifetime (regular ones and sidecars) each get
		// their own request; init containers that run to completion one after another share
		// one request sized for the largest of them.
		var shortLived []int
		var shortMax int64
		for i := range containers {
			c := &containers[i]
			q, ok := c.Resources.Requests[name]
			if !ok || q.IsZero() {
				continue
			}
			n := q.Value()
			isInit := i < len(pod.Spec.InitContainers)
			sidecar := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
			if isInit && !sidecar {
				shortLived = append(shortLived, i)
				shortMax = max(shortMax, n)
				continue
			}
			req := requestName(i, c, name)
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, exactRequest(req, class.Name, n))
			mappings = append(mappings, v1.ContainerExtendedResourceRequest{ContainerName: c.Name, ResourceName: string(name), RequestName: req})
		}
		if len(shortLived) > 0 {
			first := shortLived[0]
			req := requestName(first, &containers[first], name)
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, exactRequest(req, class.Name, shortMax))
			for _, i := range shortLived {
				mappings = append(mappings, v1.ContainerExtendedResourceRequest{ContainerName: containers[i].Name, ResourceName: string(name), RequestName: req})
			}
		}
	}
	sort.Slice(claim.Spec.Devices.Requests, func(i, j int) bool {
		return claim.Spec.Devices.Requests[i].Name < claim.Spec.Devices.Requests[j].Name
	})
	return &ExtendedClaim{Claim: claim, Mappings: mappings}
}

// requestName follows the kube-scheduler's naming, container-<index>-request-<index of the
// resource among the container's sorted request names>, which the kubelet resolves through
// the pod's status.
func requestName(containerIndex int, c *v1.Container, name v1.ResourceName) string {
	var keys []string
	for k := range c.Resources.Requests {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	idx := sort.SearchStrings(keys, string(name))
	return fmt.Sprintf("container-%d-request-%d", containerIndex, idx)
}

func exactRequest(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
}
