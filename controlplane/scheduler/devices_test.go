package scheduler_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// A DeviceTaintRule (resource.k8s.io/v1) tainting one of a node's two GPUs NoSchedule: a
// gang of two one-GPU pods no longer fits; once the rule is gone it binds.
func TestDeviceTaintRuleIsHonoured(t *testing.T) {
	e := newEnv(t)
	n := e.addNode("a", 2, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: e.id + "-broken"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(fixture.Driver), Pool: ptr.To(n), Device: ptr.To("gpu-0")},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	if _, err := e.kube.ResourceV1().DeviceTaintRules().Create(e.ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceTaintRule: %v", err)
	}
	t.Cleanup(func() {
		_ = e.kube.ResourceV1().DeviceTaintRules().Delete(context.Background(), rule.Name, metav1.DeleteOptions{})
	})
	pods := e.gang("g", q, 2, gpuClaim)
	e.startScheduler(defaultOptions())
	e.waitCondition("g", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return c.Reason == v1alpha1.ReasonUnschedulable
	})
	if n := e.boundCount(pods); n != 0 {
		t.Fatalf("%d pods bound although one of the two GPUs is tainted", n)
	}
	if err := e.kube.ResourceV1().DeviceTaintRules().Delete(e.ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitBound(pods, 30*time.Second)
}

// A pod asking example.com/gpu: 2, an extended resource a DeviceClass maps (KEP-5004), on a
// node that does not advertise it: tessera creates the pod's claim (owned by the pod), allocates
// two GPUs, writes pod.status.extendedResourceClaimStatus and binds the pod.
func TestDRAExtendedResourceGetsAClaim(t *testing.T) {
	e := newEnv(t)
	n := e.addNode("a", 2, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	class := fixture.DeviceClasses()[0]
	class.Name = e.id + "-ext"
	class.Spec.ExtendedResourceName = ptr.To("example.com/gpu-" + e.id)
	if _, err := e.kube.ResourceV1().DeviceClasses().Create(e.ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.kube.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	name := v1.ResourceName(*class.Spec.ExtendedResourceName)
	p := fixture.Pod(e.ns, "ext")
	p.UID = ""
	p.Labels = map[string]string{v1alpha1.QueueLabel: q}
	p.Spec.Containers[0].Resources.Requests[name] = resource.MustParse("2")
	p.Spec.Containers[0].Resources.Limits = v1.ResourceList{name: resource.MustParse("2")}
	created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.startScheduler(defaultOptions())
	e.waitBound([]*v1.Pod{created}, 30*time.Second)
	var pod *v1.Pod
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		pod, err = e.kube.CoreV1().Pods(e.ns).Get(ctx, "ext", metav1.GetOptions{})
		return err == nil && pod.Status.ExtendedResourceClaimStatus != nil, nil
	}); err != nil {
		t.Fatalf("pod has no extendedResourceClaimStatus: %+v", pod.Status)
	}
	st := pod.Status.ExtendedResourceClaimStatus
	claim, err := e.kube.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || !metav1.IsControlledBy(claim, pod) {
		t.Errorf("claim %s: annotations %v owners %v", claim.Name, claim.Annotations, claim.OwnerReferences)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 2 || claim.Status.Allocation.Devices.Results[0].Pool != n {
		t.Fatalf("claim allocation = %+v, want 2 GPUs of %s", claim.Status.Allocation, n)
	}
	if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pod.UID {
		t.Errorf("reservedFor = %+v", claim.Status.ReservedFor)
	}
	if m := st.RequestMappings; len(m) != 1 || m[0].ContainerName != "main" || m[0].ResourceName != string(name) || m[0].RequestName != claim.Spec.Devices.Requests[0].Name {
		t.Errorf("request mappings = %+v, claim requests %+v", m, claim.Spec.Devices.Requests)
	}
	waitQueueGPU(t, e, q, "2")
}
