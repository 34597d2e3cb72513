package catalog

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ErrUnknownKind is returned (wrapped) by Map for an object whose kind has no definition.
var ErrUnknownKind = errors.New("no definition for this kind")

// EvaluationTimeout bounds the jq evaluation of one object, so that a definition
// with a runaway expression cannot stall the scheduler.
var EvaluationTimeout = 2 * time.Second

// Catalog holds the definitions in force, compiled once; it is safe for
// concurrent use.
type Catalog struct {
	byGVK map[schema.GroupVersionKind]*compiled
	order []*compiled
	// overridden are built-in definitions replaced by a user definition.
	overridden []*Definition
	// walk holds the kinds a pod's owner walk passes through: mapped and
	// intermediate kinds.
	walk map[schema.GroupVersionKind]bool
}

// Option configures New.
type Option func(*options)

type options struct{ noBuiltins bool }

// WithoutBuiltins leaves the built-in definitions out.
func WithoutBuiltins() Option { return func(o *options) { o.noBuiltins = true } }

// New builds a catalog from the built-in definitions and the given user definitions.
// A user definition for the kind of a built-in one replaces it; two user
// definitions for one kind are an error naming both.
func New(user []*Definition, opts ...Option) (*Catalog, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	c := &Catalog{byGVK: map[schema.GroupVersionKind]*compiled{}}
	if !o.noBuiltins {
		builtins, err := BuiltinDefinitions()
		if err != nil {
			return nil, err
		}
		for _, d := range builtins {
			cd, err := compile(d)
			if err != nil {
				return nil, fmt.Errorf("built-in definition: %w", err)
			}
			if prev, dup := c.byGVK[cd.gvk]; dup {
				return nil, fmt.Errorf("built-in definitions %q and %q both read %s", prev.def.Name, d.Name, cd.gvk)
			}
			c.byGVK[cd.gvk] = cd
		}
	}
	userSeen := map[schema.GroupVersionKind]*Definition{}
	for _, d := range user {
		cd, err := compile(d)
		if err != nil {
			return nil, err
		}
		if prev, dup := userSeen[cd.gvk]; dup {
			return nil, fmt.Errorf("definitions %q (%s) and %q (%s) both read %s", prev.Name, where(prev), d.Name, where(d), cd.gvk)
		}
		userSeen[cd.gvk] = d
		if prev, ok := c.byGVK[cd.gvk]; ok && prev.def.Source == SourceBuiltin {
			c.overridden = append(c.overridden, prev.def)
		}
		c.byGVK[cd.gvk] = cd
	}
	for _, cd := range c.byGVK {
		c.order = append(c.order, cd)
	}
	defer func() {
		c.walk = map[schema.GroupVersionKind]bool{}
		for _, k := range append(c.RootKinds(), c.IntermediateKinds()...) {
			c.walk[k] = true
		}
	}()
	sort.Slice(c.order, func(i, j int) bool {
		a, b := c.order[i].gvk, c.order[j].gvk
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Version < b.Version
	})
	return c, nil
}

func where(d *Definition) string {
	if d.File == "" {
		return d.Source
	}
	return d.File
}

// DefinitionInfo describes a definition in force.
type DefinitionInfo struct {
	GVK        schema.GroupVersionKind
	Definition DefinitionRef
	// Overrides is set when this definition replaces a built-in one.
	Overrides string
}

// Definitions lists the definitions in force, sorted by group and kind.
func (c *Catalog) Definitions() []DefinitionInfo {
	over := map[schema.GroupVersionKind]string{}
	for _, d := range c.overridden {
		over[d.RootGVK()] = d.Name
	}
	out := make([]DefinitionInfo, 0, len(c.order))
	for _, cd := range c.order {
		out = append(out, DefinitionInfo{GVK: cd.gvk, Definition: cd.def.Ref(), Overrides: over[cd.gvk]})
	}
	return out
}

// Overridden lists the built-in definitions replaced by user definitions.
func (c *Catalog) Overridden() []*Definition { return c.overridden }

// Knows reports whether the catalog has a definition for gvk.
func (c *Catalog) Knows(gvk schema.GroupVersionKind) bool {
	_, ok := c.byGVK[gvk]
	return ok
}

// Definition returns the definition in force for gvk.
func (c *Catalog) Definition(gvk schema.GroupVersionKind) (*Definition, bool) {
	cd, ok := c.byGVK[gvk]
	if !ok {
		return nil, false
	}
	return cd.def, true
}

// RootKinds lists the kinds the catalog maps.
func (c *Catalog) RootKinds() []schema.GroupVersionKind {
	out := make([]schema.GroupVersionKind, 0, len(c.order))
	for _, cd := range c.order {
		out = append(out, cd.gvk)
	}
	return out
}

// Walks reports whether a pod's owner walk goes through objects of gvk: a kind
// the catalog maps or one its definitions name between a workload and its pods.
func (c *Catalog) Walks(gvk schema.GroupVersionKind) bool { return c.walk[gvk] }

// IntermediateKinds lists the kinds that definitions name between a workload and
// its pods (component kinds and additionalChildKinds) and that no definition maps
// itself; a pod resolver watches them to walk owner references.
func (c *Catalog) IntermediateKinds() []schema.GroupVersionKind {
	seen := map[schema.GroupVersionKind]bool{}
	var out []schema.GroupVersionKind
	for _, cd := range c.order {
		for _, k := range cd.ownerKinds {
			if c.Knows(k) || seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// Map maps obj with the definition for its kind.
func (c *Catalog) Map(obj *unstructured.Unstructured) (*Workload, error) {
	return c.MapWithClaims(context.Background(), obj, nil)
}

// MapWithClaims maps obj, counting the GPUs of DRA claims that claims resolves.
func (c *Catalog) MapWithClaims(ctx context.Context, obj *unstructured.Unstructured, claims ClaimLookup) (*Workload, error) {
	if obj == nil {
		return nil, errors.New("no object")
	}
	gvk := obj.GroupVersionKind()
	cd, ok := c.byGVK[gvk]
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", gvk.GroupVersion().String(), gvk.Kind, ErrUnknownKind)
	}
	ctx, cancel := context.WithTimeout(ctx, EvaluationTimeout)
	defer cancel()
	w, _, err := cd.mapObject(ctx, obj, claims)
	return w, err
}

func objectRef(obj *unstructured.Unstructured) string {
	ns := obj.GetNamespace()
	if ns != "" {
		ns += "/"
	}
	return obj.GetKind() + " " + ns + obj.GetName()
}

func (cd *compiled) mapObject(ctx context.Context, obj *unstructured.Unstructured, claims ClaimLookup) (*Workload, *mapping, error) {
	fail := func(err error) error {
		var e *Error
		if errors.As(err, &e) {
			cp := *e
			cp.Definition, cp.Object = cd.def.Name, objectRef(obj)
			if cd.def.Source == SourceFile {
				cp.File, cp.Doc = cd.def.File, cd.def.Doc
			}
			return &cp
		}
		return &Error{Definition: cd.def.Name, Object: objectRef(obj), Err: err}
	}
	content := normalize(obj.Object).(map[string]any)
	m, err := cd.evaluate(ctx, content, obj.GetNamespace(), claims)
	if err != nil {
		return nil, nil, fail(err)
	}
	w := &Workload{
		APIVersion: obj.GetAPIVersion(),
		Kind:       obj.GetKind(),
		Name:       obj.GetName(),
		Namespace:  obj.GetNamespace(),
		UID:        obj.GetUID(),
		Definition: cd.def.Ref(),
		Components: []Component{},
		Gangs:      []Gang{},
	}
	if w.Name == "" {
		w.GenerateName = obj.GetGenerateName()
	}
	for _, comp := range cd.comps {
		for _, in := range m.instances[comp] {
			in.display = comp.name
			if in.id != "" && comp.instanceID != nil {
				in.display = in.id
			} else if in.id != "" {
				in.display = comp.name + "-" + in.id
			}
		}
	}
	gangs, inGang, err := cd.gangs(ctx, m)
	if err != nil {
		return nil, nil, fail(err)
	}
	if gangs != nil {
		w.Gangs = gangs
	}
	// Pods naming one ResourceClaim share its devices: count them once per
	// workload, and give each pod its share of the claim's units.
	sharers := map[string]int64{}
	for _, comp := range cd.comps {
		if !comp.podLeaf {
			continue
		}
		for _, in := range m.instances[comp] {
			for _, sc := range in.demand.shared {
				sharers[sc.name] += in.replicas
			}
		}
	}
	type sharedUse struct {
		claim          sharedClaim
		pods, min, max int64
	}
	shared := map[string]*sharedUse{}
	var sharedOrder []string
	for i, comp := range cd.comps {
		if i == 0 && !comp.podLeaf {
			continue
		}
		for _, in := range m.instances[comp] {
			anyInGang := inGang[in]
			if !comp.podLeaf {
				for _, l := range m.leaves(comp) {
					anyInGang = anyInGang || inGang[l]
				}
			}
			min := in.replicas
			if in.hasMin {
				min = in.min
			}
			perPod, perPodUnits := in.demand.gpus, in.demand.units
			for _, sc := range in.demand.shared {
				perPod += sc.gpus
				if n := sharers[sc.name]; n > 0 {
					perPodUnits += sc.units / float64(n)
				}
			}
			wc := Component{
				Name:             in.display,
				Component:        comp.name,
				Instance:         in.id,
				Role:             cd.role(in, anyInGang),
				PodBearing:       comp.podLeaf,
				Replicas:         in.replicas,
				MinReplicas:      min,
				MaxReplicas:      in.max,
				GPUsPerPod:       perPod,
				GPUUnitsPerPod:   perPodUnits,
				Stage:            in.stage,
				GangKey:          in.gangKey,
				UnresolvedClaims: in.demand.unresolved,
				PodTemplate:      in.template,
			}
			if comp.parent != nil {
				wc.Parent = comp.parent.name
			}
			if comp.kind != nil {
				wc.Kind = comp.kind.Kind
			}
			w.Components = append(w.Components, wc)
			if !comp.podLeaf {
				continue
			}
			w.Pods += in.replicas
			w.MinPods += min
			w.MaxPods += in.max
			d := in.demand
			w.GPUs += float64(in.replicas) * d.gpus
			w.MinGPUs += float64(min) * d.gpus
			w.MaxGPUs += float64(in.max) * d.gpus
			w.GPUUnits += float64(in.replicas) * d.units
			w.MinGPUUnits += float64(min) * d.units
			w.MaxGPUUnits += float64(in.max) * d.units
			for _, sc := range d.shared {
				u, ok := shared[sc.name]
				if !ok {
					u = &sharedUse{claim: sc}
					shared[sc.name] = u
					sharedOrder = append(sharedOrder, sc.name)
				}
				u.pods += in.replicas
				u.min += min
				u.max += in.max
			}
		}
	}
	for _, name := range sharedOrder {
		u := shared[name]
		once := func(pods int64) float64 {
			if pods > 0 {
				return 1
			}
			return 0
		}
		w.GPUs += once(u.pods) * u.claim.gpus
		w.MinGPUs += once(u.min) * u.claim.gpus
		w.MaxGPUs += once(u.max) * u.claim.gpus
		w.GPUUnits += once(u.pods) * u.claim.units
		w.MinGPUUnits += once(u.min) * u.claim.units
		w.MaxGPUUnits += once(u.max) * u.claim.units
	}
	st, msg, err := cd.status.evaluate(ctx, content)
	if err != nil {
		return nil, nil, fail(err)
	}
	w.Status, w.StatusMessage = st, msg
	return w, m, nil
}

// String renders a GVK as "group/version Kind" ("v1 Pod" for the core group).
func GVKString(gvk schema.GroupVersionKind) string {
	return strings.TrimSpace(gvk.GroupVersion().String() + " " + gvk.Kind)
}
