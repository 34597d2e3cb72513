// Package cluster starts a real Kubernetes control plane — etcd,
// kube-apiserver and kube-controller-manager of the pinned release, built from
// the Go module proxy by package k8sbin — on loopback, for the sandbox, the
// tests and the benchmarks.
//
// It is written here rather than taken from controller-runtime's envtest because
// envtest starts no kube-controller-manager, and the tests need the real
// resourceclaim, job, replicaset and garbage-collector controllers.
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

// DefaultControllers are the kube-controller-manager controllers the control plane
// runs. The node lifecycle controller is left out on purpose: simulated nodes
// have no kubelet heartbeat and would be tainted and evicted.
var DefaultControllers = []string{
	"resourceclaim-controller",
	"job-controller",
	"replicaset-controller",
	"deployment-controller",
	"statefulset-controller",
	"daemonset-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"disruption-controller",
	"ttl-after-finished-controller",
	"pod-garbage-collector-controller",
	"root-ca-certificate-publisher-controller",
}

// FeatureGates are the kube-apiserver and kube-controller-manager feature gates
// the control plane turns on: the DRA features of v1.37 beyond the GA core
// (prioritized lists, device taints and admin access are GA and need no gate).
// Beta gates that are on by default are named anyway, so that a test run
// against another release shows a clear "unknown feature gate" error instead
// of silently testing less. Tests of the degraded path (an older cluster) pass
// their own gates in Options.
var FeatureGates = map[string]bool{
	"DRAPartitionableDevices":    true,
	"DRAConsumableCapacity":      true,
	"DRADeviceBindingConditions": true,
	"DRAFractionalCapacityRange": true,
}

// RuntimeConfig enables the DRA API versions beside the GA resource.k8s.io/v1.
var RuntimeConfig = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"

// Options tune a control plane. The zero value is what most tests want.
type Options struct {
	// FeatureGates replaces the default FeatureGates when non-nil.
	FeatureGates map[string]bool
	// RuntimeConfig replaces the default RuntimeConfig when non-empty.
	RuntimeConfig string
	// Controllers replaces DefaultControllers when non-nil.
	Controllers []string
	// ExtraAPIServerFlags are appended to the kube-apiserver command line.
	ExtraAPIServerFlags []string
	// ExtraControllerManagerFlags are appended to the kube-controller-manager
	// command line (e.g. its client QPS, default 20, where its controllers
	// create the pods being measured).
	ExtraControllerManagerFlags []string
	// NoControllerManager starts only etcd and the API server.
	NoControllerManager bool
	// Dir is where the control plane keeps its state and logs; a fresh temp
	// directory when empty. A Dir given by the caller is not removed by Stop.
	Dir string
	// Log receives progress lines (the sandbox prints them); nil for silence.
	Log func(format string, args ...any)
	// BinDir holds etcd, kube-apiserver and kube-controller-manager; default
	// BinDir(ctx).
	BinDir string
}

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
type ControlPlane struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file with the same credentials, for CLIs
	// and processes started by tests.
	KubeconfigPath string
	// Dir holds the state, certificates and the logs (etcd.log,
	// kube-apiserver.log, kube-controller-manager.log).
	Dir string
	// BinDir is where the binaries came from (kube-scheduler and kubectl
	// too, when built: framework.BinDir checks for kube-scheduler).
	BinDir string

	ownDir    bool
	etcd      *proc.Process
	apiserver *proc.Process
	kcm       *proc.Process
}

// Start launches a control plane and waits until the API server is ready and
// the controllers have created the default service account.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = BinDir(ctx); err != nil {
			return nil, err
		}
	} else if err := checkBinaries(binDir, k8sbin.ControlPlane); err != nil {
		return nil, err
	}
	sweepStale()
	cp = &ControlPlane{BinDir: binDir, Dir: opts.Dir}
	if cp.Dir == "" {
		cp.Dir, err = os.MkdirTemp("", stalePrefix)
		if err != nil {
			return nil, fmt.Errorf("create control-plane dir: %w", err)
		}
		cp.ownDir = true
	} else if err := os.MkdirAll(cp.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create control-plane dir: %w", err)
	}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if err := os.WriteFile(filepath.Join(cp.Dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("write owner pid: %w", err)
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]

	logf("starting etcd")
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	cp.etcd, err = startProcess("etcd", filepath.Join(binDir, "etcd"), cp.Dir,
		"--name=default",
		"--data-dir="+filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// Test data is thrown away; fsync only slows the tests down.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	creds, err := writeCredentials(cp.Dir)
	if err != nil {
		return nil, err
	}

	gates := opts.FeatureGates
	if gates == nil {
		gates = FeatureGates
	}
	runtimeConfig := opts.RuntimeConfig
	if runtimeConfig == "" {
		runtimeConfig = RuntimeConfig
	}
	logf("starting kube-apiserver")
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The "kubernetes" Service endpoint cannot point at loopback; nothing here needs it.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + creds.certFile,
		"--tls-private-key-file=" + creds.keyFile,
		"--token-auth-file=" + creds.tokenFile,
		"--service-account-key-file=" + creds.saKeyFile,
		"--service-account-signing-key-file=" + creds.saKeyFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--feature-gates=" + gateFlag(gates),
		"--runtime-config=" + runtimeConfig,
		"--cert-dir=" + filepath.Join(cp.Dir, "certs"),
	}
	apiArgs = append(apiArgs, opts.ExtraAPIServerFlags...)
	cp.apiserver, err = startProcess("kube-apiserver", filepath.Join(binDir, "kube-apiserver"), cp.Dir, apiArgs...)
	if err != nil {
		return nil, err
	}

	cp.Config = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(apiPort),
		BearerToken:     creds.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: creds.caPEM},
		QPS:             200,
		Burst:           400,
	}
	cp.KubeconfigPath = filepath.Join(cp.Dir, "kubeconfig")
	if err := WriteKubeconfig(cp.Config, cp.KubeconfigPath); err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, fmt.Errorf("client for the API server: %w", err)
	}
	if err := cp.waitReady(ctx, client); err != nil {
		return nil, err
	}

	if !opts.NoControllerManager {
		controllers := opts.Controllers
		if controllers == nil {
			controllers = DefaultControllers
		}
		logf("starting kube-controller-manager")
		kcmArgs := []string{"--kubeconfig=" + cp.KubeconfigPath,
			"--controllers=" + strings.Join(controllers, ","),
			"--leader-elect=false",
			// No HTTPS endpoint: several control planes may run at once.
			"--secure-port=0",
			"--service-account-private-key-file=" + creds.saKeyFile,
			"--root-ca-file=" + creds.certFile,
			"--feature-gates=" + gateFlag(gates),
			"--concurrent-job-syncs=20",
		}
		kcmArgs = append(kcmArgs, opts.ExtraControllerManagerFlags...)
		cp.kcm, err = startProcess("kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"), cp.Dir, kcmArgs...)
		if err != nil {
			return nil, err
		}
		if err := cp.waitDefaultServiceAccount(ctx, client, metav1.NamespaceDefault); err != nil {
			return nil, err
		}
	}
	logf("control plane ready at %s", cp.Config.Host)
	return cp, nil
}

// Stop terminates every process and removes the control plane's directory
// (unless the caller chose it). It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	if cp == nil {
		return
	}
	stopProcess(cp.kcm, 10*time.Second)
	stopProcess(cp.apiserver, 15*time.Second)
	stopProcess(cp.etcd, 10*time.Second)
	if cp.ownDir && cp.Dir != "" && os.Getenv("TESSERA_KEEP_CONTROL_PLANE") == "" {
		_ = os.RemoveAll(cp.Dir)
	}
}

// LogTail returns the end of one component's log ("etcd", "kube-apiserver",
// "kube-controller-manager"), for failure messages.
func (cp *ControlPlane) LogTail(component string, lines int) string {
	for _, p := range []*proc.Process{cp.etcd, cp.apiserver, cp.kcm} {
		if p != nil && p.Name == component {
			return p.LogTail(lines)
		}
	}
	return "(no such component)"
}

func (cp *ControlPlane) checkAlive() error {
	for _, p := range []*proc.Process{cp.etcd, cp.apiserver, cp.kcm} {
		if p == nil {
			continue
		}
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s: %w (%v); last log lines:\n%s", p.Name, proc.ErrExited, err, p.LogTail(30))
		}
	}
	return nil
}

func (cp *ControlPlane) waitReady(ctx context.Context, client kubernetes.Interface) error {
	deadline := time.Now().Add(90 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		if err := cp.checkAlive(); err != nil {
			return err
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready after 90s (last error: %v); last log lines:\n%s", lastErr, cp.apiserver.LogTail(30))
}

// WaitDefaultServiceAccount waits until the controllers have created the
// namespace's default service account (pods need it). Without a
// kube-controller-manager nothing creates it, and it returns at once.
func (cp *ControlPlane) WaitDefaultServiceAccount(ctx context.Context, client kubernetes.Interface, namespace string) error {
	if cp.kcm == nil {
		return nil
	}
	return cp.waitDefaultServiceAccount(ctx, client, namespace)
}

func (cp *ControlPlane) waitDefaultServiceAccount(ctx context.Context, client kubernetes.Interface, namespace string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if err := cp.checkAlive(); err != nil {
			return err
		}
		if _, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the default service account: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("service account %s/default not created within 60s; kube-controller-manager log:\n%s", namespace, cp.kcm.LogTail(30))
}

func gateFlag(gates map[string]bool) string {
	parts := make([]string, 0, len(gates))
	for name, on := range gates {
		parts = append(parts, name+"="+strconv.FormatBool(on))
	}
	// Stable order keeps command lines comparable between runs.
	sortStrings(parts)
	return strings.Join(parts, ",")
}

type credentials struct {
	certFile, keyFile, tokenFile, saKeyFile string
	caPEM                                   []byte
	adminToken                              string
}

func writeCredentials(dir string) (*credentials, error) {
	c := &credentials{
		certFile:  filepath.Join(dir, "apiserver.crt"),
		keyFile:   filepath.Join(dir, "apiserver.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
		saKeyFile: filepath.Join(dir, "sa.key"),
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("generate serving certificate: %w", err)
	}
	c.caPEM = certPEM
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("generate admin token: %w", err)
	}
	c.adminToken = hex.EncodeToString(tok)
	tokens := c.adminToken + `,admin,admin,"system:masters"` + "\n"
	for path, data := range map[string][]byte{
		c.certFile: certPEM, c.keyFile: keyPEM, c.saKeyFile: saPEM, c.tokenFile: []byte(tokens),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	}
	return c, nil
}

// WriteKubeconfig writes cfg (host, CA, bearer token) as a kubeconfig file.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["tessera"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["tessera"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: "admin", Namespace: metav1.NamespaceDefault}
	kc.CurrentContext = "tessera"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// freePorts asks the kernel for n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
