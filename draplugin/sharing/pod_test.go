package sharing

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestDaemonPod(t *testing.T) {
	l := &PodLauncher{Namespace: "tessera", NodeName: "node-1", Image: "tessera:v1", MPSDir: "/run/tessera/mps", RuntimeClassName: "nvidia", PriorityClassName: "system-node-critical"}
	dirs := DirsOf(l.MPSDir, spec2.ID)
	pod := l.Pod(spec2, dirs)
	if pod.Name != "tessera-mps-c1" || pod.Labels[LabelClaimUID] != "c1" || pod.Labels[LabelComponent] != ComponentMPSDaemon || pod.Annotations[AnnotationClaim] != "ns/c1" {
		t.Errorf("meta %+v", pod.ObjectMeta)
	}
	s := pod.Spec
	if s.NodeName != "node-1" || !s.HostPID || s.RestartPolicy != corev1.RestartPolicyAlways || *s.RuntimeClassName != "nvidia" || *s.AutomountServiceAccountToken {
		t.Errorf("spec %+v", s)
	}
	c := s.Containers[0]
	if !reflect.DeepEqual(c.Command, DefaultDaemonCommand) || c.SecurityContext.Privileged != nil {
		t.Errorf("container %+v", c)
	}
	// The arguments parse back into the same spec.
	var f DaemonFlags
	fs := newFlagSet()
	f.AddFlags(fs)
	if err := fs.Parse(c.Args); err != nil || !reflect.DeepEqual(f.Spec, spec2) || f.MPSDir != l.MPSDir || f.Chroot != "" {
		t.Errorf("args %q → %+v (%v)", c.Args, f, err)
	}
	if c.Env[0].Name != "NVIDIA_VISIBLE_DEVICES" || c.Env[0].Value != "MIG-a,GPU-b" {
		t.Errorf("env %+v", c.Env)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	hostPaths := map[string]string{}
	for _, v := range s.Volumes {
		hostPaths[v.Name] = v.HostPath.Path
	}
	if hostPaths[mounts[dirs.Root]] != dirs.Root || hostPaths[mounts["/dev/shm"]] != dirs.Shm {
		t.Errorf("mounts %v, volumes %v", mounts, hostPaths)
	}

	// Without the runtime class: privileged, the driver root mounted, the
	// tools chrooted into it, the claim's directories at their host paths
	// inside it.
	l.RuntimeClassName, l.HostDriverRoot = "", "/run/nvidia/driver"
	pod = l.Pod(spec2, dirs)
	c = pod.Spec.Containers[0]
	if pod.Spec.RuntimeClassName != nil || !*c.SecurityContext.Privileged || !strings.Contains(strings.Join(c.Args, " "), "--chroot=/driver-root") {
		t.Errorf("privileged variant %+v", c)
	}
	mounts = map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if mounts["/driver-root"] != "driver-root" || mounts["/driver-root"+dirs.Root] != "mps" || mounts["/driver-root/dev/shm"] != "shm" {
		t.Errorf("privileged mounts %v", mounts)
	}
}

func TestPodLauncher(t *testing.T) {
	client := fake.NewClientset()
	l := &PodLauncher{Client: client, Namespace: "tessera", NodeName: "node-1", Image: "tessera:v1", MPSDir: "/run/tessera/mps"}
	ctx := context.Background()
	dirs := DirsOf(l.MPSDir, spec2.ID)
	for i := 0; i < 2; i++ { // idempotent
		if err := l.Launch(ctx, spec2, dirs); err != nil {
			t.Fatal(err)
		}
	}
	// Another node's daemon pod is not this node's.
	other := &PodLauncher{Client: client, Namespace: "tessera", NodeName: "node-2", Image: "tessera:v1", MPSDir: "/run/tessera/mps"}
	if err := other.Launch(ctx, DaemonSpec{ID: "c2", Devices: []string{"GPU-z"}}, DirsOf(l.MPSDir, "c2")); err != nil {
		t.Fatal(err)
	}
	// The fake clientset ignores field selectors: filter as the API would.
	got, err := l.Launched(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"c1", "c2"}) && !reflect.DeepEqual(got, []string{"c1"}) {
		t.Errorf("launched %v", got)
	}
	// A pod still terminating from an earlier prepare: the launch fails.
	p, _ := client.CoreV1().Pods("tessera").Get(ctx, PodName("c1"), metav1.GetOptions{})
	now := metav1.Now()
	p.DeletionTimestamp = &now
	if _, err := client.CoreV1().Pods("tessera").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Launch(ctx, spec2, dirs); err == nil || !strings.Contains(err.Error(), "still terminating") {
		t.Errorf("launch over a terminating pod: %v", err)
	}
	if !strings.Contains(l.Describe(ctx, "c1"), "tessera/tessera-mps-c1") {
		t.Errorf("describe %q", l.Describe(ctx, "c1"))
	}
	for i := 0; i < 2; i++ {
		if err := l.Remove(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
	}
}
