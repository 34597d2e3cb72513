package deployments_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tessera-gpu/tessera/test/framework"
)

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

// TestNodeBinaryRunsWithChartAccess runs the tessera-node binary (agent,
// kubelet DRA plugin, device plugin) with the chart's flags and nothing but
// the chart's RBAC and admission policy, as its service account with a
// node-bound token. Host directories and the NVML backend are redirected to
// a temp dir and a mock DGX H100 by flags appended after the chart's (the
// last occurrence of a flag wins): it publishes the node's devices, registers
// the kubelet plugin and reports ready.
func TestNodeBinaryRunsWithChartAccess(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	bin := binary(t, "tessera-node")
	nodeName := framework.UniqueName("gpu-node")
	if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })

	// MPS puts unix sockets under --mps-dir: keep the path short.
	dir, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: c.cp.Config.Host, CertificateAuthorityData: c.cp.Config.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{
		Token:                c.cp.Config.BearerToken,
		Impersonate:          "system:serviceaccount:" + ns + ":" + prefix + "-node",
		ImpersonateGroups:    []string{"system:authenticated", "system:serviceaccounts", "system:serviceaccounts:" + ns},
		ImpersonateUserExtra: map[string][]string{nodeNameExtra: {nodeName}},
	}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	r := render(t, ns, `{fullnameOverride: `+prefix+`, node: {partition: {default: {gpus: [{indices: [0, 1], mode: dynamicMIG}, {indices: [2, 3], mode: shared}, {mode: whole}]}}}}`)
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

	// Wait until the policy is in force, so that the agent's first writes
	// meet it.
	onNode := impersonate(t, c.cp, "system:serviceaccount:"+ns+":"+prefix+"-node", map[string][]string{nodeNameExtra: {nodeName}})
	waitForPolicy(t, func() error {
		_, err := onNode.ResourceV1().ResourceSlices().Create(ctx, slice(prefix+"-x", "elsewhere"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "may only write ResourceSlices")

	env := map[string]string{"NODE_NAME": nodeName, "POD_UID": "0b4b5c1e-0000-4000-8000-" + fmt.Sprintf("%012d", time.Now().UnixNano()%1e12)}
	args := expand(ds.Spec.Template.Spec.Containers[0].Args, env)
	for _, d := range []string{"reg", "plugin", "cdi", "mps"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args = append(args,
		"--kubeconfig="+kubeconfig,
		"--backend=mock:dgxh100",
		"--config="+partitionFile,
		"--kubelet-registry-dir="+filepath.Join(dir, "reg"),
		"--kubelet-plugin-dir="+filepath.Join(dir, "plugin"),
		"--cdi-dir="+filepath.Join(dir, "cdi"),
		"--mps-dir="+filepath.Join(dir, "mps"),
		"--http-address="+addr,
	)
	out := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+env["NODE_NAME"], "POD_UID="+env["POD_UID"])
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("tessera-node output:\n%s", out.String())
		}
	})

	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			return false, fmt.Errorf("tessera-node exited: %v", err)
		default:
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
	list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	devices := 0
	for _, s := range list.Items {
		devices += len(s.Spec.Devices)
	}
	if devices == 0 {
		t.Error("ready, but no device published for the node")
	}
	socks, _ := filepath.Glob(filepath.Join(dir, "reg", "*.sock"))
	if len(socks) == 0 {
		t.Error("the kubelet plugin did not create its registration socket")
	}

	// SIGTERM, as the kubelet sends on a rolling update: a clean exit.
	stopped = true
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("tessera-node exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Error("tessera-node did not stop within 20s of SIGTERM")
	}
}
