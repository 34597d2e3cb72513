package realnode

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
)

// TestSandboxRealNode: `tessera sandbox up --real-node` runs one real node
// beside the simulated ones, and a pod that tolerates its taint, scheduled
// by tessera-scheduler with a claim template, runs as a real container that
// gets its GPU.
func TestSandboxRealNode(t *testing.T) {
	if unavailable != "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("%s is set but this machine cannot run a real node: %s", EnvRequire, unavailable)
		}
		t.Skipf("this machine cannot run a real node: %s", unavailable)
	}
	// The sandbox looks for tessera-node on PATH before bin/: use this checkout's.
	t.Setenv("PATH", filepath.Dir(tesseraNode)+string(os.PathListSeparator)+os.Getenv("PATH"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var narration strings.Builder
	sb, err := sandbox.Start(ctx, sandbox.Options{StateDir: t.TempDir(), Nodes: 1, RealNode: true, Out: &narration})
	if err != nil {
		t.Fatalf("sandbox: %v\n%s", err, narration.String())
	}
	t.Cleanup(func() {
		if err := sb.Stop(); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
	})
	if !strings.Contains(narration.String(), "real node real-node-0") {
		t.Fatalf("the sandbox did not start its real node:\n%s", narration.String())
	}
	client, err := kubernetes.NewForConfig(sb.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := "team-a"
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "whole-gpu", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.ClassGPU}}},
		}}},
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		// Namespace team-a is charged to queue team-a (its label).
		ObjectMeta: metav1.ObjectMeta{Name: "real", Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: "tessera-scheduler",
			NodeSelector:  map[string]string{corev1.LabelHostname: "real-node-0"},
			Tolerations:   []corev1.Toleration{{Key: realnode.SandboxTaint.Key, Operator: corev1.TolerationOpEqual, Value: realnode.SandboxTaint.Value, Effect: realnode.SandboxTaint.Effect}},
			Containers: []corev1.Container{{
				Name: "main", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "ls /dev; sleep 3600"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(tmpl.Name)}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var logs string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		data, err := client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		logs = string(data)
		return err == nil && strings.Contains(logs, "nvidiactl"), nil
	})
	if err != nil {
		p, _ := client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		evs, _ := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		var msgs []string
		for _, ev := range evs.Items {
			msgs = append(msgs, ev.InvolvedObject.Name+": "+ev.Reason+": "+ev.Message)
		}
		t.Fatalf("the pod on the real node did not list its GPU (phase %s, node %q, logs %q): %v\nevents:\n%s", p.Status.Phase, p.Spec.NodeName, logs, err, strings.Join(msgs, "\n"))
	}
	if n := strings.Count(logs, "\nnvidia"); !strings.Contains(logs, "nvidia-uvm") || n < 2 {
		t.Errorf("/dev of the real container: %q", logs)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
