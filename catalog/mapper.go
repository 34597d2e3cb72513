package catalog

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// instance is one instance of a component in a mapped object.
type instance struct {
	comp     *component
	id       string
	replicas int64
	min      int64
	hasMin   bool
	max      int64
	template map[string]any
	demand   podDemand
	stage    int64
	gangKey  string
	display  string
}

func (in *instance) minOrReplicas() int64 {
	if in.hasMin {
		return in.min
	}
	return in.replicas
}

// mapping is the result of evaluating a definition on one object.
type mapping struct {
	instances map[*component][]*instance
}

// evaluate runs every component's expressions on obj (normalized).
func (c *compiled) evaluate(ctx context.Context, obj map[string]any, namespace string, claims ClaimLookup) (*mapping, error) {
	m := &mapping{instances: map[*component][]*instance{}}
	for i, comp := range c.comps {
		ins, err := c.evalComponent(ctx, comp, i == 0, obj, namespace, claims)
		if err != nil {
			return nil, err
		}
		m.instances[comp] = ins
	}
	return m, nil
}

func (c *compiled) evalComponent(ctx context.Context, comp *component, isRoot bool, obj map[string]any, namespace string, claims ClaimLookup) ([]*instance, error) {
	all := func(e *expr) ([]any, error) {
		if e == nil {
			return nil, nil
		}
		return e.all(ctx, obj)
	}
	ids, err := all(comp.instanceID)
	if err != nil {
		return nil, err
	}
	templates, err := c.templates(ctx, comp, obj)
	if err != nil {
		return nil, err
	}
	reps, err := all(comp.replicas)
	if err != nil {
		return nil, err
	}
	mins, err := all(comp.minRep)
	if err != nil {
		return nil, err
	}
	maxs, err := all(comp.maxRep)
	if err != nil {
		return nil, err
	}
	stages, err := all(comp.stage)
	if err != nil {
		return nil, err
	}
	keys, err := all(comp.gangKey)
	if err != nil {
		return nil, err
	}
	n := 1
	switch {
	case isRoot:
	case comp.instanceID != nil:
		n = len(ids)
	case comp.hasSpec:
		n = len(templates)
	case comp.replicas != nil:
		n = len(reps)
	}
	var out []*instance
	for i := 0; i < n; i++ {
		in := &instance{comp: comp}
		if comp.instanceID != nil {
			if i < len(ids) {
				in.id = str(ids[i])
			}
			if in.id == "" {
				in.id = strconv.Itoa(i)
			}
		} else if n > 1 {
			in.id = strconv.Itoa(i)
		}
		if comp.hasSpec {
			if i < len(templates) {
				in.template = templates[i]
			}
			if in.template == nil {
				// The workload leaves this component out (e.g. no transformer).
				continue
			}
		}
		count := func(vals []any, e *expr) (int64, bool, error) {
			if i >= len(vals) || vals[i] == nil {
				return 0, false, nil
			}
			v, err := intValue(vals[i])
			if err != nil {
				return 0, false, e.wrap(err)
			}
			return v, true, nil
		}
		r, hasR, err := count(reps, comp.replicas)
		if err != nil {
			return nil, err
		}
		mn, hasMin, err := count(mins, comp.minRep)
		if err != nil {
			return nil, err
		}
		mx, hasMax, err := count(maxs, comp.maxRep)
		if err != nil {
			return nil, err
		}
		if in.stage, _, err = count(stages, comp.stage); err != nil {
			return nil, err
		}
		if i < len(keys) && keys[i] != nil {
			in.gangKey = str(keys[i])
		}
		switch {
		case hasR:
		case hasMin:
			// Without a replica count, a service runs at its minimum scale.
			r = mn
		default:
			r = 1
		}
		in.replicas, in.min, in.hasMin = r, mn, hasMin
		in.max = r
		if hasMax {
			in.max = mx
		}
		if in.template != nil {
			in.demand = demandOfTemplate(in.template, namespace, claims)
		}
		out = append(out, in)
	}
	return out, nil
}

// templates returns one pod template (as an object with metadata and spec) per
// value the component's spec definition yields; a nil entry means "absent".
func (c *compiled) templates(ctx context.Context, comp *component, obj map[string]any) ([]map[string]any, error) {
	switch comp.form {
	case specTemplate:
		vals, err := comp.template.all(ctx, obj)
		if err != nil {
			return nil, err
		}
		out := make([]map[string]any, len(vals))
		for i, v := range vals {
			t, ok := v.(map[string]any)
			if !ok && v != nil {
				return nil, comp.template.wrap(fmt.Errorf("expected a pod template object, got %s", jqType(v)))
			}
			out[i] = t
		}
		return out, nil
	case specPodSpec:
		specs, err := comp.podSpec.all(ctx, obj)
		if err != nil {
			return nil, err
		}
		var metas []any
		if comp.meta != nil {
			if metas, err = comp.meta.all(ctx, obj); err != nil {
				return nil, err
			}
		}
		out := make([]map[string]any, len(specs))
		for i, v := range specs {
			s, ok := v.(map[string]any)
			if !ok {
				if v != nil {
					return nil, comp.podSpec.wrap(fmt.Errorf("expected a pod spec object, got %s", jqType(v)))
				}
				continue
			}
			t := map[string]any{"spec": s}
			if i < len(metas) {
				if md, ok := metas[i].(map[string]any); ok {
					t["metadata"] = podMetadata(md)
				}
			}
			out[i] = t
		}
		return out, nil
	case specFragments:
		return c.assemble(ctx, comp, obj)
	}
	return nil, nil
}

// podMetadata keeps the parts of an object's metadata that a pod inherits.
func podMetadata(md map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range []string{"labels", "annotations"} {
		if v, ok := md[k]; ok {
			out[k] = v
		}
	}
	return out
}

// assemble builds pod templates from fragments; the n-th value of every fragment
// path belongs to the n-th instance.
func (c *compiled) assemble(ctx context.Context, comp *component, obj map[string]any) ([]map[string]any, error) {
	f := &comp.frag
	type frag struct {
		e    *expr
		vals []any
	}
	fr := []*frag{{e: f.schedulerName}, {e: f.labels}, {e: f.annotations}, {e: f.resources}, {e: f.claims},
		{e: f.podAffinity}, {e: f.nodeAffinity}, {e: f.containers}, {e: f.container}, {e: f.priorityClass}, {e: f.image}}
	n := 0
	for _, x := range fr {
		if x.e == nil {
			continue
		}
		vals, err := x.e.all(ctx, obj)
		if err != nil {
			return nil, err
		}
		x.vals = vals
		if len(vals) > n {
			n = len(vals)
		}
	}
	at := func(x *frag, i int) any {
		if i < len(x.vals) {
			return x.vals[i]
		}
		return nil
	}
	out := make([]map[string]any, n)
	for i := 0; i < n; i++ {
		present := false
		for _, x := range fr {
			if at(x, i) != nil {
				present = true
			}
		}
		if !present {
			continue
		}
		meta := map[string]any{}
		spec := map[string]any{}
		if v := at(fr[0], i); v != nil {
			spec["schedulerName"] = v
		}
		if v := at(fr[1], i); v != nil {
			meta["labels"] = v
		}
		if v := at(fr[2], i); v != nil {
			meta["annotations"] = v
		}
		if v := at(fr[4], i); v != nil {
			spec["resourceClaims"] = v
		}
		aff := map[string]any{}
		if v := at(fr[5], i); v != nil {
			aff["podAffinity"] = v
		}
		if v := at(fr[6], i); v != nil {
			aff["nodeAffinity"] = v
		}
		if len(aff) > 0 {
			spec["affinity"] = aff
		}
		if v := at(fr[9], i); v != nil {
			spec["priorityClassName"] = v
		}
		var containers []any
		if l, ok := at(fr[7], i).([]any); ok {
			containers = append(containers, l...)
		}
		switch v := at(fr[8], i).(type) {
		case map[string]any:
			containers = append(containers, v)
		case []any:
			containers = append(containers, v...)
		}
		res := at(fr[3], i)
		img := at(fr[10], i)
		if len(containers) == 0 && (res != nil || img != nil) {
			containers = []any{map[string]any{"name": "main"}}
		}
		if len(containers) > 0 {
			// The resources and image fragments describe the main container; copy it
			// so the workload object is not modified.
			if main, ok := containers[0].(map[string]any); ok {
				cp := make(map[string]any, len(main)+2)
				for k, v := range main {
					cp[k] = v
				}
				if _, has := cp["resources"]; !has && res != nil {
					cp["resources"] = res
				}
				if _, has := cp["image"]; !has && img != nil {
					cp["image"] = img
				}
				containers[0] = cp
			}
			spec["containers"] = containers
		}
		out[i] = map[string]any{"metadata": meta, "spec": spec}
	}
	return out, nil
}

// Names that, without a role annotation, make a component a leader or a service.
var (
	leaderWords  = []string{"head", "leader", "master", "launcher", "driver", "coordinator", "chief"}
	serviceWords = []string{"frontend", "router", "gateway", "proxy"}
)

func containsAny(name string, words []string) bool {
	name = strings.ToLower(name)
	for _, w := range words {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

func (c *compiled) role(in *instance, inGang bool) Role {
	if r, ok := c.roles[in.id]; ok && in.id != "" {
		return r
	}
	if r, ok := c.roles[in.comp.name]; ok {
		return r
	}
	name := in.comp.name
	if in.id != "" {
		name = in.id
	}
	switch {
	case containsAny(name, leaderWords):
		return RoleLeader
	case containsAny(name, serviceWords):
		return RoleService
	case inGang:
		return RoleWorker
	}
	return RoleService
}

// leaves lists the pod-bearing instances at or below comp.
func (m *mapping) leaves(comp *component) []*instance {
	if comp.podLeaf {
		return m.instances[comp]
	}
	var out []*instance
	for _, ch := range comp.children {
		out = append(out, m.leaves(ch)...)
	}
	return out
}

func under(comp, anc *component) bool {
	for p := comp; p != nil; p = p.parent {
		if p == anc {
			return true
		}
	}
	return false
}

// filterInstances keeps the instances whose pod template passes every filter.
func filterInstances(ctx context.Context, ins []*instance, filters []*expr) ([]*instance, error) {
	if len(filters) == 0 {
		return ins, nil
	}
	var out []*instance
	for _, in := range ins {
		pod := in.template
		if pod == nil {
			pod = map[string]any{}
		}
		ok, err := passes(ctx, filters, pod)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, in)
		}
	}
	return out, nil
}

func passes(ctx context.Context, filters []*expr, pod map[string]any) (bool, error) {
	for _, f := range filters {
		v, err := f.first(ctx, pod)
		if err != nil {
			return false, err
		}
		if v == nil || v == false {
			return false, nil
		}
	}
	return true, nil
}

// gangs computes the gang shapes of a mapped object and which instances are in one.
func (c *compiled) gangs(ctx context.Context, m *mapping) ([]Gang, map[*instance]bool, error) {
	var out []Gang
	inGang := map[*instance]bool{}
	for _, g := range c.groups {
		type part = gangPart
		var split, rest []*instance
		for _, mem := range g.members {
			ins, err := filterInstances(ctx, m.leaves(mem.comp), mem.filters)
			if err != nil {
				return nil, nil, err
			}
			for _, in := range ins {
				switch {
				case g.split == splitReplica && under(in.comp, g.splitComp):
					split = append(split, in)
				case g.split == splitInstance && in.comp == g.splitComp:
					split = append(split, in)
				default:
					rest = append(rest, in)
				}
			}
		}
		var parts []part
		switch g.split {
		case splitReplica:
			var groups int64
			for _, s := range m.instances[g.splitComp] {
				groups += s.replicas
			}
			if groups > 0 {
				parts = append(parts, part{name: g.name, ins: split, count: groups, perGangOf: groups})
			}
		case splitInstance:
			for _, in := range split {
				parts = append(parts, part{name: g.name + "-" + in.id, ins: []*instance{in}, count: 1, perGangOf: 1})
			}
		}
		if len(rest) > 0 {
			parts = append(parts, part{name: g.name, ins: rest, count: 1, perGangOf: 1})
		}
		parts = splitKeys(parts)
		parts = splitStages(parts, func(p part, stage int64, ins []*instance) part {
			p.name = fmt.Sprintf("%s-stage-%d", p.name, stage)
			p.ins = ins
			return p
		})
		for _, p := range parts {
			var pods, min int64
			names := []string{}
			seen := map[string]bool{}
			for _, in := range p.ins {
				pods += in.replicas
				min += in.minOrReplicas()
				if !seen[in.display] {
					seen[in.display] = true
					names = append(names, in.display)
				}
			}
			if pods == 0 && min == 0 {
				continue
			}
			for _, in := range p.ins {
				inGang[in] = true
			}
			g := Gang{
				Name:       p.name,
				MinMember:  ceilDiv(min, p.perGangOf),
				Count:      p.count,
				Pods:       ceilDiv(pods, p.perGangOf),
				Components: names,
			}
			if p.stages > 1 {
				g.Stage, g.Stages = p.ins[0].stage, p.stages
			}
			out = append(out, g)
		}
	}
	return out, inGang, nil
}

// gangPart is the set of member instances that one gang shape covers.
type gangPart struct {
	name      string
	ins       []*instance
	count     int64
	perGangOf int64
	// stages is the number of startup stages of the part it was split from.
	stages int64
}

// splitKeys divides each part whose instances have different gang keys into
// one part per key, named "<part>-<key>" ("" keeps the part's name), in the
// order the keys first appear.
func splitKeys(parts []gangPart) []gangPart {
	var out []gangPart
	for _, p := range parts {
		byKey := map[string][]*instance{}
		var order []string
		for _, in := range p.ins {
			if _, ok := byKey[in.gangKey]; !ok {
				order = append(order, in.gangKey)
			}
			byKey[in.gangKey] = append(byKey[in.gangKey], in)
		}
		if len(order) == 1 && order[0] == "" {
			out = append(out, p)
			continue
		}
		for _, k := range order {
			q := p
			q.ins = byKey[k]
			if k != "" {
				q.name = p.name + "-" + k
			}
			out = append(out, q)
		}
	}
	return out
}

// splitStages divides each part whose instances are in several startup stages
// into one part per stage (in stage order): the operator creates a later stage
// only after an earlier one runs or ends, so a gang over all of them would never
// have its pods at once. A part in one stage stays as it is.
func splitStages(parts []gangPart, rename func(p gangPart, stage int64, ins []*instance) gangPart) []gangPart {
	var out []gangPart
	for _, p := range parts {
		byStage := map[int64][]*instance{}
		var order []int64
		for _, in := range p.ins {
			if _, ok := byStage[in.stage]; !ok {
				order = append(order, in.stage)
			}
			byStage[in.stage] = append(byStage[in.stage], in)
		}
		if len(order) < 2 {
			out = append(out, p)
			continue
		}
		sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
		for _, st := range order {
			q := rename(p, st, byStage[st])
			q.stages = int64(len(order))
			out = append(out, q)
		}
	}
	return out
}

func ceilDiv(a, b int64) int64 {
	if b <= 0 {
		return a
	}
	return (a + b - 1) / b
}
