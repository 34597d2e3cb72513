package catalog

import (
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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
type StaticClaims struct {
	templates map[string]*resourcev1.ResourceClaimTemplate
	claims    map[string]*resourcev1.ResourceClaim
}

// NewStaticClaims collects the resource.k8s.io/v1 claims and templates among objs.
// A claim object that does not decode is an error naming it.
func NewStaticClaims(objs []*unstructured.Unstructured) (*StaticClaims, error) {
	s := &StaticClaims{templates: map[string]*resourcev1.ResourceClaimTemplate{}, claims: map[string]*resourcev1.ResourceClaim{}}
	for _, o := range objs {
		if o.GetAPIVersion() != resourcev1.SchemeGroupVersion.String() {
			continue
		}
		key := o.GetNamespace() + "/" + o.GetName()
		switch o.GetKind() {
		case "ResourceClaimTemplate":
			var t resourcev1.ResourceClaimTemplate
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &t); err != nil {
				return nil, fmt.Errorf("ResourceClaimTemplate %s: %w", key, err)
			}
			s.templates[key] = &t
		case "ResourceClaim":
			var c resourcev1.ResourceClaim
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &c); err != nil {
				return nil, fmt.Errorf("ResourceClaim %s: %w", key, err)
			}
			s.claims[key] = &c
		}
	}
	return s, nil
}

// ResourceClaimTemplate implements ClaimLookup.
func (s *StaticClaims) ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool) {
	t, ok := s.templates[namespace+"/"+name]
	return t, ok
}

// ResourceClaim implements ClaimLookup.
func (s *StaticClaims) ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool) {
	c, ok := s.claims[namespace+"/"+name]
	return c, ok
}

// IsUnknownKind tells whether err says an object's kind has no definition.
func IsUnknownKind(err error) bool { return errors.Is(err, ErrUnknownKind) }
