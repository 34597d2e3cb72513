package snapshot

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// TestFitCheckCases: where the count check rejects without running the allocator, and where
// it leaves the answer to the allocator; in every case the answer is the allocator's alone
// (NoFitCheck).
func TestFitCheckCases(t *testing.T) {
	ctx := context.Background()
	// n: 2 whole GPUs, one of them allocated.
	in := func() Input {
		return Input{
			Nodes:   []*v1.Node{fixture.Node("n", nil)},
			Slices:  fixture.WholeGPUSlices("n", 2),
			Classes: classesWithAny(),
			Claims:  []*resourceapi.ResourceClaim{fixture.AllocatedClaim("busy", "busy", "n", "gpu-0")},
		}
	}
	two := func() []*resourceapi.ResourceClaim {
		return []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 2)}
	}
	oneEach := func() []*resourceapi.ResourceClaim {
		return []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "a", 1), fixture.GPUClaim("ns", "b", 1)}
	}
	cases := []struct {
		name    string
		input   func() Input
		claims  func() []*resourceapi.ResourceClaim
		extra   []string // devices held by the gang on the node
		reject  bool
		wantErr bool
	}{
		{name: "count above free devices", input: in, claims: two, reject: true},
		{name: "one free device", input: in, claims: func() []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 1)}
		}},
		{name: "the free device held by the gang", input: in, extra: []string{"gpu-1"}, claims: func() []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 1)}
		}, reject: true},
		{name: "two claims of the same shape compete for one device", input: in, claims: oneEach, reject: true},
		{name: "admin access takes devices in use", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			c[0].Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
			return c
		}},
		{name: "allocation mode All", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			c[0].Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
			c[0].Spec.Devices.Requests[0].Exactly.Count = 0
			return c
		}},
		{name: "firstAvailable: one alternative can fit", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			r := &c[0].Spec.Devices.Requests[0]
			sub := resourceapi.DeviceSubRequest{Name: "big", DeviceClassName: r.Exactly.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2}
			small := sub
			small.Name, small.Count = "small", 1
			r.Exactly, r.FirstAvailable = nil, []resourceapi.DeviceSubRequest{sub, small}
			return c
		}},
		{name: "firstAvailable: no alternative fits", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			r := &c[0].Spec.Devices.Requests[0]
			sub := resourceapi.DeviceSubRequest{Name: "big", DeviceClassName: r.Exactly.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2}
			bigger := sub
			bigger.Name, bigger.Count = "bigger", 3
			r.Exactly, r.FirstAvailable = nil, []resourceapi.DeviceSubRequest{bigger, sub}
			return c
		}, reject: true},
		{name: "network-attached devices may serve the request", input: func() Input {
			i := in()
			net := fixture.WholeGPUSlices("net", 2)[0]
			net.Spec.NodeName, net.Spec.AllNodes = nil, ptr.To(true)
			i.Slices = append(i.Slices, net)
			return i
		}, claims: two},
		{name: "multi-allocatable device", input: func() Input {
			i := in()
			i.Slices[0].Spec.Devices[1].AllowMultipleAllocations = ptr.To(true)
			return i
		}, claims: two},
		{name: "missing class: the allocator's error", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			c[0].Spec.Devices.Requests[0].Exactly.DeviceClassName = "missing"
			return c
		}, wantErr: true},
		{name: "selector error on another claim: the allocator's error", input: in, claims: func() []*resourceapi.ResourceClaim {
			c := two()
			bad := fixture.GPUClaim("ns", "bad", 1)
			bad.Spec.Devices.Requests[0].Exactly.DeviceClassName = "any"
			bad.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].profile == "1g.10gb"`, fixture.Driver)}}}
			return append([]*resourceapi.ResourceClaim{bad}, c...)
		}, wantErr: true},
		{name: "more devices than a claim may hold: the allocator's error", input: in, claims: func() []*resourceapi.ResourceClaim {
			return []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", resourceapi.AllocationResultsMaxSize+1)}
		}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var extra []resourceapi.AllocationResult
			for _, d := range tc.extra {
				extra = append(extra, resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
					Request: "gpu", Driver: fixture.Driver, Pool: "n", Device: d}}}})
			}
			on := New(tc.input(), Config{Features: allFeatures})
			off := New(tc.input(), Config{Features: allFeatures, NoFitCheck: true})
			got, ga, gerr := on.AllocateBounded(ctx, on.Node("n"), extra, tc.claims(), 0)
			want, _, werr := off.AllocateBounded(ctx, off.Node("n"), extra, tc.claims(), 0)
			if ga.Rejected != tc.reject {
				t.Errorf("rejected %v, want %v", ga.Rejected, tc.reject)
			}
			if ga.Rejected && ga.Steps != 0 {
				t.Errorf("rejected after %d allocator steps", ga.Steps)
			}
			if (gerr != nil) != tc.wantErr || fmt.Sprint(gerr) != fmt.Sprint(werr) {
				t.Errorf("error %v with the check, %v without; want an error: %v", gerr, werr, tc.wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("allocation %v with the check, %v without", got, want)
			}
		})
	}
}
