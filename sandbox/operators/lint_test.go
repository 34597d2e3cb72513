package operators

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/lint"
	"github.com/tessera-gpu/tessera/sandbox/opbin"
)

// TestBuiltinDefinitionsLintAgainstOperatorCRDs: every path a built-in
// definition reads exists in the CRD that the pinned operator itself installs
// (`tessera catalog lint`), for every kind of those CRDs that the catalog maps:
// a field an operator release renames shows up here, not on a cluster.
func TestBuiltinDefinitionsLintAgainstOperatorCRDs(t *testing.T) {
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, op := range opbin.All {
		dir, err := BuildDir(context.Background(), op.Name)
		if err != nil {
			t.Fatal(err)
		}
		crds, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
		if err != nil || len(crds) == 0 {
			t.Fatalf("no CRDs of %s under %s (%v); run hack/build-operators.sh", op.Name, dir, err)
		}
		files = append(files, crds...)
	}
	linted := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			def, ok := cat.Definition(lint.GVKOf(&crd, v.Name))
			if !ok {
				continue
			}
			findings, err := lint.Definition(def, &crd)
			if err != nil {
				t.Fatalf("%s %s: %v", def.Name, f, err)
			}
			for _, fd := range findings {
				t.Errorf("%s against %s: %v", def.Name, filepath.Base(f), fd)
			}
			linted++
		}
	}
	// JobSet, LWS, RayCluster, RayJob, RayService, MPIJob v2beta1, TrainJob, PyTorchJob.
	if linted != 8 {
		t.Errorf("linted %d definitions against operator CRDs, want 8", linted)
	}
}
