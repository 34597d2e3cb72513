package realnode

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/sandbox/realnode"
	"github.com/tessera-gpu/tessera/test/framework"
)

// envChild makes the test binary run killedOwnerChild instead of the tests.
const envChild = "TESSERA_REALNODE_TEST_CHILD"

// TestKilledOwnerLeavesNothing: a process that runs a real node with a
// running container and is killed with SIGKILL (no cleanup at all: a test
// binary killed by a timeout) leaves its node's shim and container behind;
// the next start (Sweep) removes all of it, and nothing is left.
func TestKilledOwnerLeavesNothing(t *testing.T) {
	if unavailable != "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("%s is set but this machine cannot run a real node: %s", EnvRequire, unavailable)
		}
		t.Skipf("this machine cannot run a real node: %s", unavailable)
	}
	baseline := realnode.TakeBaseline()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envChild+"=1", "TESSERA_NODE_TEST_BINARY="+tesseraNode)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if strings.HasPrefix(s.Text(), "READY ") {
				ready <- s.Text()
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			_ = child.Wait()
			t.Fatal("the child exited before its node ran a container")
		}
		t.Logf("child: %s", line)
	case <-time.After(4 * time.Minute):
		_ = child.Process.Kill()
		t.Fatal("the child's node did not run a container within 4 minutes")
	}
	_ = child.Process.Signal(syscall.SIGKILL)
	_ = child.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Pdeathsig took containerd, the kubelet and the namespace's anchor with
	// the child; the shim and the container live on in the node's cgroup.
	if left := baseline.Leftovers(ctx, ""); len(left) == 0 {
		t.Error("a killed owner left nothing at all: the container should outlive it until the sweep")
	} else {
		t.Logf("left by the killed owner: %s", strings.Join(left, "; "))
	}
	if err := realnode.Sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if left := baseline.Leftovers(ctx, ""); len(left) > 0 {
		t.Errorf("left after the sweep: %s", strings.Join(left, "; "))
	}
}

// killedOwnerChild starts a control plane and a real node with one running
// container, says READY and waits to be killed.
func killedOwnerChild() int {
	ctx := context.Background()
	cp, err := framework.Start(ctx, framework.Options{ExtraAPIServerFlags: realnode.APIServerFlags})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: control plane:", err)
		return 1
	}
	node, err := realnode.Start(ctx, realnode.Options{
		NodeName: "killed-owner", Kubeconfig: cp.KubeconfigPath, TesseraNode: os.Getenv("TESSERA_NODE_TEST_BINARY"), NoPlugin: true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: real node:", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return 1
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:                      node.Name(),
			Containers:                    []corev1.Container{{Name: "main", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "child: pod:", err)
		return 1
	}
	for range 600 {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			fmt.Printf("READY node %s in %s\n", node.Name(), node.Dir())
			select {} // until killed
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "child: pod not running")
	return 1
}
