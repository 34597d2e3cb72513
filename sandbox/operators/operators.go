// Package operators runs the real workload operators — JobSet, LeaderWorkerSet,
// KubeRay, the MPI Operator, Kubeflow Trainer v2 and the training-operator
// (PyTorchJob) — as processes against a given API server, so that tests and
// `tessera sandbox up --operators` see the pods those operators really create.
// The binaries, and each operator's own CRDs and webhook configurations, are
// found in, or built into, the user's cache by sandbox/opbin from the Go
// module proxy (hack/build-operators.sh runs the same code; bin/operators/<name>
// of a checkout links to the cache); no checkout is needed.
//
// Webhooks run where the operator serves them: the webhook server listens on
// 127.0.0.1 with a certificate of a CA made here, and the operator's webhook
// configurations (as its kustomize deployment installs them) point at it by URL.
// None is turned off: JobSet and LeaderWorkerSet could only drop them by giving
// up their pod webhooks, which set the labels and annotations their controllers
// and tessera's catalog read; KubeRay and the MPI Operator have none by default.
package operators

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/sandbox/cluster"
	"github.com/tessera-gpu/tessera/sandbox/opbin"
)

// EnvBinDir overrides where the operators are looked up and built (one
// directory per operator, as hack/build-operators.sh lays them out).
const EnvBinDir = opbin.EnvDir

// Names of the operators, as --operators takes them.
const (
	JobSet          = "jobset"
	LWS             = "lws"
	Ray             = "ray"
	MPI             = "mpi"
	Trainer         = "trainer"
	PyTorch         = "pytorch"
	trainerNS       = "kubeflow-system"
	trainingOpNS    = "kubeflow"
	trainerWebhook  = "validator.trainer.kubeflow.org"
	trainingWebhook = "validator.training-operator.kubeflow.org"
)

// spec is how one operator is started.
type spec struct {
	name string
	// dir is the build directory under bin/operators.
	dir string
	// requires are operators that must run too (Trainer creates JobSets).
	requires []string
	// kinds are the resources (plural) the operator serves here; webhooks for
	// others are not installed.
	resources []string
	// webhook reports whether the operator serves webhooks.
	webhook bool
	// rotator: the operator manages its certificate with cert-controller in
	// Secret namespace/secret, with CA name caName, for Service DNS name dns,
	// and injects it into the validating configuration vwc.
	rotator *rotator
	// args builds the command line.
	args func(r *Running) ([]string, error)
	// env is added to the process environment.
	env func(r *Running) []string
	// ready reports whether the operator is serving.
	ready func(ctx context.Context, r *Running) (bool, error)
}

type rotator struct {
	namespace, secret, caName, dns, vwc string
}

var specs = map[string]*spec{
	JobSet: {
		name: JobSet, dir: "jobset", webhook: true,
		resources: []string{"jobsets", "pods"},
		args: func(r *Running) ([]string, error) {
			cfg := map[string]any{
				"apiVersion":             "config.jobset.x-k8s.io/v1alpha1",
				"kind":                   "Configuration",
				"leaderElection":         map[string]any{"leaderElect": false},
				"internalCertManagement": map[string]any{"enable": false},
				"webhook":                map[string]any{"port": r.webhookPort, "host": "127.0.0.1", "certDir": r.certDir},
				"health":                 map[string]any{"healthProbeBindAddress": r.probeAddr()},
				"metrics":                map[string]any{"bindAddress": "0"},
			}
			path, err := r.writeConfig(cfg)
			return []string{"--config=" + path, "--zap-log-level=info"}, err
		},
		ready: probeAndWebhook,
	},
	LWS: {
		name: LWS, dir: "lws", webhook: true,
		resources: []string{"leaderworkersets", "disaggregatedsets", "pods"},
		args: func(r *Running) ([]string, error) {
			cfg := map[string]any{
				"apiVersion":             "config.lws.x-k8s.io/v1alpha1",
				"kind":                   "Configuration",
				"leaderElection":         map[string]any{"leaderElect": false},
				"internalCertManagement": map[string]any{"enable": false},
				"webhook":                map[string]any{"port": r.webhookPort, "host": "127.0.0.1", "certDir": r.certDir},
				"health":                 map[string]any{"healthProbeBindAddress": r.probeAddr()},
				"metrics":                map[string]any{"bindAddress": "0"},
			}
			path, err := r.writeConfig(cfg)
			return []string{"--config=" + path, "--zap-log-level=info"}, err
		},
		ready: probeAndWebhook,
	},
	Ray: {
		name: Ray, dir: "kuberay",
		resources: []string{"rayclusters", "rayjobs", "rayservices"},
		args: func(r *Running) ([]string, error) {
			return []string{"--metrics-addr=0", "--health-probe-bind-address=" + r.probeAddr(), "--enable-leader-election=false", "--log-stdout-encoder=console"}, nil
		},
		ready: probe,
	},
	MPI: {
		name: MPI, dir: "mpi-operator",
		resources: []string{"mpijobs"},
		// The MPI Operator always runs leader election and serves /healthz on
		// :8080 (fixed in v0.6.0: cmd/mpi-operator/app/server.go); it is ready
		// once it holds its Lease.
		args: func(r *Running) ([]string, error) {
			return []string{"--kubeConfig=" + r.kubeconfig, "--lock-namespace=" + metav1.NamespaceDefault, "--monitoring-port=0", "--threadiness=4", "--kube-api-qps=50", "--kube-api-burst=100"}, nil
		},
		ready: func(ctx context.Context, r *Running) (bool, error) {
			l, err := r.client.CoordinationV1().Leases(metav1.NamespaceDefault).Get(ctx, "mpi-operator", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
		},
	},
	Trainer: {
		name: Trainer, dir: "trainer", webhook: true, requires: []string{JobSet},
		resources: []string{"trainjobs", "trainingruntimes", "clustertrainingruntimes"},
		rotator: &rotator{namespace: trainerNS, secret: "kubeflow-trainer-webhook-cert", caName: "kubeflow-trainer-ca",
			dns: "kubeflow-trainer-controller-manager." + trainerNS + ".svc", vwc: trainerWebhook},
		args: func(r *Running) ([]string, error) {
			return []string{"--metrics-bind-address=0", "--health-probe-bind-address=" + r.probeAddr(), "--webhook-server-port=" + strconv.Itoa(r.webhookPort), "--leader-elect=false"}, nil
		},
		ready: probeAndWebhook,
	},
	PyTorch: {
		name: PyTorch, dir: "training-operator", webhook: true,
		resources: []string{"pytorchjobs"},
		rotator: &rotator{namespace: trainingOpNS, secret: "training-operator-webhook-cert", caName: "training-operator-ca",
			dns: "training-operator." + trainingOpNS + ".svc", vwc: trainingWebhook},
		args: func(r *Running) ([]string, error) {
			return []string{"--enable-scheme=pytorchjob", "--metrics-bind-address=0", "--health-probe-bind-address=" + r.probeAddr(), "--webhook-server-port=" + strconv.Itoa(r.webhookPort), "--leader-elect=false"}, nil
		},
		env:   func(*Running) []string { return []string{"MY_POD_NAMESPACE=" + trainingOpNS} },
		ready: probeAndWebhook,
	},
}

// Known lists the operator names in the order they start.
func Known() []string { return []string{JobSet, LWS, Ray, MPI, Trainer, PyTorch} }

// Parse reads a comma-separated list of operator names ("" is none) and adds
// the operators they need (trainer needs jobset), in start order.
func Parse(list string) ([]string, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		s, ok := specs[n]
		if !ok {
			return nil, fmt.Errorf("unknown operator %q (known: %s)", n, strings.Join(Known(), ", "))
		}
		want[n] = true
		for _, r := range s.requires {
			want[r] = true
		}
	}
	var out []string
	for _, n := range Known() {
		if want[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

// rotatorCertDir is where the cert-controller operators (Trainer, the
// training-operator) expect their webhook Secret mounted: a constant in both
// (pkg/util/cert, pkg/cert), and controller-runtime's default with TMPDIR=/tmp.
const rotatorCertDir = "/tmp/k8s-webhook-server/serving-certs"

// certCacheDir keeps the webhook CA between runs (see loadOrCreateServingCerts).
func certCacheDir() (string, error) {
	dir := os.Getenv("XDG_CACHE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "tessera", "operators"), nil
}

// BuildDir is where an operator's build (manager, crds/, webhooks/, …) is,
// or will be built, by its directory name (jobset, lws, kuberay,
// mpi-operator, trainer, training-operator); nothing is built.
func BuildDir(ctx context.Context, name string) (string, error) {
	return opbin.Dir(ctx, opbin.Options{}, name)
}

// Options say where the operators run.
type Options struct {
	// Config is an admin client configuration of the API server, and
	// Kubeconfig a kubeconfig file with the same credentials for the processes.
	Config     *rest.Config
	Kubeconfig string
	// Dir holds the operators' logs, configuration files and certificates.
	Dir string
	// BinDir, when set, holds the operators' builds, one directory per
	// operator; nothing is built. Default: sandbox/opbin's directories
	// ($TESSERA_OPERATORS_BIN, else the cache), building what is missing.
	BinDir string
	// Log receives progress lines; nil for silence.
	Log func(format string, args ...any)
	// Out receives the progress lines of building operators that are not in
	// the cache yet (nil: silence).
	Out io.Writer
}

// Set is a group of running operators sharing one webhook CA.
type Set struct {
	opts Options
	// buildDirs are the operators' builds by directory name (without
	// Options.BinDir).
	buildDirs map[string]string
	running   []*Running
	client    kubernetes.Interface
	dyn       dynamic.Interface
}

// Running is one operator process.
type Running struct {
	Name string
	// Version is the module and version it was built from.
	Version string

	spec        *spec
	set         *Set
	dir         string
	binDir      string
	kubeconfig  string
	certDir     string
	webhookPort int
	probePort   int
	client      kubernetes.Interface
	certs       *servingCerts
	webhooks    []*unstructured.Unstructured
	cmd         *exec.Cmd
	logPath     string
	done        chan struct{}
	err         error
}

// Start installs the CRDs and webhook configurations of the named operators
// (see Parse) and starts them, in order, each once the previous one serves. On
// error everything started is stopped.
func Start(ctx context.Context, names []string, opts Options) (_ *Set, err error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	for _, n := range names {
		if _, ok := specs[n]; !ok {
			return nil, fmt.Errorf("unknown operator %q (known: %s)", n, strings.Join(Known(), ", "))
		}
	}
	s := &Set{opts: opts, buildDirs: map[string]string{}}
	if opts.BinDir == "" {
		var dirs []string
		for _, n := range names {
			dirs = append(dirs, specs[n].dir)
		}
		if s.buildDirs, err = opbin.Ensure(ctx, opbin.Options{Out: opts.Out}, dirs...); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if s.client, err = kubernetes.NewForConfig(opts.Config); err != nil {
		return nil, err
	}
	if s.dyn, err = dynamic.NewForConfig(opts.Config); err != nil {
		return nil, err
	}
	var caNames, dnsNames []string
	for _, sp := range specs {
		if sp.rotator != nil {
			caNames = append(caNames, sp.rotator.caName)
			dnsNames = append(dnsNames, sp.rotator.dns)
		}
	}
	slices.Sort(caNames)
	slices.Sort(dnsNames)
	cacheDir, err := certCacheDir()
	if err != nil {
		return nil, err
	}
	certs, err := loadOrCreateServingCerts(cacheDir, caNames, dnsNames)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	for _, n := range names {
		sp, ok := specs[n]
		if !ok {
			return nil, fmt.Errorf("unknown operator %q (known: %s)", n, strings.Join(Known(), ", "))
		}
		r, err := s.start(ctx, sp, certs)
		if r != nil {
			s.running = append(s.running, r)
		}
		if err != nil {
			return nil, fmt.Errorf("operator %s: %w", n, err)
		}
	}
	return s, nil
}

// Running lists the operators of the set, in start order.
func (s *Set) Running() []*Running { return s.running }

// Get returns the running operator of that name.
func (s *Set) Get(name string) *Running {
	for _, r := range s.running {
		if r.Name == name {
			return r
		}
	}
	return nil
}

func (s *Set) start(ctx context.Context, sp *spec, certs *servingCerts) (*Running, error) {
	binDir := s.buildDirs[sp.dir]
	if s.opts.BinDir != "" {
		binDir = filepath.Join(s.opts.BinDir, sp.dir)
	}
	if _, err := os.Stat(filepath.Join(binDir, "manager")); err != nil {
		return nil, fmt.Errorf("%s is not built (%w); run hack/build-operators.sh %s", filepath.Join(binDir, "manager"), err, sp.dir)
	}
	version, _ := os.ReadFile(filepath.Join(binDir, ".version"))
	r := &Running{
		Name: sp.name, Version: strings.TrimSpace(string(version)),
		spec: sp, set: s, binDir: binDir, kubeconfig: s.opts.Kubeconfig,
		dir: filepath.Join(s.opts.Dir, sp.name), client: s.client, certs: certs, done: make(chan struct{}),
	}
	r.certDir = filepath.Join(r.dir, "certs")
	if err := os.MkdirAll(r.certDir, 0o755); err != nil {
		return nil, err
	}
	if err := certs.writeTo(r.certDir); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	r.webhookPort, r.probePort = ports[0], ports[1]
	s.opts.Log("starting %s (%s)", sp.name, r.Version)

	files, err := crdFiles(binDir)
	if err != nil {
		return nil, err
	}
	if err := installCRDs(ctx, s.opts.Config, files); err != nil {
		return nil, err
	}
	if rt := sp.rotator; rt != nil {
		if err := r.seedRotator(ctx, rt); err != nil {
			return nil, err
		}
		// In a cluster the rotator's Secret is mounted there; here it is written.
		if err := certs.writeTo(rotatorCertDir); err != nil {
			return nil, err
		}
	}
	if sp.webhook {
		keep := func(res string) bool { return slices.Contains(sp.resources, res) }
		hooks, err := webhookConfigs(binDir, sp.name, r.webhookPort, certs.caPEM, keep)
		if err != nil {
			return nil, err
		}
		for _, h := range hooks {
			if err := r.apply(ctx, h); err != nil {
				return nil, err
			}
			r.webhooks = append(r.webhooks, h)
		}
	}
	args, err := sp.args(r)
	if err != nil {
		return nil, err
	}
	if err := r.startProcess(args); err != nil {
		return r, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if done, err := r.exited(); done {
			return false, fmt.Errorf("exited (%v) before it was ready; log:\n%s", err, r.LogTail(30))
		}
		ok, err := sp.ready(ctx, r)
		if err != nil {
			return false, nil //nolint:nilerr // not up yet; retried
		}
		return ok, nil
	})
	if err != nil {
		return r, fmt.Errorf("not ready: %w; log:\n%s", err, r.LogTail(30))
	}
	s.opts.Log("  %s ready", sp.name)
	return r, nil
}

// seedRotator gives a cert-controller operator the shared certificate in its
// Secret, so that it keeps it (valid for its CA and Service names and for
// 127.0.0.1) instead of making one for its Service only.
func (r *Running) seedRotator(ctx context.Context, rt *rotator) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rt.namespace}}
	if _, err := r.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", rt.namespace, err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: rt.secret, Namespace: rt.namespace}, Data: r.certs.secretData()}
	_, err := r.client.CoreV1().Secrets(rt.namespace).Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = r.client.CoreV1().Secrets(rt.namespace).Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("webhook Secret %s/%s: %w", rt.namespace, rt.secret, err)
	}
	return nil
}

var webhookGVR = map[string]schema.GroupVersionResource{
	"MutatingWebhookConfiguration":   {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"},
	"ValidatingWebhookConfiguration": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"},
}

func (r *Running) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	ri := r.set.dyn.Resource(webhookGVR[obj.GetKind()])
	_, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		obj.SetResourceVersion(cur.GetResourceVersion())
		_, err = ri.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

func (r *Running) writeConfig(cfg map[string]any) (string, error) {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(r.dir, "config.yaml")
	return path, os.WriteFile(path, data, 0o644)
}

func (r *Running) probeAddr() string { return "127.0.0.1:" + strconv.Itoa(r.probePort) }

func (r *Running) startProcess(args []string) error {
	r.logPath = filepath.Join(r.dir, r.Name+".log")
	logFile, err := os.Create(r.logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(r.binDir, "manager"), args...)
	// TMPDIR=/tmp: controller-runtime's default webhook certificate directory
	// is $TMPDIR/k8s-webhook-server/serving-certs, and the cert-controller
	// operators write their certificate to that path under /tmp.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+r.kubeconfig, "TMPDIR=/tmp")
	if r.spec.env != nil {
		cmd.Env = append(cmd.Env, r.spec.env(r)...)
	}
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group; killed with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", r.Name, err)
	}
	r.cmd = cmd
	go func() {
		r.err = cmd.Wait()
		_ = logFile.Close()
		close(r.done)
	}()
	return nil
}

func (r *Running) exited() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// LogTail returns the last lines of the operator's log.
func (r *Running) LogTail(lines int) string {
	data, err := os.ReadFile(r.logPath)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// LogPath is the operator's log file.
func (r *Running) LogPath() string { return r.logPath }

// Alive reports an error if the operator has exited.
func (r *Running) Alive() error {
	if done, err := r.exited(); done {
		return fmt.Errorf("operator %s exited: %v", r.Name, err)
	}
	return nil
}

// stop ends the process and removes its webhook configurations, so that a
// stopped operator's failurePolicy: Fail webhooks do not block the cluster.
func (r *Running) stop() error {
	if r.cmd != nil {
		if done, _ := r.exited(); !done {
			pgid := r.cmd.Process.Pid
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-r.done
			}
		}
	}
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, h := range r.webhooks {
		err := r.set.dyn.Resource(webhookGVR[h.GetKind()]).Delete(ctx, h.GetName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !isUnreachable(err) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", h.GetKind(), h.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// Stop ends every operator of the set, last started first.
func (s *Set) Stop() error {
	var errs []error
	for i := len(s.running) - 1; i >= 0; i-- {
		if err := s.running[i].stop(); err != nil {
			errs = append(errs, err)
		}
	}
	s.running = nil
	return errors.Join(errs...)
}

// isUnreachable: the API server is gone already (a test stopped it first).
func isUnreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || strings.Contains(err.Error(), "connection refused")
}

func probe(ctx context.Context, r *Running) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.probeAddr()+"/readyz", nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}

// probeAndWebhook: ready and the webhook server accepts connections.
func probeAndWebhook(ctx context.Context, r *Running) (bool, error) {
	ok, err := probe(ctx, r)
	if !ok || err != nil {
		return false, err
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(r.webhookPort), time.Second)
	if err != nil {
		return false, err
	}
	_ = c.Close()
	return true, nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// installCRDs creates (or updates) the CRDs in files and waits until the API
// server serves them.
func installCRDs(ctx context.Context, cfg *rest.Config, files []string) error {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		_, err = client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			crd.ResourceVersion = cur.ResourceVersion
			_, err = client.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, &crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("CRD %s (%s): %w", crd.Name, filepath.Base(f), err)
		}
		if err := cluster.WaitCRDEstablished(ctx, client, crd.Name); err != nil {
			return err
		}
	}
	return nil
}
