package catalog

import (
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// Document is one object of a manifest file.
type Document struct {
	File string
	// Index is the 1-based document number in File.
	Index  int
	Object *unstructured.Unstructured
}

// ParseManifests reads every object of a (multi-document) YAML or JSON manifest.
// A List is expanded into its items. Errors name the file and the document.
func ParseManifests(data []byte, file string) ([]Document, error) {
	docs, err := SplitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []Document
	for i, doc := range docs {
		if isEmptyDocument(doc) {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%s: document %d: not YAML: %w", file, i+1, err)
		}
		if obj == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("%s: document %d: not a Kubernetes object: apiVersion and kind are required", file, i+1)
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
			}
			for j := range list.Items {
				out = append(out, Document{File: file, Index: i + 1, Object: &list.Items[j]})
			}
			continue
		}
		out = append(out, Document{File: file, Index: i + 1, Object: u})
	}
	return out, nil
}

// StaticClaims resolves claims and templates from a fixed set of objects (the
// ResourceClaims and ResourceClaimTemplates found next to a workload in its files).
// Objects without a namespace are in "default", as kubectl applies them.
type StaticClaims struct {
	templates map[string]*resourcev1.ResourceClaimTemplate
	claims    map[string]*resourcev1.ResourceClaim
	gpuMemory *resource.Quantity
}

// SetGPUMemory sets the memory of one GPU, to count requests for a share of a
// GPU's memory in GPU units (see GPUMemoryLookup); nil leaves them unresolved.
func (s *StaticClaims) SetGPUMemory(q *resource.Quantity) { s.gpuMemory = q }

// NewStaticClaims collects the claims and templates among objs, in any served
// DRA version (resource.k8s.io v1, v1beta2, v1beta1). A claim object that does not
// decode is an error naming it.
func NewStaticClaims(objs []*unstructured.Unstructured) (*StaticClaims, error) {
	s := &StaticClaims{templates: map[string]*resourcev1.ResourceClaimTemplate{}, claims: map[string]*resourcev1.ResourceClaim{}}
	for _, o := range objs {
		gv, err := schema.ParseGroupVersion(o.GetAPIVersion())
		if err != nil || gv.Group != resourcev1.GroupName {
			continue
		}
		var specPath []string
		switch o.GetKind() {
		case "ResourceClaimTemplate":
			specPath = []string{"spec", "spec", "devices", "requests"}
		case "ResourceClaim":
			specPath = []string{"spec", "devices", "requests"}
		default:
			continue
		}
		key := namespaceOrDefault(o.GetNamespace()) + "/" + o.GetName()
		content := o.DeepCopy().Object
		switch gv.Version {
		case "v1", "v1beta2":
			// v1beta2's claim spec is v1's, field for field.
		case "v1beta1":
			if err := requestsToV1(content, specPath); err != nil {
				return nil, fmt.Errorf("%s %s (%s): %w", o.GetKind(), key, gv.Version, err)
			}
		default:
			continue
		}
		switch o.GetKind() {
		case "ResourceClaimTemplate":
			var t resourcev1.ResourceClaimTemplate
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content, &t); err != nil {
				return nil, fmt.Errorf("ResourceClaimTemplate %s: %w", key, err)
			}
			s.templates[key] = &t
		case "ResourceClaim":
			var c resourcev1.ResourceClaim
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content, &c); err != nil {
				return nil, fmt.Errorf("ResourceClaim %s: %w", key, err)
			}
			s.claims[key] = &c
		}
	}
	return s, nil
}

// requestsToV1 rewrites v1beta1 device requests as v1 ones: v1beta1 keeps an
// exact request's fields (deviceClassName, selectors, allocationMode, count,
// adminAccess, tolerations, capacity) on the request itself, v1 under
// "exactly"; prioritized lists (firstAvailable) have the same shape in both.
func requestsToV1(obj map[string]any, path []string) error {
	reqs, found, err := unstructured.NestedSlice(obj, path...)
	if err != nil || !found {
		return err
	}
	for i, r := range reqs {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		if _, ok := m["firstAvailable"]; ok {
			continue
		}
		exactly := map[string]any{}
		for k, v := range m {
			if k != "name" {
				exactly[k] = v
				delete(m, k)
			}
		}
		m["exactly"] = exactly
		reqs[i] = m
	}
	return unstructured.SetNestedSlice(obj, reqs, path...)
}

func namespaceOrDefault(ns string) string {
	if ns == "" {
		return metav1.NamespaceDefault
	}
	return ns
}

// ResourceClaimTemplate implements ClaimLookup.
func (s *StaticClaims) ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool) {
	t, ok := s.templates[namespaceOrDefault(namespace)+"/"+name]
	return t, ok
}

// ResourceClaim implements ClaimLookup.
func (s *StaticClaims) ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool) {
	c, ok := s.claims[namespaceOrDefault(namespace)+"/"+name]
	return c, ok
}

// GPUMemory implements GPUMemoryLookup.
func (s *StaticClaims) GPUMemory() (*resource.Quantity, bool) {
	return s.gpuMemory, s.gpuMemory != nil
}

// IsUnknownKind tells whether err says an object's kind has no definition.
func IsUnknownKind(err error) bool { return errors.Is(err, ErrUnknownKind) }
