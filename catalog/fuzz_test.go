package catalog

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// addFiles seeds a fuzzer with every YAML file under dir.
func addFiles(f *testing.F, dir string) {
	files, err := ExpandPath(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
}

// FuzzLoadDefinitions: any bytes either load as definitions that compile, or give
// an error; never a panic.
func FuzzLoadDefinitions(f *testing.F) {
	addFiles(f, upstreamDefsDir)
	builtins, err := builtinFS.ReadDir("definitions")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range builtins {
		data, _ := builtinFS.ReadFile("definitions/" + e.Name())
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defs, err := ParseDefinitions(data, "fuzz.yaml", SourceFile)
		if err != nil {
			return
		}
		c, err := New(defs, WithoutBuiltins())
		if err != nil {
			return
		}
		_ = c.Definitions()
	})
}

// FuzzMap: any manifest maps or fails with an error under the built-in
// definitions; a mapped workload's totals are consistent; matching a pod built
// from its labels never panics.
func FuzzMap(f *testing.F) {
	addFiles(f, workloadsDir)
	c, err := New(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := ParseManifests(data, "fuzz.yaml")
		if err != nil {
			return
		}
		for _, d := range docs {
			w, err := c.Map(d.Object)
			if err != nil {
				continue
			}
			var pods int64
			for _, comp := range w.Components {
				if comp.PodBearing {
					pods += comp.Replicas
				}
				if comp.Replicas < 0 || comp.GPUsPerPod < 0 {
					t.Fatalf("negative component %+v", comp)
				}
			}
			if pods != w.Pods {
				t.Fatalf("pods %d, components sum to %d", w.Pods, pods)
			}
			for _, g := range w.Gangs {
				if g.MinMember < 0 || g.Count < 1 {
					t.Fatalf("bad gang %+v", g)
				}
			}
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: d.Object.GetLabels(), Annotations: d.Object.GetAnnotations()}}
			_, _ = c.MatchPod(context.Background(), w, p, nil)
		}
	})
}

// TestFuzzSeedsPresent keeps the seed corpora from silently vanishing.
func TestFuzzSeedsPresent(t *testing.T) {
	for _, dir := range []string{workloadsDir, upstreamDefsDir} {
		files, err := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
		if err != nil || len(files) < 10 {
			t.Errorf("%s: %d seed files (%v)", dir, len(files), err)
		}
	}
}
