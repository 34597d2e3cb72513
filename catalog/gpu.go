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

// gpusOfTemplate counts the whole GPUs one pod of the template asks for: extended
// resources (the effective request of containers and init containers, as the
// scheduler computes it) plus the whole-GPU devices of its resource claims.
func gpusOfTemplate(tmpl map[string]any, namespace string, claims ClaimLookup) (float64, []string) {
	spec, _ := tmpl["spec"].(map[string]any)
	if spec == nil {
		return 0, nil
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
	var unresolved []string
	for _, rc := range asList(spec["resourceClaims"]) {
		m, ok := rc.(map[string]any)
		if !ok {
			continue
		}
		name, _ := m["name"].(string)
		n, ok := gpusOfPodClaim(m, namespace, claims)
		if !ok {
			unresolved = append(unresolved, name)
			continue
		}
		sum += n
	}
	return sum, unresolved
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

func gpusOfPodClaim(m map[string]any, namespace string, claims ClaimLookup) (float64, bool) {
	if claims == nil {
		return 0, false
	}
	if t, _ := m["resourceClaimTemplateName"].(string); t != "" {
		tmpl, ok := claims.ResourceClaimTemplate(namespace, t)
		if !ok {
			return 0, false
		}
		return gpusOfClaimSpec(&tmpl.Spec.Spec), true
	}
	if n, _ := m["resourceClaimName"].(string); n != "" {
		claim, ok := claims.ResourceClaim(namespace, n)
		if !ok {
			return 0, false
		}
		return gpusOfClaimSpec(&claim.Spec), true
	}
	return 0, false
}

// gpusOfClaimSpec counts whole-GPU devices a claim asks for. For a prioritized
// list the first choice counts; "All" allocation cannot be counted without the
// cluster's devices and counts 0.
func gpusOfClaimSpec(spec *resourcev1.ResourceClaimSpec) float64 {
	var n float64
	for _, r := range spec.Devices.Requests {
		switch {
		case r.Exactly != nil:
			n += countDevices(r.Exactly.DeviceClassName, r.Exactly.AllocationMode, r.Exactly.Count)
		case len(r.FirstAvailable) > 0:
			s := r.FirstAvailable[0]
			n += countDevices(s.DeviceClassName, s.AllocationMode, s.Count)
		}
	}
	return n
}

func countDevices(class string, mode resourcev1.DeviceAllocationMode, count int64) float64 {
	if !WholeGPUDeviceClasses[class] || mode == resourcev1.DeviceAllocationModeAll {
		return 0
	}
	if count <= 0 {
		count = 1
	}
	return float64(count)
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
