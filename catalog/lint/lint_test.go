package lint

import (
	"os"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
)

func TestReadPaths(t *testing.T) {
	cases := map[string][]string{
		`.spec.replicatedJobs[] | (.replicas // 1) * (.template.spec.parallelism // 1)`: {
			".spec", ".spec.replicatedJobs", ".spec.replicatedJobs[]", ".spec.replicatedJobs[].replicas",
			".spec.replicatedJobs[].template", ".spec.replicatedJobs[].template.spec", ".spec.replicatedJobs[].template.spec.parallelism"},
		`.spec.template.metadata.annotations["autoscaling.knative.dev/min-scale"] // "1" | tonumber`: {
			".spec", ".spec.template", ".spec.template.metadata", ".spec.template.metadata.annotations",
			`.spec.template.metadata.annotations["autoscaling.knative.dev/min-scale"]`},
		`(.spec.replicas // 1) as $r | .spec.x[] | . as $c | $r * ($c.n // 1)`: {
			".spec", ".spec.replicas", ".spec.x", ".spec.x[]", ".spec.x[].n"},
		`.spec.services // {} | to_entries[] | .value.replicas`: {
			".spec", ".spec.services", ".spec.services[*]", ".spec.services[*].replicas"},
		`def f: .a; .spec | f`: {".spec", ".spec.a"},
		`"1"`:                  {},
	}
	for src, want := range cases {
		ps, err := readPaths(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s:\n got %v\nwant %v", src, got, want)
		}
	}
}

func loadCRD(t *testing.T, file string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := catalog.SplitDocuments(data)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(docs[0], &crd); err != nil {
		t.Fatal(err)
	}
	return &crd
}

func builtin(t *testing.T, gvk schema.GroupVersionKind) *catalog.Definition {
	t.Helper()
	c, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := c.Definition(gvk)
	if !ok {
		t.Fatalf("no built-in for %s", gvk)
	}
	return d
}

var pytorchGVK = schema.GroupVersionKind{Group: "kubeflow.org", Version: "v1", Kind: "PyTorchJob"}

func TestLintCleanAgainstCRD(t *testing.T) {
	crd := loadCRD(t, "../../test/testdata/crds/kubeflow.org_pytorchjobs.yaml")
	fs, err := Definition(builtin(t, pytorchGVK), crd)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		t.Errorf("unexpected finding: %s", f)
	}
}

// TestLintFindsRenamedField renames elasticPolicy.minReplicas in the CRD, as an
// operator upgrade might: lint names the path and the definition field reading it.
func TestLintFindsRenamedField(t *testing.T) {
	crd := loadCRD(t, "../../test/testdata/crds/kubeflow.org_pytorchjobs.yaml")
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	ep := spec.Properties["elasticPolicy"]
	ep.Properties["minReplicaCount"] = ep.Properties["minReplicas"]
	delete(ep.Properties, "minReplicas")
	fs, err := Definition(builtin(t, pytorchGVK), crd)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 {
		t.Fatalf("%d findings, want 1: %v", len(fs), fs)
	}
	f := fs[0]
	if f.Missing != ".spec.elasticPolicy.minReplicas" || f.Field != "structureDefinition.childComponents[worker].scaleDefinition.minReplicasPath" {
		t.Errorf("finding %+v", f)
	}
	if !strings.Contains(f.String(), `no field "minReplicas" at .spec.elasticPolicy`) {
		t.Errorf("message %q", f)
	}
}

func TestLintRejectsOtherKind(t *testing.T) {
	crd := loadCRD(t, "../../test/testdata/crds/grove.io_podcliquesets.yaml")
	if _, err := Definition(builtin(t, pytorchGVK), crd); err == nil {
		t.Fatal("a PyTorchJob definition linted against a PodCliqueSet CRD")
	}
}

func TestLintGroveBuiltin(t *testing.T) {
	crd := loadCRD(t, "../../test/testdata/crds/grove.io_podcliquesets.yaml")
	fs, err := Definition(builtin(t, schema.GroupVersionKind{Group: "grove.io", Version: "v1alpha1", Kind: "PodCliqueSet"}), crd)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		t.Errorf("unexpected finding: %s", f)
	}
}
