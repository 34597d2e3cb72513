package agent

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/nodeagent/slices"

	"github.com/tessera-gpu/tessera/contract"
)

// DetectFeatures asks the API server, with dry-run creates that store
// nothing, which DRA fields it keeps: a server whose feature is off drops the
// field silently, so comparing what comes back tells what the cluster serves.
// It needs only the create permission on ResourceSlices that the agent has.
func DetectFeatures(ctx context.Context, client kubernetes.Interface, nodeName string) (slices.Features, error) {
	var f slices.Features
	rs := client.ResourceV1().ResourceSlices()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	one := resourceapi.Counter{Value: resource.MustParse("1")}

	counters := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:         contract.DriverName,
			NodeName:       ptr.To(nodeName),
			Pool:           resourceapi.ResourcePool{Name: "tessera-feature-probe-" + nodeName, ResourceSliceCount: 2},
			SharedCounters: []resourceapi.CounterSet{{Name: "probe", Counters: map[string]resourceapi.Counter{"c": one}}},
		},
	}
	got, err := rs.Create(ctx, counters, dry)
	if apierrors.IsNotFound(err) {
		return f, fmt.Errorf("the API server does not serve resource.k8s.io/v1 ResourceSlices (DRA needs Kubernetes 1.34 or later): %w", err)
	}
	if err != nil && !isDroppedAll(err) {
		return f, fmt.Errorf("probe DRA features with a dry-run ResourceSlice: %w", err)
	}
	f.PartitionableDevices = err == nil && len(got.Spec.SharedCounters) == 1

	devices := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   contract.DriverName,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: "tessera-feature-probe-" + nodeName, ResourceSliceCount: 2},
			Devices: []resourceapi.Device{{
				Name:                     "probe",
				AllowMultipleAllocations: ptr.To(true),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: resource.MustParse("1Gi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("1Gi"))}},
				},
				Taints: []resourceapi.DeviceTaint{{Key: contract.TaintKeyXID, Value: "0", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
			}},
		},
	}
	if f.PartitionableDevices {
		devices.Spec.Devices[0].ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "probe", Counters: map[string]resourceapi.Counter{"c": one}}}
	}
	got, err = rs.Create(ctx, devices, dry)
	if err != nil {
		return f, fmt.Errorf("probe DRA features with a dry-run ResourceSlice: %w", err)
	}
	if len(got.Spec.Devices) == 1 {
		d := got.Spec.Devices[0]
		f.ConsumableCapacity = d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		f.DeviceTaints = len(d.Taints) == 1
		if f.PartitionableDevices && len(d.ConsumesCounters) == 0 {
			f.PartitionableDevices = false
		}
	}
	return f, nil
}

// isDroppedAll recognises the error of a server that dropped sharedCounters
// and then found the slice empty of both devices and counters. Such a server
// is valid to talk to; it just lacks partitionable devices.
func isDroppedAll(err error) bool {
	return apierrors.IsInvalid(err)
}
