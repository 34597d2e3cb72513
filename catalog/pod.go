package catalog

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ErrNoComponent is returned (wrapped) by MatchPod when no component of the
// workload's definition selects the pod.
var ErrNoComponent = errors.New("pod matches no component of the definition")

// PodMatch is what a pod is within its workload.
type PodMatch struct {
	// Component is the definition's component name; Name the component entry of
	// the Workload (the instance id for components with instances).
	Component string
	Name      string
	Instance  string
	// Replica is the pod's replica index or group id, from the nearest replica
	// selector of its component or an ancestor; empty when none says.
	Replica string
	Role    Role
	// Stage is the startup stage of the pod's component instance, and GangKey
	// its gang key (see Component).
	Stage   int64
	GangKey string
	// Gang is nil when the pod's component is in no gang: it is scheduled alone.
	Gang *PodGang
}

// PodGang is the gang a pod belongs to.
type PodGang struct {
	// Name is unique within the workload: the pod group name, plus the replica
	// index or instance id for groups split per replica or instance.
	Name string
	// PodGroup is the definition's pod group name; Shape the Workload.Gangs entry.
	PodGroup  string
	Shape     string
	MinMember int64
	// Pods in the gang at full scale.
	Pods int64
}

// MatchPod tells which component, instance, replica and gang pod is in, for a
// workload that this catalog mapped. ownerKinds are the kinds on the pod's owner
// chain below the workload (nearest first); a component whose kind is among them is
// preferred when selectors alone do not decide.
func (c *Catalog) MatchPod(ctx context.Context, w *Workload, pod *corev1.Pod, ownerKinds []schema.GroupVersionKind) (*PodMatch, error) {
	cd, ok := c.byGVK[w.GroupVersionKind()]
	if !ok {
		return nil, fmt.Errorf("%s: %w", GVKString(w.GroupVersionKind()), ErrUnknownKind)
	}
	var podObj map[string]any
	if cd.podMetaOnly {
		podObj = podMetadataObject(pod)
	} else {
		raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
		if err != nil {
			return nil, fmt.Errorf("converting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		podObj = normalize(raw).(map[string]any)
	}
	ctx, cancel := context.WithTimeout(ctx, EvaluationTimeout)
	defer cancel()
	m, err := cd.matchPod(ctx, w, podObj, ownerKinds)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			cp := *e
			cp.Definition, cp.Object = cd.def.Name, "Pod "+pod.Namespace+"/"+pod.Name
			return nil, &cp
		}
		return nil, fmt.Errorf("pod %s/%s, definition %q: %w", pod.Namespace, pod.Name, cd.def.Name, err)
	}
	return m, nil
}

func (cd *compiled) matchPod(ctx context.Context, w *Workload, pod map[string]any, ownerKinds []schema.GroupVersionKind) (*PodMatch, error) {
	entries := map[string][]*Component{}
	for i := range w.Components {
		e := &w.Components[i]
		entries[e.Component] = append(entries[e.Component], e)
	}
	var best *PodMatch
	bestScore := -1
	for _, comp := range cd.comps {
		if !comp.podLeaf || len(entries[comp.name]) == 0 {
			continue
		}
		score := 0
		if comp.typeSel != nil {
			v, err := comp.typeSel.first(ctx, pod)
			if err != nil {
				return nil, err
			}
			if comp.typeValue != nil {
				if v == nil || str(v) != *comp.typeValue {
					continue
				}
			} else if v == nil || v == false || v == "" {
				continue
			}
			score += 4
		}
		var entry *Component
		if comp.instSel != nil {
			v, err := comp.instSel.first(ctx, pod)
			if err != nil {
				return nil, err
			}
			entry = matchInstance(entries[comp.name], str(v))
			if entry == nil {
				continue
			}
			score += 2
		} else {
			entry = entries[comp.name][0]
		}
		if comp.kind != nil {
			for _, k := range ownerKinds {
				if k.GroupKind() == comp.kind.GroupKind() {
					score++
					break
				}
			}
		}
		if score > bestScore {
			bestScore = score
			best = &PodMatch{Component: comp.name, Name: entry.Name, Instance: entry.Instance, Role: entry.Role, Stage: entry.Stage, GangKey: entry.GangKey}
			for p := comp; p != nil; p = p.parent {
				if p.replicaSel != nil {
					v, err := p.replicaSel.first(ctx, pod)
					if err != nil {
						return nil, err
					}
					best.Replica = str(v)
					break
				}
			}
		}
	}
	if best == nil {
		return nil, ErrNoComponent
	}
	g, err := cd.podGang(ctx, w, best, pod)
	if err != nil {
		return nil, err
	}
	best.Gang = g
	return best, nil
}

func (cd *compiled) podGang(ctx context.Context, w *Workload, pm *PodMatch, pod map[string]any) (*PodGang, error) {
	comp := cd.byName[pm.Component]
	for _, g := range cd.groups {
		for _, mem := range g.members {
			if !under(comp, mem.comp) {
				continue
			}
			ok, err := passes(ctx, mem.filters, pod)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			shape, suffix := g.name, ""
			switch {
			case g.split == splitReplica && under(comp, g.splitComp):
				v, err := g.splitComp.replicaSel.first(ctx, pod)
				if err != nil {
					return nil, err
				}
				suffix = str(v)
				if suffix == "" {
					suffix = "0"
				}
			case g.split == splitInstance && comp == g.splitComp:
				shape = g.name + "-" + pm.Instance
			}
			if pm.GangKey != "" {
				shape += "-" + pm.GangKey
			}
			staged := fmt.Sprintf("%s-stage-%d", shape, pm.Stage)
			for _, gs := range w.Gangs {
				if gs.Name != shape && (gs.Stages < 2 || gs.Name != staged) {
					continue
				}
				shape = gs.Name
				name := shape
				if suffix != "" {
					name = shape + "-" + suffix
				}
				return &PodGang{Name: name, PodGroup: g.name, Shape: shape, MinMember: gs.MinMember, Pods: gs.Pods}, nil
			}
		}
	}
	return nil, nil
}

// matchInstance finds the entry for an instance id read from a pod: exactly, then
// ignoring case (operators lower-case names into labels), then as the last
// dash-separated part of the value (operators prefix names: Grove labels a pod
// with its PodClique "<set>-<replica>-<clique>"); the longest such match wins.
func matchInstance(entries []*Component, id string) *Component {
	if id == "" {
		return nil
	}
	for _, e := range entries {
		if e.Instance == id {
			return e
		}
	}
	for _, e := range entries {
		if strings.EqualFold(e.Instance, id) {
			return e
		}
	}
	var best *Component
	for _, e := range entries {
		if e.Instance != "" && strings.HasSuffix(id, "-"+e.Instance) && (best == nil || len(e.Instance) > len(best.Instance)) {
			best = e
		}
	}
	return best
}

// podMetadataObject is the part of a pod that selectors usually read, built
// without the reflection a full conversion costs; used when every pod-side
// expression of a definition reads only metadata.
func podMetadataObject(pod *corev1.Pod) map[string]any {
	md := map[string]any{"name": pod.Name, "namespace": pod.Namespace, "uid": string(pod.UID)}
	if pod.GenerateName != "" {
		md["generateName"] = pod.GenerateName
	}
	if len(pod.Labels) > 0 {
		l := make(map[string]any, len(pod.Labels))
		for k, v := range pod.Labels {
			l[k] = v
		}
		md["labels"] = l
	}
	if len(pod.Annotations) > 0 {
		a := make(map[string]any, len(pod.Annotations))
		for k, v := range pod.Annotations {
			a[k] = v
		}
		md["annotations"] = a
	}
	return map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": md}
}

var (
	metadataRefRE = regexp.MustCompile(`\.metadata(\.[A-Za-z_][A-Za-z0-9_]*|\[\s*"[^"]*"\s*\])*`)
	otherRefRE    = regexp.MustCompile(`(^|[^A-Za-z0-9_"\]\)])\.[A-Za-z_\["]|\.\.|\$__loc__|\binput\b|\bpaths\b|\btojson\b|\bkeys\b`)
)

// readsOnlyMetadata tells (conservatively) whether a pod-side expression reads
// nothing but .metadata paths; when unsure it says no.
func readsOnlyMetadata(src string) bool {
	rest := metadataRefRE.ReplaceAllString(src, "")
	return !otherRefRE.MatchString(rest) && !strings.Contains(rest, " . ") && strings.TrimSpace(rest) != "."
}
