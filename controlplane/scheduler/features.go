package scheduler

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// DetectFeatures finds out which DRA features the API server serves, by dry-run creating a
// ResourceSlice and a ResourceClaim that use them: the API server drops fields of disabled
// features (or rejects them), and the dry run persists nothing. Every feature that is served is
// turned on in the allocator; each one that is not is logged, never silently assumed.
func DetectFeatures(ctx context.Context, client kubernetes.Interface, namespace string) (structured.Features, error) {
	logger := klog.FromContext(ctx)
	f := structured.Features{AdminAccess: true}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	counters := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "probe.tessera.dev", AllNodes: ptr.To(true),
			Pool: resourceapi.ResourcePool{Name: "probe", ResourceSliceCount: 2},
			SharedCounters: []resourceapi.CounterSet{{Name: "set", Counters: map[string]resourceapi.Counter{
				"memory": {Value: resource.MustParse("1")},
			}}},
		},
	}
	got, err := client.ResourceV1().ResourceSlices().Create(ctx, counters, dry)
	f.PartitionableDevices = err == nil && len(got.Spec.SharedCounters) == 1

	devices := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "probe.tessera.dev", AllNodes: ptr.To(true),
			Pool: resourceapi.ResourcePool{Name: "probe", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{
				Name:                     "d",
				AllowMultipleAllocations: ptr.To(true),
				Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("1Gi")}},
				Taints:                   []resourceapi.DeviceTaint{{Key: "probe", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
				BindingConditions:        []string{"probe"},
				BindingFailureConditions: []string{"probe-failed"},
			}},
		},
	}
	got, err = client.ResourceV1().ResourceSlices().Create(ctx, devices, dry)
	if err != nil {
		// One of the fields is refused outright (older servers validate instead of
		// dropping); probe them one by one.
		logger.V(2).Info("Combined device probe refused, probing features one by one", "err", err)
		f.ConsumableCapacity = probeDevice(ctx, client, func(d *resourceapi.Device) {
			d.AllowMultipleAllocations = ptr.To(true)
		}, func(d *resourceapi.Device) bool { return d.AllowMultipleAllocations != nil })
		f.DeviceTaints = probeDevice(ctx, client, func(d *resourceapi.Device) {
			d.Taints = []resourceapi.DeviceTaint{{Key: "probe", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}, func(d *resourceapi.Device) bool { return len(d.Taints) > 0 })
	} else {
		d := got.Spec.Devices[0]
		f.ConsumableCapacity = d.AllowMultipleAllocations != nil
		f.DeviceTaints = len(d.Taints) > 0
		if len(d.BindingConditions) > 0 {
			// The committer binds at once and does not wait for a device's binding
			// conditions, so devices that have them are left alone (the allocator skips them
			// with this feature off) instead of being handed out before they are ready.
			logger.Info("Devices with binding conditions are not allocated: tessera-scheduler does not wait for them")
		}
	}

	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-", Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "r",
			FirstAvailable: []resourceapi.DeviceSubRequest{{
				Name: "s", DeviceClassName: "probe", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}},
		}}}},
	}
	gotClaim, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, dry)
	f.PrioritizedList = err == nil && len(gotClaim.Spec.Devices.Requests) == 1 && len(gotClaim.Spec.Devices.Requests[0].FirstAvailable) == 1

	for name, on := range map[string]bool{
		"partitionable devices (DRAPartitionableDevices)": f.PartitionableDevices,
		"consumable capacity (DRAConsumableCapacity)":     f.ConsumableCapacity,
		"device taints (DRADeviceTaints)":                 f.DeviceTaints,
		"prioritized lists (DRAPrioritizedList)":          f.PrioritizedList,
	} {
		if !on {
			logger.Info("DRA feature not served by the API server; the allocator runs without it: claims that need it do not fit", "feature", name)
		}
	}
	logger.Info("DRA features detected", "features", fmt.Sprintf("%+v", f))
	return f, nil
}

func probeDevice(ctx context.Context, client kubernetes.Interface, set func(*resourceapi.Device), kept func(*resourceapi.Device) bool) bool {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-feature-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "probe.tessera.dev", AllNodes: ptr.To(true),
			Pool:    resourceapi.ResourcePool{Name: "probe", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "d"}},
		},
	}
	set(&s.Spec.Devices[0])
	got, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err == nil && kept(&got.Spec.Devices[0])
}
