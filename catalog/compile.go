package catalog

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
)

type specForm int

const (
	specNone specForm = iota
	specTemplate
	specPodSpec
	specFragments
)

// compiled is a definition with every expression compiled and the component tree built.
type compiled struct {
	def    *Definition
	gvk    schema.GroupVersionKind
	comps  []*component // root first, then children in definition order
	byName map[string]*component
	status *statusDef
	groups []*podGroup
	roles  map[string]Role
	// ownerKinds are the kinds between the workload and its pods.
	ownerKinds []schema.GroupVersionKind
	// podMetaOnly: every pod-side expression reads only pod metadata.
	podMetaOnly bool
}

type component struct {
	name     string
	field    string
	kind     *schema.GroupVersionKind
	parent   *component
	children []*component

	form                       specForm
	template, podSpec, meta    *expr
	frag                       fragments
	replicas, minRep, maxRep   *expr
	stage, gangKey             *expr
	instanceID                 *expr
	typeSel                    *expr
	typeValue                  *string
	instSel                    *expr
	replicaSel                 *expr
	instKeys, replicaKeys      []string
	hasSpec, hasScale, podLeaf bool
}

type fragments struct {
	schedulerName, labels, annotations, resources, claims, podAffinity, nodeAffinity,
	containers, container, priorityClass, image *expr
}

type podGroup struct {
	name    string
	members []*member
	// split says how the group divides into gangs: per replica of splitComp (a
	// component with children), per instance of splitComp, or not at all.
	split     splitMode
	splitComp *component
}

type splitMode int

const (
	splitNone splitMode = iota
	splitReplica
	splitInstance
)

type member struct {
	comp    *component
	groupBy []*expr
	filters []*expr
}

// compile checks a definition and compiles its expressions.
func compile(d *Definition) (*compiled, error) {
	c, err := compileSpec(d)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.File, e.Doc, e.Definition = d.File, d.Doc, d.Name
			return nil, e
		}
		return nil, &Error{File: d.File, Doc: d.Doc, Definition: d.Name, Err: err}
	}
	return c, nil
}

func compileSpec(d *Definition) (*compiled, error) {
	sd := d.Spec.StructureDefinition
	c := &compiled{def: d, byName: map[string]*component{}}
	if sd.RootComponent.Kind == nil || sd.RootComponent.Kind.Kind == "" || sd.RootComponent.Kind.Version == "" {
		return nil, &Error{Field: "structureDefinition.rootComponent.kind", Err: errors.New("root component needs a kind with version and kind")}
	}
	c.gvk = d.RootGVK()
	root, err := compileComponent(&sd.RootComponent, "structureDefinition.rootComponent")
	if err != nil {
		return nil, err
	}
	if sd.RootComponent.OwnerRef != nil && *sd.RootComponent.OwnerRef != "" {
		return nil, &Error{Field: root.field + ".ownerRef", Err: errors.New("the root component has no owner")}
	}
	c.comps = append(c.comps, root)
	c.byName[root.name] = root
	for i := range sd.ChildComponents {
		cd := &sd.ChildComponents[i]
		field := fmt.Sprintf("structureDefinition.childComponents[%s]", cd.Name)
		if cd.Name == "" {
			field = fmt.Sprintf("structureDefinition.childComponents[%d]", i)
		}
		comp, err := compileComponent(cd, field)
		if err != nil {
			return nil, err
		}
		if _, dup := c.byName[comp.name]; dup {
			return nil, &Error{Field: field + ".name", Err: fmt.Errorf("component name %q is used twice", comp.name)}
		}
		c.comps = append(c.comps, comp)
		c.byName[comp.name] = comp
	}
	for i, comp := range c.comps[1:] {
		cd := &sd.ChildComponents[i]
		if cd.OwnerRef == nil || *cd.OwnerRef == "" {
			return nil, &Error{Field: comp.field + ".ownerRef", Err: errors.New("a child component needs ownerRef")}
		}
		parent, ok := c.byName[*cd.OwnerRef]
		if !ok {
			return nil, &Error{Field: comp.field + ".ownerRef", Err: fmt.Errorf("no component named %q", *cd.OwnerRef)}
		}
		comp.parent = parent
		parent.children = append(parent.children, comp)
	}
	// Every child must reach the root: a cycle among children would not.
	for _, comp := range c.comps[1:] {
		seen := map[*component]bool{}
		for p := comp; p != root; p = p.parent {
			if seen[p] {
				return nil, &Error{Field: comp.field + ".ownerRef", Err: errors.New("ownerRef chain forms a cycle")}
			}
			seen[p] = true
		}
	}
	for _, comp := range c.comps {
		isPodKind := comp.kind != nil && comp.kind.Group == "" && comp.kind.Kind == "Pod"
		comp.podLeaf = len(comp.children) == 0 && (comp.hasSpec || isPodKind)
	}

	if root.name == "" {
		return nil, &Error{Field: root.field + ".name", Err: errors.New("name is required")}
	}
	if sd.RootComponent.StatusDefinition != nil {
		s, err := compileStatus(sd.RootComponent.StatusDefinition, root.field+".statusDefinition")
		if err != nil {
			return nil, err
		}
		c.status = s
	}
	if gs := d.Spec.OptimizationInstructions.GangScheduling; gs != nil {
		for i, pg := range gs.PodGroups {
			g, err := compilePodGroup(c, &pg, i)
			if err != nil {
				return nil, err
			}
			c.groups = append(c.groups, g)
		}
	}
	c.podMetaOnly = true
	for _, e := range c.podExprs() {
		if !readsOnlyMetadata(e.src) {
			c.podMetaOnly = false
		}
	}
	roles, err := parseRoles(d.Annotations[AnnotationRoles])
	if err != nil {
		return nil, &Error{Field: "metadata.annotations[" + AnnotationRoles + "]", Err: err}
	}
	c.roles = roles

	seen := map[schema.GroupVersionKind]bool{}
	addKind := func(k schema.GroupVersionKind) {
		if k.Kind == "" || k.Version == "" || (k.Group == "" && k.Kind == "Pod") || seen[k] {
			return
		}
		seen[k] = true
		c.ownerKinds = append(c.ownerKinds, k)
	}
	for _, comp := range c.comps[1:] {
		if comp.kind != nil {
			addKind(*comp.kind)
		}
	}
	for _, k := range sd.AdditionalChildKinds {
		addKind(schema.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind})
	}
	return c, nil
}

func compileComponent(cd *v1alpha1.ComponentDefinition, field string) (*component, error) {
	if cd.Name == "" {
		return nil, &Error{Field: field + ".name", Err: errors.New("name is required")}
	}
	comp := &component{name: cd.Name, field: field}
	if cd.Kind != nil {
		k := schema.GroupVersionKind{Group: cd.Kind.Group, Version: cd.Kind.Version, Kind: cd.Kind.Kind}
		comp.kind = &k
	}
	var err error
	opt := func(src *string, name string) *expr {
		if err != nil {
			return nil
		}
		var e *expr
		e, err = compileOptional(src, field+"."+name)
		return e
	}
	if sd := cd.SpecDefinition; sd != nil {
		forms := 0
		if sd.PodTemplateSpecPath != nil {
			forms++
			comp.form = specTemplate
			comp.template = opt(sd.PodTemplateSpecPath, "specDefinition.podTemplateSpecPath")
		}
		if sd.PodSpecPath != nil {
			forms++
			comp.form = specPodSpec
			comp.podSpec = opt(sd.PodSpecPath, "specDefinition.podSpecPath")
			comp.meta = opt(sd.MetadataPath, "specDefinition.metadataPath")
		} else if sd.MetadataPath != nil {
			return nil, &Error{Field: field + ".specDefinition.metadataPath", Err: errors.New("metadataPath is only allowed with podSpecPath")}
		}
		if f := sd.FragmentedPodSpecDefinition; f != nil {
			forms++
			comp.form = specFragments
			p := field + ".specDefinition.fragmentedPodSpecDefinition."
			comp.frag = fragments{
				schedulerName: opt(f.SchedulerNamePath, p[len(field)+1:]+"schedulerNamePath"),
				labels:        opt(f.LabelsPath, p[len(field)+1:]+"labelsPath"),
				annotations:   opt(f.AnnotationsPath, p[len(field)+1:]+"annotationsPath"),
				resources:     opt(f.ResourcesPath, p[len(field)+1:]+"resourcesPath"),
				claims:        opt(f.ResourceClaimsPath, p[len(field)+1:]+"resourceClaimsPath"),
				podAffinity:   opt(f.PodAffinityPath, p[len(field)+1:]+"podAffinityPath"),
				nodeAffinity:  opt(f.NodeAffinityPath, p[len(field)+1:]+"nodeAffinityPath"),
				containers:    opt(f.ContainersPath, p[len(field)+1:]+"containersPath"),
				container:     opt(f.ContainerPath, p[len(field)+1:]+"containerPath"),
				priorityClass: opt(f.PriorityClassNamePath, p[len(field)+1:]+"priorityClassNamePath"),
				image:         opt(f.ImagePath, p[len(field)+1:]+"imagePath"),
			}
		}
		if forms != 1 {
			return nil, &Error{Field: field + ".specDefinition", Err: errors.New("set exactly one of podTemplateSpecPath, podSpecPath or fragmentedPodSpecDefinition")}
		}
		comp.hasSpec = forms == 1
	}
	if sc := cd.ScaleDefinition; sc != nil {
		comp.replicas = opt(sc.ReplicasPath, "scaleDefinition.replicasPath")
		comp.minRep = opt(sc.MinReplicasPath, "scaleDefinition.minReplicasPath")
		comp.maxRep = opt(sc.MaxReplicasPath, "scaleDefinition.maxReplicasPath")
		comp.hasScale = comp.replicas != nil || comp.minRep != nil || comp.maxRep != nil
	}
	comp.instanceID = opt(cd.InstanceIdPath, "instanceIdPath")
	if st := cd.StartupDefinition; st != nil {
		comp.stage = opt(st.StagePath, "startupDefinition.stagePath")
	}
	comp.gangKey = opt(cd.GangKeyPath, "gangKeyPath")
	if ps := cd.PodSelector; ps != nil {
		if ts := ps.ComponentTypeSelector; ts != nil {
			comp.typeSel = opt(&ts.KeyPath, "podSelector.componentTypeSelector.keyPath")
			comp.typeValue = ts.Value
		}
		if is := ps.ComponentInstanceSelector; is != nil {
			comp.instSel = opt(&is.IdPath, "podSelector.componentInstanceSelector.idPath")
			comp.instKeys = referencedKeys(is.IdPath)
		}
		if rs := ps.ReplicaSelector; rs != nil {
			comp.replicaSel = opt(&rs.KeyPath, "podSelector.replicaSelector.keyPath")
			comp.replicaKeys = referencedKeys(rs.KeyPath)
		}
	}
	if err != nil {
		return nil, err
	}
	return comp, nil
}

func compilePodGroup(c *compiled, pg *v1alpha1.PodGroupDefinition, index int) (*podGroup, error) {
	field := fmt.Sprintf("optimizationInstructions.gangScheduling.podGroups[%s]", pg.Name)
	if pg.Name == "" {
		return nil, &Error{Field: fmt.Sprintf("optimizationInstructions.gangScheduling.podGroups[%d].name", index), Err: errors.New("name is required")}
	}
	if len(pg.Members) == 0 {
		return nil, &Error{Field: field + ".members", Err: errors.New("a pod group needs members")}
	}
	g := &podGroup{name: pg.Name}
	keys := map[string]bool{}
	for i, m := range pg.Members {
		mf := fmt.Sprintf("%s.members[%d]", field, i)
		comp, ok := c.byName[m.ComponentName]
		if !ok {
			return nil, &Error{Field: mf + ".componentName", Err: fmt.Errorf("no component named %q", m.ComponentName)}
		}
		mem := &member{comp: comp}
		for j, src := range m.GroupByKeyPaths {
			e, err := compileExpr(src, fmt.Sprintf("%s.groupByKeyPaths[%d]", mf, j))
			if err != nil {
				return nil, err
			}
			mem.groupBy = append(mem.groupBy, e)
			for _, k := range referencedKeys(src) {
				keys[k] = true
			}
		}
		for j, src := range m.Filters {
			e, err := compileExpr(src, fmt.Sprintf("%s.filters[%d]", mf, j))
			if err != nil {
				return nil, err
			}
			mem.filters = append(mem.filters, e)
		}
		g.members = append(g.members, mem)
	}
	hit := func(ks []string) bool {
		for _, k := range ks {
			if keys[k] {
				return true
			}
		}
		return false
	}
	// A replica split needs a component whose replicas are groups of pods (one with
	// children): a member, or an ancestor of one. A replica label on a pod-level
	// component names a group the definition does not model, so it does not split.
	for _, m := range g.members {
		for p := m.comp; p != nil; p = p.parent {
			if len(p.children) > 0 && hit(p.replicaKeys) {
				g.split, g.splitComp = splitReplica, p
				return g, nil
			}
		}
	}
	for _, m := range g.members {
		if m.comp.instanceID != nil && hit(m.comp.instKeys) {
			g.split, g.splitComp = splitInstance, m.comp
			return g, nil
		}
	}
	return g, nil
}

func parseRoles(s string) (map[string]Role, error) {
	roles := map[string]Role{}
	if strings.TrimSpace(s) == "" {
		return roles, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, role, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q is not name=role", part)
		}
		switch r := Role(strings.TrimSpace(role)); r {
		case RoleLeader, RoleWorker, RoleService:
			roles[strings.TrimSpace(name)] = r
		default:
			return nil, fmt.Errorf("role %q of %q is not leader, worker or service", role, name)
		}
	}
	return roles, nil
}

// podExprs lists the expressions evaluated on pods.
func (c *compiled) podExprs() []*expr {
	var out []*expr
	for _, comp := range c.comps {
		for _, e := range []*expr{comp.typeSel, comp.instSel, comp.replicaSel} {
			if e != nil {
				out = append(out, e)
			}
		}
	}
	for _, g := range c.groups {
		for _, m := range g.members {
			out = append(out, m.groupBy...)
			out = append(out, m.filters...)
		}
	}
	return out
}
