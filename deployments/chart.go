// Package deployments renders the tessera Helm chart (deployments/helm/tessera)
// with Helm's own Go library, the way `helm template` and `helm install` do:
// values are coalesced with the chart's defaults and checked against
// values.schema.json, templates run through Helm's engine, and the result is
// split into objects in Helm's install order. hack/render-manifests uses it to
// write deployments/manifests/; the tests use it to apply the chart to a real
// API server.
package deployments

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Default release coordinates of the plain manifests.
const (
	DefaultReleaseName = "tessera"
	DefaultNamespace   = "tessera-system"
	// KubeVersion is the Kubernetes version the chart is rendered for when
	// the caller does not say (the version the tests run against).
	KubeVersion = "v1.37.2"
)

// Dir returns the deployments/ directory of the source tree this package was
// built from.
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		// Only without debug info; fall back to the working directory.
		return "deployments"
	}
	return filepath.Dir(file)
}

// ChartDir is the chart's directory.
func ChartDir() string { return filepath.Join(Dir(), "helm", "tessera") }

// Options select what to render.
type Options struct {
	// ChartDir defaults to ChartDir().
	ChartDir string
	// ReleaseName and Namespace default to DefaultReleaseName and
	// DefaultNamespace.
	ReleaseName string
	Namespace   string
	// Values override the chart's values.yaml (as `helm --values`).
	Values map[string]any
	// KubeVersion defaults to KubeVersion; the chart's kubeVersion
	// constraint is checked against it.
	KubeVersion string
}

// Rendered is the output of one render.
type Rendered struct {
	// CRDs are the chart's crds/ files, as Helm installs them first.
	CRDs []*unstructured.Unstructured
	// CRDFiles are those files' contents, as they are.
	CRDFiles []string
	// Objects are the rendered templates in Helm's install order.
	Objects []*unstructured.Unstructured
	// Manifests are the rendered documents (one per object, with its
	// "# Source:" line), in the order of Objects.
	Manifests []string
}

// ErrInvalidValues marks errors from values.schema.json or from the chart's
// own checks (the "fail" calls in _helpers.tpl).
var ErrInvalidValues = errors.New("invalid chart values")

// LoadValuesFile reads a values file such as those `helm -f` takes.
func LoadValuesFile(path string) (map[string]any, error) {
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		return nil, fmt.Errorf("values file %s: %w", path, err)
	}
	return v.AsMap(), nil
}

// Render renders the chart.
func Render(opts Options) (*Rendered, error) {
	if opts.ChartDir == "" {
		opts.ChartDir = ChartDir()
	}
	if opts.ReleaseName == "" {
		opts.ReleaseName = DefaultReleaseName
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.KubeVersion == "" {
		opts.KubeVersion = KubeVersion
	}
	chrt, err := loader.Load(opts.ChartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", opts.ChartDir, err)
	}
	kv, err := chartutil.ParseKubeVersion(opts.KubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kubernetes version %q: %w", opts.KubeVersion, err)
	}
	if c := chrt.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
		return nil, fmt.Errorf("chart %s needs Kubernetes %s, not %s", chrt.Name(), c, kv.String())
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv

	values := opts.Values
	if values == nil {
		values = map[string]any{}
	}
	renderValues, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{
		Name: opts.ReleaseName, Namespace: opts.Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidValues, err)
	}
	// Strict: a template that reads a value the chart does not define is a
	// bug, not an empty string.
	files, err := engine.Engine{Strict: true}.Render(chrt, renderValues)
	if err != nil {
		// The chart's own checks fail with this prefix (_helpers.tpl).
		if strings.Contains(err.Error(), "invalid values: ") {
			return nil, fmt.Errorf("%w: %w", ErrInvalidValues, err)
		}
		return nil, fmt.Errorf("render chart: %w", err)
	}
	// NOTES.txt and partials are not objects.
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") || !strings.HasSuffix(name, ".yaml") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("split rendered chart: %w", err)
	}
	if len(hooks) > 0 {
		// The chart has no hooks; a hook would be skipped by plain manifests.
		return nil, fmt.Errorf("chart has %d hooks; plain manifests cannot express them", len(hooks))
	}
	// Helm orders kinds it does not know last; the admission policies go
	// first so that no agent writes a slice before its policy exists.
	sort.SliceStable(manifests, func(i, j int) bool {
		return admissionFirst(manifests[i].Head.Kind) < admissionFirst(manifests[j].Head.Kind)
	})
	out := &Rendered{}
	for _, m := range manifests {
		obj, err := decodeOne(m.Content)
		if err != nil {
			return nil, fmt.Errorf("rendered %s: %w", m.Name, err)
		}
		out.Objects = append(out.Objects, obj)
		out.Manifests = append(out.Manifests, "# Source: "+m.Name+"\n"+strings.TrimSpace(m.Content)+"\n")
	}
	for _, crd := range chrt.CRDObjects() {
		objs, err := DecodeAll(crd.File.Data)
		if err != nil {
			return nil, fmt.Errorf("chart CRD %s: %w", crd.Filename, err)
		}
		out.CRDs = append(out.CRDs, objs...)
		out.CRDFiles = append(out.CRDFiles, "# Source: "+crd.Filename+"\n"+strings.TrimSpace(strings.TrimPrefix(string(crd.File.Data), "---"))+"\n")
	}
	return out, nil
}

func admissionFirst(kind string) int {
	switch kind {
	case "ValidatingAdmissionPolicy":
		return 0
	case "ValidatingAdmissionPolicyBinding":
		return 1
	}
	return 2
}

// decodeOne decodes a manifest that must hold exactly one object.
func decodeOne(doc string) (*unstructured.Unstructured, error) {
	objs, err := DecodeAll([]byte(doc))
	if err != nil {
		return nil, err
	}
	if len(objs) != 1 {
		return nil, fmt.Errorf("want one object, found %d", len(objs))
	}
	return objs[0], nil
}

// DecodeAll decodes a multi-document YAML stream; empty documents are
// skipped, and every object must have apiVersion, kind and a name.
func DecodeAll(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetAPIVersion() == "" || obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("document %d: apiVersion, kind and metadata.name are required", i)
		}
		out = append(out, obj)
	}
}

// SyncSources copies the CRDs (deployments/crds) and DeviceClasses
// (deployments/deviceclasses), which other parts of the project generate,
// into the chart (crds/ and files/deviceclasses/). Files in the chart that no
// longer have a source are removed. It returns the chart paths it changed.
func SyncSources(deploymentsDir string) ([]string, error) {
	var changed []string
	chartDir := filepath.Join(deploymentsDir, "helm", "tessera")
	for _, s := range Sources {
		c, err := syncDir(filepath.Join(deploymentsDir, s.From), filepath.Join(chartDir, s.To))
		if err != nil {
			return changed, err
		}
		changed = append(changed, c...)
	}
	return changed, nil
}

// Source is a directory of YAML files that the chart carries a copy of.
type Source struct {
	// From is relative to deployments/, To to the chart's directory.
	From, To string
}

// Sources are the directories SyncSources copies.
var Sources = []Source{
	{From: "crds", To: "crds"},
	{From: "deviceclasses", To: filepath.Join("files", "deviceclasses")},
}

// DiffSources lists the chart files that differ from their sources (missing,
// changed or without a source); empty when in sync.
func DiffSources(deploymentsDir string) ([]string, error) {
	var diffs []string
	chartDir := filepath.Join(deploymentsDir, "helm", "tessera")
	for _, s := range Sources {
		want, err := yamlFiles(filepath.Join(deploymentsDir, s.From))
		if err != nil {
			return nil, err
		}
		have, err := yamlFiles(filepath.Join(chartDir, s.To))
		if err != nil {
			return nil, err
		}
		for name, data := range want {
			if got, ok := have[name]; !ok {
				diffs = append(diffs, filepath.Join(s.To, name)+" is missing")
			} else if !bytes.Equal(got, data) {
				diffs = append(diffs, filepath.Join(s.To, name)+" differs from "+filepath.Join("deployments", s.From, name))
			}
		}
		for name := range have {
			if _, ok := want[name]; !ok {
				diffs = append(diffs, filepath.Join(s.To, name)+" has no source in "+filepath.Join("deployments", s.From))
			}
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

func syncDir(from, to string) ([]string, error) {
	want, err := yamlFiles(from)
	if err != nil {
		return nil, err
	}
	have, err := yamlFiles(to)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", to, err)
	}
	var changed []string
	for name, data := range want {
		if bytes.Equal(have[name], data) {
			continue
		}
		p := filepath.Join(to, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return changed, fmt.Errorf("write %s: %w", p, err)
		}
		changed = append(changed, p)
	}
	for name := range have {
		if _, ok := want[name]; ok {
			continue
		}
		p := filepath.Join(to, name)
		if err := os.Remove(p); err != nil {
			return changed, fmt.Errorf("remove %s: %w", p, err)
		}
		changed = append(changed, p)
	}
	sort.Strings(changed)
	return changed, nil
}

// yamlFiles reads the *.yaml files of a directory (not recursively); a
// missing directory has none.
func yamlFiles(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string][]byte{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", e.Name(), err)
		}
		out[e.Name()] = data
	}
	return out, nil
}

// ManifestHeader starts every file in deployments/manifests/.
const ManifestHeader = "# Generated by `go run ./hack/render-manifests` from deployments/helm/tessera\n" +
	"# with the chart's default values (release %q, namespace %q). Do not edit.\n"

// PlainManifests are the files of deployments/manifests/ for a render:
// crds.yaml (apply first) and tessera.yaml (everything else, in Helm's
// install order, starting with the namespace).
func PlainManifests(r *Rendered, releaseName, namespace string) map[string][]byte {
	header := fmt.Sprintf(ManifestHeader, releaseName, namespace)
	var crds, rest bytes.Buffer
	crds.WriteString(header)
	for _, f := range r.CRDFiles {
		crds.WriteString("---\n")
		crds.WriteString(f)
	}
	rest.WriteString(header)
	// helm install --create-namespace creates the namespace; plain
	// manifests must carry it. Nothing in it needs more than Pod Security
	// "restricted": the node agents and their MPS daemons live in the node
	// namespace (node.namespace), which the chart itself renders.
	fmt.Fprintf(&rest, "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels:\n"+
		"    pod-security.kubernetes.io/enforce: restricted\n    pod-security.kubernetes.io/audit: restricted\n"+
		"    pod-security.kubernetes.io/warn: restricted\n", namespace)
	for _, m := range r.Manifests {
		rest.WriteString("---\n")
		rest.WriteString(m)
	}
	return map[string][]byte{"crds.yaml": crds.Bytes(), "tessera.yaml": rest.Bytes()}
}
