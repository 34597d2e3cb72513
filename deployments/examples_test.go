package deployments_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/catalog"
	gpuv1alpha1 "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
)

// TestExampleOpaqueConfigs: every opaque config in the examples is one the
// kubelet plugin accepts (its own strict decoder, defaulting and validation).
func TestExampleOpaqueConfigs(t *testing.T) {
	kinds := map[string]int{}
	for file, objs := range exampleObjects(t) {
		for _, obj := range objs {
			var spec *resourceapi.ResourceClaimSpec
			switch obj.GetKind() {
			case "ResourceClaim":
				c := &resourceapi.ResourceClaim{}
				fromUnstructured(t, obj, c)
				spec = &c.Spec
			case "ResourceClaimTemplate":
				c := &resourceapi.ResourceClaimTemplate{}
				fromUnstructured(t, obj, c)
				spec = &c.Spec.Spec
			default:
				continue
			}
			for i, cfg := range spec.Devices.Config {
				if cfg.Opaque == nil || cfg.Opaque.Driver != gpuv1alpha1.GroupName {
					continue
				}
				decoded, err := gpuv1alpha1.Decode(cfg.Opaque.Parameters.Raw)
				if err != nil {
					t.Errorf("%s: %s config %d: the kubelet plugin would refuse it: %v", file, obj.GetName(), i, err)
					continue
				}
				kinds[decoded.ConfigKind()]++
			}
		}
	}
	if kinds[gpuv1alpha1.GpuConfigKind] < 2 || kinds[gpuv1alpha1.MigDeviceConfigKind] < 1 {
		t.Errorf("opaque configs found: %v; want the MPS and time-slicing GpuConfigs and a MigDeviceConfig", kinds)
	}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestExampleGangs: the catalog (the scheduler's own mapper, with its
// built-in definitions) reads the gang examples as the user guide says.
func TestExampleGangs(t *testing.T) {
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := exampleObjects(t)
	var templates []*unstructured.Unstructured
	for _, f := range []string{"01-whole-gpu.yaml", "02-mig-1g.yaml"} {
		for _, o := range objs[f] {
			if o.GetKind() == "ResourceClaimTemplate" {
				templates = append(templates, o)
			}
		}
	}
	claims, err := catalog.NewStaticClaims(templates)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file, kind, queue string
		gangPods          int64
		gpus              float64
	}{
		{"06-pytorchjob-gang.yaml", "PyTorchJob", "team-a-training", 4, 4},
		{"07-jobset.yaml", "JobSet", "team-b", 5, -1},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			var obj *unstructured.Unstructured
			for _, o := range objs[tc.file] {
				if o.GetKind() == tc.kind {
					obj = o
				}
			}
			if obj == nil {
				t.Fatalf("%s has no %s", tc.file, tc.kind)
			}
			if q := obj.GetLabels()["tessera.dev/queue"]; q != tc.queue {
				t.Errorf("queue label = %q, want %q", q, tc.queue)
			}
			w, err := cat.MapWithClaims(context.Background(), obj, claims)
			if err != nil {
				t.Fatalf("catalog cannot map %s: %v", filepath.Base(tc.file), err)
			}
			js, _ := json.Marshal(w.Gangs)
			if len(w.Gangs) != 1 || w.Gangs[0].Count != 1 || w.Gangs[0].MinMember != tc.gangPods {
				t.Errorf("gangs = %s, want one gang of %d pods", js, tc.gangPods)
			}
			if tc.gpus >= 0 && w.GPUs != tc.gpus {
				t.Errorf("GPUs = %v, want %v whole GPUs", w.GPUs, tc.gpus)
			}
		})
	}
}
