package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

var shared struct {
	sync.Mutex
	running bool // Run is active
	cp      *ControlPlane
	err     error
	started bool
	opts    Options // what RunWith asked for
}

// Run runs the package's tests and stops the shared control plane afterwards.
// Use it from TestMain: func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }.
// An interrupt (Ctrl-C) also stops the control plane before the process exits.
func Run(m *testing.M) int {
	shared.Lock()
	shared.running = true
	shared.Unlock()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopSignals := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			stopShared()
			os.Exit(130)
		case <-stopSignals:
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(stopSignals)
	stopShared()
	return code
}

// RunWith is Run for a package whose tests all need the shared control plane
// started with opts (e.g. extra kube-apiserver flags).
func RunWith(m *testing.M, opts Options) int {
	shared.Lock()
	shared.opts = opts
	shared.Unlock()
	return Run(m)
}

func stopShared() {
	shared.Lock()
	defer shared.Unlock()
	shared.cp.Stop()
	shared.cp = nil
}

// Shared returns the package's control plane, starting it on first use. All
// tests of a package share it; they isolate themselves with namespaces
// (CreateNamespace) and unique names for cluster-scoped objects.
func Shared(t testing.TB) *ControlPlane {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if !shared.running {
		t.Fatal(errNoRun)
	}
	if !shared.started {
		shared.started = true
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.cp, shared.err = Start(ctx, shared.opts)
	}
	if shared.err != nil {
		t.Fatalf("start control plane: %v", shared.err)
	}
	return shared.cp
}

// StartForTest starts a control plane of its own for one test (for options that
// differ from the shared one) and stops it when the test ends.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	return cp
}

// Client returns an admin clientset.
func (cp *ControlPlane) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return c
}

// CreateNamespace creates a namespace with a unique name, waits for its default
// service account (pods need it), and deletes it when the test ends.
func (cp *ControlPlane) CreateNamespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	client := cp.Client(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "t-" + hex.EncodeToString(suffix)}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	if err := cp.WaitDefaultServiceAccount(ctx, client, ns.Name); err != nil {
		t.Fatalf("namespace %s: %v", ns.Name, err)
	}
	return ns.Name
}

// UniqueName returns prefix plus a random suffix, for cluster-scoped objects.
func UniqueName(prefix string) string {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(suffix))
}
