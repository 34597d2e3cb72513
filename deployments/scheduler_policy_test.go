package deployments_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestSchedulerVolumeAndClaimWritesAreNarrowed: the writes the kube-scheduler's volume binder
// and the DRA extended-resource path need pass the chart's admission policy, and nothing
// beyond them: a pod's extended-resource claim may be created and deleted, no other claim;
// a PVC may get its selected-node annotation, nothing else; a PV its claimRef, not a new
// capacity.
func TestSchedulerVolumeAndClaimWritesAreNarrowed(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	sched := impersonate(t, c.cp, "system:serviceaccount:"+ns+":"+prefix+"-scheduler", nil)
	claims := sched.ResourceV1().ResourceClaims(ns)
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "container-0-request-0", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"},
	}}}}
	waitForPolicy(t, func() error {
		got, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}, Spec: spec}, metav1.CreateOptions{})
		if err == nil {
			_ = c.client.ResourceV1().ResourceClaims(ns).Delete(ctx, got.Name, metav1.DeleteOptions{})
		}
		return err
	}, "only as a dry run")

	ext := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    "worker-0-extended-resources-",
			Annotations:     map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "worker-0", UID: "0000-pod", Controller: ptr.To(true)}},
		},
		Spec: spec,
	}
	created, err := claims.Create(ctx, ext, metav1.CreateOptions{})
	wantAllowed(t, "scheduler creates a pod's extended-resource claim", err)
	if err == nil {
		wantAllowed(t, "scheduler deletes it", claims.Delete(ctx, created.Name, metav1.DeleteOptions{}))
	}
	user, err := c.client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "user"}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantForbidden(t, "scheduler deletes a user's claim", claims.Delete(ctx, user.Name, metav1.DeleteOptions{}), "may delete only the extended-resource claims")

	pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Annotations: map[string]string{"team": "a"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To("local"),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Annotations["volume.kubernetes.io/selected-node"] = "node-a"
	pvc, err = sched.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
	wantAllowed(t, "scheduler selects a node for a claim to provision", err)
	if err == nil {
		pvc.Annotations["team"] = "b"
		_, err = sched.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
		wantForbidden(t, "scheduler changes another annotation", err, "only the volume.kubernetes.io/selected-node annotation")
	}

	pv, err := c.client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: prefix + "-pv"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:       "local",
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/mnt/x"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "data", UID: pvc.UID}
	pv.Annotations = map[string]string{"pv.kubernetes.io/bound-by-controller": "yes"}
	pv, err = sched.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
	wantAllowed(t, "scheduler binds a PV to a claim", err)
	if err == nil {
		pv.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("100Gi")
		_, err = sched.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		wantForbidden(t, "scheduler grows a PV", err, "only the claimRef")
	}
}
