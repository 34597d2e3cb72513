package contract

import resourceapi "k8s.io/api/resource/v1"

// AttrParentMemorySlices is the number of MIG memory slices of a MIG device's
// GPU (8 on A100, H100, H200, B200). With AttrPlacementSize it prices a MIG
// device in GPU units where no counters do (static MIG, whose GPU publishes
// no whole-GPU device and no counter set): a 3g.40gb on 4 of 8 slices is 0.5.
const AttrParentMemorySlices resourceapi.QualifiedName = "parentMemorySlices"

// IntAttr returns a device's int attribute and whether it has one.
func IntAttr(d *resourceapi.Device, name resourceapi.QualifiedName) (int64, bool) {
	if a, ok := d.Attributes[name]; ok && a.IntValue != nil {
		return *a.IntValue, true
	}
	return 0, false
}

// sliceUnits is a MIG device's share of its GPU's memory slices, from its
// placement size and its parent's slice count; ok is false without them.
func sliceUnits(d *resourceapi.Device) (float64, bool) {
	size, ok1 := IntAttr(d, AttrPlacementSize)
	total, ok2 := IntAttr(d, AttrParentMemorySlices)
	if !ok1 || !ok2 || size <= 0 || total <= 0 || size > total {
		return 0, false
	}
	return float64(size) / float64(total), true
}
