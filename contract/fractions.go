package contract

import "strconv"

// KAI Scheduler's GPU-sharing annotations on pods ("GPU sharing" in the KAI
// documentation): gpu-fraction asks for that share (0 < f ≤ 1) of the memory of
// gpu-fraction-num-devices GPUs (default 1); gpu-memory asks for that many MiB of
// one GPU. The catalog reads them to estimate a workload's demand in GPU units.
const (
	AnnotationGPUFraction           = "gpu-fraction"
	AnnotationGPUFractionNumDevices = "gpu-fraction-num-devices"
	AnnotationGPUMemory             = "gpu-memory"
)

// FractionUnits is what a pod with the gpu-fraction annotations costs: the fraction
// of a GPU's memory is the fraction of the GPU in units (as ShareUnits counts a
// share of a shared GPU), once per device. It returns false when the annotations
// are absent or not a fraction in (0, 1] and a positive device count.
func FractionUnits(annotations map[string]string) (float64, bool) {
	v, ok := annotations[AnnotationGPUFraction]
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1 {
		return 0, false
	}
	devices := int64(1)
	if n, ok := annotations[AnnotationGPUFractionNumDevices]; ok {
		d, err := strconv.ParseInt(n, 10, 64)
		if err != nil || d <= 0 {
			return 0, false
		}
		devices = d
	}
	return f * float64(devices), true
}
