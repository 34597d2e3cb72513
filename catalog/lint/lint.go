// Package lint checks Workload Map definitions against the OpenAPI schema of the
// CustomResourceDefinition of the kind they read: every object path an expression
// reads must exist in the schema. It is the check to run when an operator upgrade
// renames a field that a definition depends on.
package lint

import (
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
)

// Finding is one path the schema lacks.
type Finding struct {
	Definition string
	File       string
	Field      string
	Expression string
	// Path the expression reads, and Missing, the part of it the schema lacks.
	Path    string
	Missing string
	Reason  string
}

func (f Finding) String() string {
	where := f.Definition
	if f.File != "" {
		where = f.File + ": " + where
	}
	return fmt.Sprintf("%s: %s: expression %q reads %s: %s", where, f.Field, f.Expression, f.Path, f.Reason)
}

// Definition checks the object-side expressions of def (pod templates, scale,
// instance ids, status and suspend paths) against the CRD's schema of the
// definition's version. Pod-side expressions (selectors, groupByKeyPaths,
// filters) read pods and are not checked.
func Definition(def *catalog.Definition, crd *apiextensionsv1.CustomResourceDefinition) ([]Finding, error) {
	gvk := def.RootGVK()
	if crd.Spec.Group != gvk.Group || crd.Spec.Names.Kind != gvk.Kind {
		return nil, fmt.Errorf("definition %q reads %s, the CRD defines %s %s", def.Name, catalog.GVKString(gvk), crd.Spec.Group, crd.Spec.Names.Kind)
	}
	var sch *apiextensionsv1.JSONSchemaProps
	var versions []string
	for _, v := range crd.Spec.Versions {
		versions = append(versions, v.Name)
		if v.Name == gvk.Version && v.Schema != nil {
			sch = v.Schema.OpenAPIV3Schema
		}
	}
	if sch == nil {
		return nil, fmt.Errorf("definition %q reads version %s; the CRD has %s with a schema", def.Name, gvk.Version, strings.Join(versions, ", "))
	}
	var out []Finding
	for _, e := range objectExpressions(def.Spec) {
		paths, err := readPaths(e.src)
		if err != nil {
			return nil, fmt.Errorf("definition %q: %s: expression %q: %w", def.Name, e.field, e.src, err)
		}
		sort.Slice(paths, func(i, j int) bool { return paths[i].String() < paths[j].String() })
		reported := map[string]bool{}
		for _, p := range paths {
			missing, reason := check(sch, p)
			if reason == "" {
				continue
			}
			// Report the shortest missing prefix once: .spec.a.b and .spec.a.b.c
			// are one finding.
			if reported[missing] {
				continue
			}
			reported[missing] = true
			f := Finding{Definition: def.Name, Field: e.field, Expression: e.src, Path: p.String(), Missing: missing, Reason: reason}
			if def.Source == catalog.SourceFile {
				f.File = def.File
			}
			out = append(out, f)
		}
	}
	return out, nil
}

type namedExpr struct{ field, src string }

func objectExpressions(spec v1alpha1.WorkloadMapSpec) []namedExpr {
	var out []namedExpr
	add := func(field string, src *string) {
		if src != nil && *src != "" {
			out = append(out, namedExpr{field, *src})
		}
	}
	comps := append([]v1alpha1.ComponentDefinition{spec.StructureDefinition.RootComponent}, spec.StructureDefinition.ChildComponents...)
	for i, c := range comps {
		f := "structureDefinition.rootComponent"
		if i > 0 {
			f = "structureDefinition.childComponents[" + c.Name + "]"
		}
		if sd := c.SpecDefinition; sd != nil {
			add(f+".specDefinition.podTemplateSpecPath", sd.PodTemplateSpecPath)
			add(f+".specDefinition.podSpecPath", sd.PodSpecPath)
			add(f+".specDefinition.metadataPath", sd.MetadataPath)
			if fr := sd.FragmentedPodSpecDefinition; fr != nil {
				p := f + ".specDefinition.fragmentedPodSpecDefinition."
				add(p+"schedulerNamePath", fr.SchedulerNamePath)
				add(p+"labelsPath", fr.LabelsPath)
				add(p+"annotationsPath", fr.AnnotationsPath)
				add(p+"resourcesPath", fr.ResourcesPath)
				add(p+"resourceClaimsPath", fr.ResourceClaimsPath)
				add(p+"podAffinityPath", fr.PodAffinityPath)
				add(p+"nodeAffinityPath", fr.NodeAffinityPath)
				add(p+"containersPath", fr.ContainersPath)
				add(p+"containerPath", fr.ContainerPath)
				add(p+"priorityClassNamePath", fr.PriorityClassNamePath)
				add(p+"imagePath", fr.ImagePath)
			}
		}
		if sc := c.ScaleDefinition; sc != nil {
			add(f+".scaleDefinition.replicasPath", sc.ReplicasPath)
			add(f+".scaleDefinition.minReplicasPath", sc.MinReplicasPath)
			add(f+".scaleDefinition.maxReplicasPath", sc.MaxReplicasPath)
		}
		add(f+".instanceIdPath", c.InstanceIdPath)
		if st := c.StartupDefinition; st != nil {
			add(f+".startupDefinition.stagePath", st.StagePath)
		}
		add(f+".gangKeyPath", c.GangKeyPath)
		if st := c.StatusDefinition; st != nil {
			if st.PhaseDefinition != nil {
				add(f+".statusDefinition.phaseDefinition.path", &st.PhaseDefinition.Path)
			}
			if st.ConditionsDefinition != nil {
				add(f+".statusDefinition.conditionsDefinition.path", &st.ConditionsDefinition.Path)
			}
			m := st.StatusMappings
			for name, ms := range map[string][]v1alpha1.StatusMatcher{"initializing": m.Initializing, "pending": m.Pending, "progressing": m.Progressing,
				"running": m.Running, "completed": m.Completed, "failed": m.Failed, "degraded": m.Degraded, "suspended": m.Suspended,
				"suspending": m.Suspending, "resuming": m.Resuming} {
				for j, sm := range ms {
					if sm.ByExpression != nil {
						add(fmt.Sprintf("%s.statusDefinition.statusMappings.%s[%d].byExpression.expression", f, name, j), &sm.ByExpression.Expression)
					}
				}
			}
		}
		if sd := c.SuspendDefinition; sd != nil {
			for j := range sd.SuspendActions {
				add(fmt.Sprintf("%s.suspendDefinition.suspendActions[%d].path", f, j), &sd.SuspendActions[j].Path)
			}
			for j := range sd.ResumeActions {
				add(fmt.Sprintf("%s.suspendDefinition.resumeActions[%d].path", f, j), &sd.ResumeActions[j].Path)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].field < out[j].field })
	return out
}

// check walks p through the schema. It returns the missing prefix and why, or
// "" when the schema has the path (or allows any field there).
func check(s *apiextensionsv1.JSONSchemaProps, p path) (string, string) {
	if len(p) > 0 && (p[0] == "metadata" || p[0] == "apiVersion" || p[0] == "kind") {
		// Object metadata is not part of a CRD's schema.
		return "", ""
	}
	for i, seg := range p {
		if s == nil || open(s) {
			return "", ""
		}
		prefix := p[:i+1].String()
		switch seg {
		case "[]", "*":
			switch {
			case s.Items != nil && s.Items.Schema != nil:
				s = s.Items.Schema
			case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
				s = s.AdditionalProperties.Schema
			case s.Type == "array" || s.Type == "object":
				// Elements of an object with fixed properties: can't tell which.
				return "", ""
			default:
				return prefix, fmt.Sprintf("%s is a %s, not a list or map", p[:i].String(), s.Type)
			}
		default:
			if prop, ok := s.Properties[seg]; ok {
				s = &prop
				continue
			}
			if s.AdditionalProperties != nil && (s.AdditionalProperties.Allows || s.AdditionalProperties.Schema != nil) {
				s = s.AdditionalProperties.Schema
				continue
			}
			if s.Type == "array" {
				return prefix, fmt.Sprintf("%s is a list; it has no field %q", p[:i].String(), seg)
			}
			if s.Type != "" && s.Type != "object" {
				return prefix, fmt.Sprintf("%s is a %s; it has no field %q", p[:i].String(), s.Type, seg)
			}
			return prefix, fmt.Sprintf("the schema has no field %q at %s", seg, p[:i].String())
		}
	}
	return "", ""
}

// open tells whether a schema node accepts any field below it.
func open(s *apiextensionsv1.JSONSchemaProps) bool {
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields && len(s.Properties) == 0 {
		return true
	}
	return s.Type == "" && len(s.Properties) == 0 && s.Items == nil && s.AdditionalProperties == nil
}

// GVKOf is the kind a CRD defines in a version.
func GVKOf(crd *apiextensionsv1.CustomResourceDefinition, version string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: crd.Spec.Group, Version: version, Kind: crd.Spec.Names.Kind}
}
