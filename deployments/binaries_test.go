package deployments_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// expand replaces $(VAR) in args the way the kubelet does for container args.
func expand(args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

// saKubeconfig writes a kubeconfig that acts as a service account of ns
// (impersonated by the admin), with extra user info such as the node name a
// node-bound token carries.
func saKubeconfig(t *testing.T, c *cluster, dir, ns, name string, extra map[string][]string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: c.cp.Config.Host, CertificateAuthorityData: c.cp.Config.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{
		Token:                c.cp.Config.BearerToken,
		Impersonate:          "system:serviceaccount:" + ns + ":" + name,
		ImpersonateGroups:    []string{"system:authenticated", "system:serviceaccounts", "system:serviceaccounts:" + ns},
		ImpersonateUserExtra: extra,
	}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is a binary started by a test; it is stopped (SIGTERM, then
// SIGKILL) at the end of the test, and its output is logged if the test
// failed.
type process struct {
	name   string
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
	done   bool
}

func startProcess(t *testing.T, name, bin string, args, env []string) *process {
	t.Helper()
	p := &process{name: name, out: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if !p.done {
			_ = p.stop(10 * time.Second)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// running reports an error if the process has exited.
func (p *process) running() error {
	select {
	case err := <-p.exited:
		p.exited <- err
		return fmt.Errorf("%s exited: %v", p.name, err)
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to grace before killing; it returns the
// exit error, or an error if the process had to be killed.
func (p *process) stop(grace time.Duration) error {
	p.done = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		return err
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.name, grace)
	}
}

// nodeProcess is a tessera-node started with the chart's DaemonSet args.
type nodeProcess struct {
	*process
	addr string // of /healthz, /readyz and /metrics over plain HTTP
	// secureAddr serves them over HTTPS with the chart's delegated
	// authentication and authorization (security_test.go).
	secureAddr string
	dir        string // kubelet registry, plugin, CDI and MPS directories
}

// startNode runs tessera-node as the chart's DaemonSet would on nodeName:
// the rendered args (with $(VAR) expanded as the kubelet does), the chart's
// service account with a node-bound token, and then, appended so that they
// win, flags that redirect the host directories into dir and NVML to a mock
// DGX H100. dir is from nodeDir, or empty for a fresh one. It returns once
// /readyz answers.
func startNode(t *testing.T, c *cluster, ns, prefix, nodeName, values, dir string) *nodeProcess {
	t.Helper()
	bin := binary(t, "tessera-node")
	if dir == "" {
		dir = nodeDir(t)
	}
	r := render(t, ns, fmt.Sprintf("{fullnameOverride: %s, node: %s}", prefix, values))
	// The node agent's service account lives in the node namespace, not ns.
	nodeNS := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{}).Namespace
	kubeconfig := saKubeconfig(t, c, dir, nodeNS, prefix+"-node", map[string][]string{nodeNameExtra: {nodeName}})
	partitionFile := filepath.Join(dir, "partition.yaml")
	if err := os.WriteFile(partitionFile, []byte(typedConfigMap(t, r)), 0o644); err != nil {
		t.Fatal(err)
	}
	ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	secureAddr := freeAddr(t)

	// The agent's first writes must meet the admission policy: wait until
	// it is in force.
	onNode := impersonate(t, c.cp, "system:serviceaccount:"+nodeNS+":"+prefix+"-node", map[string][]string{nodeNameExtra: {nodeName}})
	waitForPolicy(t, func() error {
		_, err := onNode.ResourceV1().ResourceSlices().Create(context.Background(), slice(prefix+"-x", "elsewhere"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "may only write ResourceSlices")

	env := map[string]string{"NODE_NAME": nodeName, "POD_NAMESPACE": nodeNS, "POD_UID": fmt.Sprintf("0b4b5c1e-0000-4000-8000-%012d", time.Now().UnixNano()%1e12)}
	args := append(expand(ds.Spec.Template.Spec.Containers[0].Args, env),
		"--kubeconfig="+kubeconfig,
		"--backend=mock:dgxh100",
		"--config="+partitionFile,
		"--kubelet-registry-dir="+filepath.Join(dir, "reg"),
		"--kubelet-plugin-dir="+filepath.Join(dir, "plugin"),
		"--cdi-dir="+filepath.Join(dir, "cdi"),
		"--mps-dir="+filepath.Join(dir, "mps"),
		"--http-address="+addr,
		"--bind-address=127.0.0.1", "--secure-port="+secureAddr[strings.LastIndex(secureAddr, ":")+1:],
	)
	p := startProcess(t, "tessera-node", bin, args, []string{"NODE_NAME=" + env["NODE_NAME"], "POD_NAMESPACE=" + nodeNS, "POD_UID=" + env["POD_UID"]})
	err = wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := p.running(); err != nil {
			return false, err
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("tessera-node not ready with the chart's flags and access: %v", err)
	}
	return &nodeProcess{process: p, addr: addr, secureAddr: secureAddr, dir: dir}
}

// nodeDir makes the host directories of a simulated node: reg (the
// kubelet's plugin registry), plugin, cdi and mps.
func nodeDir(t *testing.T) string {
	t.Helper()
	// MPS puts unix sockets under --mps-dir: keep the path short.
	dir, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, d := range []string{"reg", "plugin", "cdi", "mps"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startScheduler runs tessera-scheduler with the chart's Deployment args and
// the chart's service account.
func startScheduler(t *testing.T, c *cluster, ns, prefix string) *process {
	t.Helper()
	return startSchedulerWith(t, c, ns, prefix, "")
}

// startSchedulerWith is startScheduler with more chart values (", scheduler: {...}").
func startSchedulerWith(t *testing.T, c *cluster, ns, prefix, values string) *process {
	t.Helper()
	bin := binary(t, "tessera-scheduler")
	kubeconfig := saKubeconfig(t, c, t.TempDir(), ns, prefix+"-scheduler", nil)
	dep := typed(t, render(t, ns, "{fullnameOverride: "+prefix+values+"}"), "Deployment", prefix+"-scheduler", &appsv1.Deployment{})
	args := append(dep.Spec.Template.Spec.Containers[0].Args, "--kubeconfig="+kubeconfig, "--secure-port=0")
	return startProcess(t, "tessera-scheduler", bin, args, nil)
}
