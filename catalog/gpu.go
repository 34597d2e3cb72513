package catalog

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/contract"
)

// GPUResourceNames are the extended resources counted as whole GPUs.
var GPUResourceNames = []string{"nvidia.com/gpu", "tessera.dev/gpu"}

// WholeGPUDeviceClasses are the DeviceClasses whose devices are whole GPUs.
var WholeGPUDeviceClasses = map[string]bool{contract.ClassGPU: true, "gpu.nvidia.com": true}

// ClaimLookup resolves the ResourceClaims and ResourceClaimTemplates that pods
// name, so that DRA GPU requests are counted. Either method may report false.
type ClaimLookup interface {
	ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool)
	ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool)
}

// GPUMemoryLookup is an optional part of a ClaimLookup: the memory of one GPU,
// so that requests for a share of a GPU's memory (a shared-GPU claim's memory
// capacity, KAI's gpu-memory annotation) can be counted in GPU units. A cluster
// lookup reports its smallest GPU, so that an estimate never falls short.
type GPUMemoryLookup interface {
	GPUMemory() (*resource.Quantity, bool)
}

// podDemand is what one pod of a template asks for.
type podDemand struct {
	// gpus are the whole GPUs the pod holds alone; units add its fractions.
	gpus, units float64
	// shared are the ResourceClaims the pod names (resourceClaimName): one
	// allocation that every pod naming the claim shares.
	shared     []sharedClaim
	unresolved []string
}

type sharedClaim struct {
	name        string
	gpus, units float64
}

// demandOfTemplate counts what one pod of the template asks for: extended
// resources (the effective request of containers and init containers, as the
// scheduler computes it), KAI's fraction annotations, and the devices of its
// resource claims (whole GPUs and shares of shared GPUs, in GPU units as
// package contract counts them).
func demandOfTemplate(tmpl map[string]any, namespace string, claims ClaimLookup) podDemand {
	var d podDemand
	spec, _ := tmpl["spec"].(map[string]any)
	if spec == nil {
		return d
	}
	var sum float64
	for _, c := range asList(spec["containers"]) {
		sum += gpusOfContainer(c)
	}
	var initMax float64
	for _, c := range asList(spec["initContainers"]) {
		g := gpusOfContainer(c)
		if cm, ok := c.(map[string]any); ok && cm["restartPolicy"] == "Always" {
			// A sidecar runs next to the app containers.
			sum += g
			continue
		}
		if g > initMax {
			initMax = g
		}
	}
	if initMax > sum {
		sum = initMax
	}
	d.gpus, d.units = sum, sum
	md, _ := tmpl["metadata"].(map[string]any)
	ann := map[string]string{}
	if a, ok := md["annotations"].(map[string]any); ok {
		for k, v := range a {
			if s, ok := v.(string); ok {
				ann[k] = s
			}
		}
	}
	if u, ok := contract.FractionUnits(ann); ok {
		d.units += u
	} else if mib, ok := ann[contract.AnnotationGPUMemory]; ok {
		mem, err := resource.ParseQuantity(mib + "Mi")
		gpuMem := gpuMemory(claims)
		switch {
		case err != nil:
		case gpuMem == nil:
			d.unresolved = append(d.unresolved, "annotation "+contract.AnnotationGPUMemory+" (GPU memory unknown)")
		default:
			d.units += contract.ShareUnits(1, gpuMem, &mem)
		}
	}
	for _, rc := range asList(spec["resourceClaims"]) {
		m, ok := rc.(map[string]any)
		if !ok {
			continue
		}
		name, _ := m["name"].(string)
		gpus, units, shared, ok := demandOfPodClaim(m, namespace, claims)
		if !ok {
			d.unresolved = append(d.unresolved, name)
			continue
		}
		if shared != "" {
			d.shared = append(d.shared, sharedClaim{name: shared, gpus: gpus, units: units})
			continue
		}
		d.gpus += gpus
		d.units += units
	}
	return d
}

func gpuMemory(claims ClaimLookup) *resource.Quantity {
	if l, ok := claims.(GPUMemoryLookup); ok {
		if q, ok := l.GPUMemory(); ok && q != nil && !q.IsZero() {
			return q
		}
	}
	return nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func gpusOfContainer(c any) float64 {
	cm, ok := c.(map[string]any)
	if !ok {
		return 0
	}
	res, _ := cm["resources"].(map[string]any)
	if res == nil {
		return 0
	}
	limits, _ := res["limits"].(map[string]any)
	requests, _ := res["requests"].(map[string]any)
	var n float64
	for _, name := range GPUResourceNames {
		// Extended resources must have equal requests and limits; either may be given.
		v, ok := limits[name]
		if !ok {
			v, ok = requests[name]
		}
		if ok {
			n += quantity(v)
		}
	}
	return n
}

func quantity(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	case string:
		q, err := resource.ParseQuantity(x)
		if err != nil {
			return 0
		}
		return q.AsApproximateFloat64()
	}
	return 0
}

// demandOfPodClaim counts one entry of a pod's resourceClaims; shared names the
// ResourceClaim when the entry names one (every pod naming it shares it).
func demandOfPodClaim(m map[string]any, namespace string, claims ClaimLookup) (gpus, units float64, shared string, ok bool) {
	if claims == nil {
		return 0, 0, "", false
	}
	if t, _ := m["resourceClaimTemplateName"].(string); t != "" {
		tmpl, ok := claims.ResourceClaimTemplate(namespace, t)
		if !ok {
			return 0, 0, "", false
		}
		g, u, ok := demandOfClaimSpec(&tmpl.Spec.Spec, claims)
		return g, u, "", ok
	}
	if n, _ := m["resourceClaimName"].(string); n != "" {
		claim, ok := claims.ResourceClaim(namespace, n)
		if !ok {
			return 0, 0, "", false
		}
		g, u, ok := demandOfClaimSpec(&claim.Spec, claims)
		return g, u, n, ok
	}
	return 0, 0, "", false
}

// demandOfClaimSpec counts the whole GPUs a claim asks for, and its GPU units:
// whole GPUs plus shares of shared GPUs (memory over the GPU's memory, as
// contract.ShareUnits). For a prioritized list the first choice counts; "All"
// allocation cannot be counted without the cluster's devices and counts 0. ok is
// false when a share's memory cannot be put in units (no GPU memory known).
func demandOfClaimSpec(spec *resourcev1.ResourceClaimSpec, claims ClaimLookup) (gpus, units float64, ok bool) {
	ok = true
	add := func(class string, mode resourcev1.DeviceAllocationMode, count int64, capReq *resourcev1.CapacityRequirements) {
		if mode == resourcev1.DeviceAllocationModeAll {
			return
		}
		if count <= 0 {
			count = 1
		}
		switch {
		case WholeGPUDeviceClasses[class]:
			gpus += float64(count)
			units += float64(count)
		case class == contract.ClassShared:
			if capReq == nil {
				return
			}
			mem, has := capReq.Requests[resourcev1.QualifiedName(contract.CapMemory)]
			if !has {
				return
			}
			gpuMem := gpuMemory(claims)
			if gpuMem == nil {
				ok = false
				return
			}
			units += float64(count) * contract.ShareUnits(1, gpuMem, &mem)
		}
	}
	for _, r := range spec.Devices.Requests {
		switch {
		case r.Exactly != nil:
			add(r.Exactly.DeviceClassName, r.Exactly.AllocationMode, r.Exactly.Count, r.Exactly.Capacity)
		case len(r.FirstAvailable) > 0:
			s := r.FirstAvailable[0]
			add(s.DeviceClassName, s.AllocationMode, s.Count, s.Capacity)
		}
	}
	return gpus, units, ok
}

// intValue reads a replica count: a number or a numeric string (Knative keeps
// its scale bounds in annotations).
func intValue(v any) (int64, error) {
	switch x := v.(type) {
	case int:
		if x < 0 {
			return 0, fmt.Errorf("negative count %d", x)
		}
		return int64(x), nil
	case float64:
		if x != float64(int64(x)) || x < 0 || x > 1<<40 {
			return 0, fmt.Errorf("%v is not a count", x)
		}
		return int64(x), nil
	case string:
		var n int64
		if _, err := fmt.Sscanf(x, "%d", &n); err != nil || fmt.Sprint(n) != x || n < 0 {
			return 0, fmt.Errorf("%q is not a count", x)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("expected a number, got %s", jqType(v))
	}
}

func jqType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	default:
		return "number"
	}
}
