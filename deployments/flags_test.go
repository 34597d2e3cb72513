package deployments_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/draplugin"
	"github.com/tessera-gpu/tessera/nodeagent/deviceplugin"
)

var (
	binDir     string
	binMu      sync.Mutex
	binBuilt   = map[string]string{}
	binBuildEr = map[string]error{}
)

// binary builds one of the project's commands once per test binary.
func binary(t *testing.T, name string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binBuilt[name]; ok {
		return p
	}
	if err, ok := binBuildEr[name]; ok {
		t.Fatalf("build %s: %v", name, err)
	}
	if binDir == "" {
		// Shared by the tests of this binary; TestMain removes it.
		dir, err := os.MkdirTemp("", "tessera-deployments-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	out := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = filepath.Join(deployments.Dir(), "..")
	if msg, err := cmd.CombinedOutput(); err != nil {
		binBuildEr[name] = err
		t.Fatalf("build %s: %v\n%s", name, err, msg)
	}
	binBuilt[name] = out
	return out
}

// acceptsFlags runs the binary with args and --help: cobra parses every flag
// (and its value's type) before it looks at --help, so an unknown flag or a
// malformed value fails, and nothing runs.
func acceptsFlags(t *testing.T, bin string, args []string) error {
	t.Helper()
	cmd := exec.Command(bin, append(slices.Clone(args), "--help")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return &flagError{err: err, out: strings.TrimSpace(string(out))}
	}
	return nil
}

type flagError struct {
	err error
	out string
}

func (e *flagError) Error() string { return e.err.Error() + ": " + firstLine(e.out) }

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestBinariesAcceptChartFlags: every flag the chart passes exists in the
// binary it runs, for the default values and every tested combination.
func TestBinariesAcceptChartFlags(t *testing.T) {
	node := binary(t, "tessera-node")
	sched := binary(t, "tessera-scheduler")
	// The check itself must be able to fail.
	if acceptsFlags(t, node, []string{"--no-such-flag=1"}) == nil {
		t.Fatal("tessera-node accepted an unknown flag: the flag check proves nothing")
	}
	if acceptsFlags(t, sched, []string{"--leader-elect=maybe"}) == nil {
		t.Fatal("tessera-scheduler accepted a malformed bool: the flag check proves nothing")
	}
	cli := binary(t, "tessera")
	if acceptsFlags(t, cli, []string{"top", "--interval=often"}) == nil {
		t.Fatal("tessera top accepted a malformed duration: the flag check proves nothing")
	}
	cases := []string{""}
	for _, tc := range combinations {
		cases = append(cases, tc.values)
	}
	for _, v := range cases {
		r := render(t, testNamespace, v)
		for _, ds := range ofKind(r, "DaemonSet") {
			d := typed(t, r, "DaemonSet", ds.GetName(), &appsv1.DaemonSet{})
			for _, c := range d.Spec.Template.Spec.Containers {
				if err := acceptsFlags(t, node, c.Args); err != nil {
					t.Errorf("values %q: tessera-node refuses the chart's flags %v: %v", v, c.Args, err)
				}
			}
		}
		for _, dep := range ofKind(r, "Deployment") {
			d := typed(t, r, "Deployment", dep.GetName(), &appsv1.Deployment{})
			for _, c := range d.Spec.Template.Spec.Containers {
				bin := map[string]string{"/usr/bin/tessera-scheduler": sched, "/usr/bin/tessera": cli}[strings.Join(c.Command, " ")]
				if bin == "" {
					t.Errorf("values %q: Deployment %s runs %v, which this test does not know", v, d.Name, c.Command)
					continue
				}
				if err := acceptsFlags(t, bin, c.Args); err != nil {
					t.Errorf("values %q: %s refuses the chart's flags %v: %v", v, c.Command[0], c.Args, err)
				}
			}
		}
	}
}

// TestMountsMatchPluginDefaults: the DaemonSet mounts the host directories
// where the kubelet plugin and the device plugin put their files by default,
// at the same paths (CDI specs and MPS pipes name host paths).
func TestMountsMatchPluginDefaults(t *testing.T) {
	check := func(t *testing.T, values string, want []string) {
		r := render(t, testNamespace, values)
		ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
		pod := ds.Spec.Template.Spec
		hostPathOf := map[string]string{}
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				hostPathOf[v.Name] = filepath.Clean(v.HostPath.Path)
			}
		}
		mounted := map[string]bool{}
		for _, m := range pod.Containers[0].VolumeMounts {
			if hp, ok := hostPathOf[m.Name]; ok && hp == filepath.Clean(m.MountPath) {
				mounted[hp] = true
			}
		}
		for _, p := range want {
			if !mounted[filepath.Clean(p)] {
				t.Errorf("values %q: host directory %s is not mounted at the same path (mounted: %v)", values, p, mounted)
			}
		}
	}
	check(t, "", []string{draplugin.DefaultRegistrarDir, draplugin.DefaultPluginDir, draplugin.DefaultCDIDir, draplugin.DefaultMPSDir})
	check(t, "node: {devicePlugin: {enabled: true}}", []string{deviceplugin.DefaultPluginDir, draplugin.DefaultPluginDir})
}
