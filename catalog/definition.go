package catalog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
)

// Envelopes in which a Workload Map definition is accepted; they share the spec.
var (
	EnvelopeKarta              = schema.GroupVersionKind{Group: "run.ai", Version: "v1alpha1", Kind: "Karta"}
	EnvelopeResourceInterface  = schema.GroupVersionKind{Group: "optimization.nvidia.com", Version: "v1alpha1", Kind: "ResourceInterface"}
	EnvelopeWorkloadDefinition = v1alpha1.SchemeGroupVersion.WithKind("WorkloadDefinition")
)

// AnnotationRoles sets the roles of components in a definition, as a comma-separated
// list of name=role, where name is a component name or an instance id and role is
// leader, worker or service. It is tessera's only addition to the format, and an
// annotation so that the spec stays readable by other Workload Map consumers.
const AnnotationRoles = "catalog.tessera.dev/roles"

// Source of a definition.
const (
	SourceBuiltin = "builtin"
	SourceFile    = "file"
	SourceCluster = "cluster"
)

// Definition is one parsed (not yet compiled) Workload Map definition.
type Definition struct {
	Name   string
	Source string
	// File it came from (for built-ins, the embedded file name).
	File string
	// Doc is the 1-based index of the YAML document in File.
	Doc         int
	Envelope    schema.GroupVersionKind
	Annotations map[string]string
	Spec        v1alpha1.WorkloadMapSpec
}

// Ref is the reference recorded in mapped workloads.
func (d *Definition) Ref() DefinitionRef {
	ref := DefinitionRef{Name: d.Name, Source: d.Source}
	if d.Source == SourceFile {
		ref.File = d.File
	}
	return ref
}

// RootGVK is the kind the definition reads.
func (d *Definition) RootGVK() schema.GroupVersionKind {
	k := d.Spec.StructureDefinition.RootComponent.Kind
	if k == nil {
		return schema.GroupVersionKind{}
	}
	return schema.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind}
}

// envelope is what every accepted document decodes into; strict decoding makes a
// misspelt field an error that names it.
type envelope struct {
	APIVersion string                   `json:"apiVersion"`
	Kind       string                   `json:"kind"`
	Metadata   metav1.ObjectMeta        `json:"metadata"`
	Spec       v1alpha1.WorkloadMapSpec `json:"spec"`
	// Status of a WorkloadDefinition exported from a cluster is ignored.
	Status map[string]any `json:"status,omitempty"`
}

// Error is a bad definition or a failed evaluation; it names where.
type Error struct {
	File       string
	Doc        int
	Definition string
	// Field of the definition (e.g. "childComponents[worker].scaleDefinition.replicasPath").
	Field      string
	Expression string
	// Object the expression was evaluated on ("Kind namespace/name"), if any.
	Object string
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	sep := func() {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
	}
	if e.File != "" {
		b.WriteString(e.File)
	}
	if e.Doc > 0 {
		sep()
		fmt.Fprintf(&b, "document %d", e.Doc)
	}
	if e.Object != "" {
		sep()
		b.WriteString(e.Object)
	}
	if e.Definition != "" {
		sep()
		fmt.Fprintf(&b, "definition %q", e.Definition)
	}
	if e.Field != "" {
		sep()
		b.WriteString(e.Field)
	}
	if e.Expression != "" {
		sep()
		fmt.Fprintf(&b, "expression %q", e.Expression)
	}
	sep()
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// SplitDocuments splits a multi-document YAML (or JSON) stream. Empty documents
// keep their index, so that errors name the document as an editor counts them.
func SplitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		docs = append(docs, doc)
	}
}

func isEmptyDocument(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' || string(t) == "---" {
			continue
		}
		return false
	}
	return true
}

// ParseDefinitions parses every document of data as a definition. file names the
// source in errors and names definitions without metadata.name.
func ParseDefinitions(data []byte, file, source string) ([]*Definition, error) {
	docs, err := SplitDocuments(data)
	if err != nil {
		return nil, &Error{File: file, Err: err}
	}
	var defs []*Definition
	unnamed := 0
	for i, doc := range docs {
		if isEmptyDocument(doc) {
			continue
		}
		d, err := parseDefinition(doc, file, i+1, source)
		if err != nil {
			return nil, err
		}
		if d.Name == "" {
			unnamed++
			d.Name = nameFromFile(file)
			if unnamed > 1 {
				d.Name = fmt.Sprintf("%s-%d", d.Name, i+1)
			}
		}
		defs = append(defs, d)
	}
	return defs, nil
}

func nameFromFile(file string) string {
	base := filepath.Base(file)
	return strings.TrimSuffix(base, filepath.Ext(base))
}

func parseDefinition(doc []byte, file string, index int, source string) (*Definition, error) {
	fail := func(err error) error { return &Error{File: file, Doc: index, Err: err} }
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fail(fmt.Errorf("not a YAML object: %w", err))
	}
	gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
	switch gvk {
	case EnvelopeKarta, EnvelopeResourceInterface, EnvelopeWorkloadDefinition:
	default:
		return nil, fail(fmt.Errorf("apiVersion %q kind %q is not a definition (want %s, %s or %s)",
			tm.APIVersion, tm.Kind, gvkString(EnvelopeKarta), gvkString(EnvelopeResourceInterface), gvkString(EnvelopeWorkloadDefinition)))
	}
	var env envelope
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fail(fmt.Errorf("not a YAML object: %w", err))
	}
	// Strict decoding names a misspelt or unknown field by its full path.
	strict, err := kjson.UnmarshalStrict(js, &env)
	if err != nil {
		return nil, &Error{File: file, Doc: index, Definition: env.Metadata.Name, Err: err}
	}
	if len(strict) > 0 {
		return nil, &Error{File: file, Doc: index, Definition: env.Metadata.Name, Err: errors.Join(strict...)}
	}
	return &Definition{
		Name:        env.Metadata.Name,
		Source:      source,
		File:        file,
		Doc:         index,
		Envelope:    gvk,
		Annotations: env.Metadata.Annotations,
		Spec:        env.Spec,
	}, nil
}

func gvkString(gvk schema.GroupVersionKind) string {
	return gvk.GroupVersion().String() + " " + gvk.Kind
}

// LoadDefinitionFiles reads definitions from files and directories (every *.yaml,
// *.yml and *.json file below a directory, in lexical order).
func LoadDefinitionFiles(paths ...string) ([]*Definition, error) {
	var defs []*Definition
	for _, p := range paths {
		files, err := expandPath(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("reading definitions: %w", err)
			}
			ds, err := ParseDefinitions(data, f, SourceFile)
			if err != nil {
				return nil, err
			}
			defs = append(defs, ds...)
		}
	}
	return defs, nil
}

// expandPath lists the YAML and JSON files of a path (the path itself if it is a file).
func expandPath(p string) ([]string, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", p, err)
	}
	sort.Strings(files)
	return files, nil
}

// ExpandPath lists the YAML and JSON files of a file or directory, for callers that
// read manifests the same way definitions are read.
func ExpandPath(p string) ([]string, error) { return expandPath(p) }

// DefinitionFromObject reads a WorkloadDefinition object from the cluster.
func DefinitionFromObject(u *unstructured.Unstructured) (*Definition, error) {
	data, err := u.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("WorkloadDefinition %s: %w", u.GetName(), err)
	}
	d, err := parseDefinition(data, "WorkloadDefinition "+u.GetName(), 0, SourceCluster)
	if err != nil {
		return nil, err
	}
	return d, nil
}
