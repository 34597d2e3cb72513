package operators

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// webhookConfigs reads an operator's webhook configurations as its own
// deployment installs them (the module's kubebuilder manifests with its
// kustomize patches applied), and points every webhook at the operator's
// webhook server on 127.0.0.1:port with caBundle set, instead of at a Service.
// Default kubebuilder names get the operator's name as prefix, as the
// operators' kustomizations do (jobset-, lws-), so two operators never share a
// configuration. Webhooks for resources the operator does not serve here
// (keep says which) are left out: the training-operator's configuration covers
// every Kubeflow v1 kind, of which only PyTorchJob runs.
func webhookConfigs(dir, operator string, port int, caPEM []byte, keep func(resource string) bool) ([]*unstructured.Unstructured, error) {
	path := filepath.Join(dir, "webhooks", "manifests.yaml")
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	objs, err := decodeYAML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	patches, err := filepath.Glob(filepath.Join(dir, "webhook-patches", "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, p := range patches {
		// The patch files target one kind each, as their kustomization says:
		// mutating-patch.yaml the mutating configuration, the others the
		// validating one.
		kind := "ValidatingWebhookConfiguration"
		if strings.Contains(filepath.Base(p), "mutating") {
			kind = "MutatingWebhookConfiguration"
		}
		ops, err := readPatch(p)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetKind() != kind {
				continue
			}
			patched, err := applyPatch(o.Object, ops)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			o.Object = patched
		}
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		default:
			continue
		}
		if n := o.GetName(); n == "mutating-webhook-configuration" || n == "validating-webhook-configuration" {
			o.SetName(operator + "-" + n)
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		var kept []any
		for _, h := range hooks {
			hm, ok := h.(map[string]any)
			if !ok {
				continue
			}
			if !webhookKept(hm, keep) {
				continue
			}
			cc, _ := hm["clientConfig"].(map[string]any)
			svc, _ := cc["service"].(map[string]any)
			p, _ := svc["path"].(string)
			hm["clientConfig"] = map[string]any{
				"url":      "https://127.0.0.1:" + strconv.Itoa(port) + p,
				"caBundle": caPEM,
			}
			kept = append(kept, hm)
		}
		if len(kept) == 0 {
			continue
		}
		// caBundle is []byte: round-trip through JSON so it is base64 like the API's.
		if err := unstructured.SetNestedField(o.Object, toJSONValue(kept), "webhooks"); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func webhookKept(h map[string]any, keep func(string) bool) bool {
	rules, _ := h["rules"].([]any)
	for _, r := range rules {
		rm, _ := r.(map[string]any)
		res, _ := rm["resources"].([]any)
		for _, x := range res {
			if s, ok := x.(string); ok && keep(s) {
				return true
			}
		}
	}
	return false
}

func toJSONValue(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return v
	}
	return out
}

func decodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for i, doc := range strings.Split(string(data), "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}

// readPatch reads a kustomize JSON-patch (RFC 6902) file, YAML or JSON.
func readPatch(path string) (jsonpatch.Patch, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := utilyaml.ToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	patch, err := jsonpatch.DecodePatch(js)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return patch, nil
}

// applyPatch applies a JSON patch to an object with the library the API server
// uses for JSON patches; an operation that cannot apply is an error.
func applyPatch(doc map[string]any, patch jsonpatch.Patch) (map[string]any, error) {
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	js, err = patch.Apply(js)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(js, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// crdFiles lists an operator's CRD manifests.
func crdFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}
