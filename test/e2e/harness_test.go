package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/test/framework"
)

// TestHarnessIsReal proves that the framework runs the real API server and
// controllers: the resourceclaim controller turns a pod's claim template into a
// ResourceClaim, and the API server's own validation rejects an oversized slice.
func TestHarnessIsReal(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	version, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if version.GitVersion != "v1.37.2" {
		t.Errorf("API server reports %q, want v1.37.2 (version ldflags in hack/build-k8s.sh)", version.GitVersion)
	}

	ns := cp.CreateNamespace(t)
	className := framework.UniqueName("harness-gpu")
	driver := className + ".example.com"
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: className},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)},
		}}},
	}
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass: %v", err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().DeviceClasses().Delete(context.Background(), className, metav1.DeleteOptions{})
	})

	slice := testSlice(className+"-ok", driver, 4)
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceSlice: %v", err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceSlices().Delete(context.Background(), slice.Name, metav1.DeleteOptions{})
	})

	// The API server enforces at most 128 devices per slice.
	_, err = client.ResourceV1().ResourceSlices().Create(ctx, testSlice(className+"-big", driver, 129), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("creating a slice with 129 devices: got %v, want an Invalid error from the API server", err)
	}
	if !strings.Contains(err.Error(), "spec.devices") || !strings.Contains(err.Error(), "128") {
		t.Errorf("validation error does not name spec.devices and the limit: %v", err)
	}

	template := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name:    "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: className},
			}}},
		}},
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, template, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaimTemplate: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "uses-gpu", Namespace: ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
		},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Pod: %v", err)
	}

	// The real resourceclaim controller creates the claim and records its name
	// in the pod status.
	var claimName string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == "gpu" && s.ResourceClaimName != nil {
				claimName = *s.ResourceClaimName
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("resourceclaim controller did not create the claim: %v\ncontroller-manager log:\n%s", err, cp.LogTail("kube-controller-manager", 20))
	}
	claim, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get generated claim: %v", err)
	}
	if got := claim.Spec.Devices.Requests[0].Exactly.DeviceClassName; got != className {
		t.Errorf("generated claim asks for class %q, want %q", got, className)
	}
	if len(claim.OwnerReferences) != 1 || claim.OwnerReferences[0].Name != pod.Name {
		t.Errorf("generated claim is not owned by the pod: %+v", claim.OwnerReferences)
	}
	if claim.Annotations["resource.kubernetes.io/pod-claim-name"] != "gpu" {
		t.Errorf("generated claim lacks the pod-claim-name annotation: %v", claim.Annotations)
	}
}

func testSlice(name, driver string, devices int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1},
			NodeName: ptr.To("node-" + name),
		},
	}
	for i := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))},
			},
		})
	}
	return s
}
