package resolver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
)

// ErrNoDefinitionCRD is returned (wrapped) by New with WithClusterDefinitions
// when the API server does not serve WorkloadDefinitions.
var ErrNoDefinitionCRD = errors.New("the WorkloadDefinition CRD is not installed")

// ConditionAccepted is the condition a resolver following the cluster's
// definitions sets on each WorkloadDefinition.
const ConditionAccepted = "Accepted"

// Reasons of the Accepted condition.
const (
	ReasonInForce          = "InForce"
	ReasonInvalid          = "Invalid"
	ReasonConflict         = "Conflict"
	ReasonOverriddenByFile = "OverriddenByFile"
)

// clusterDefinitions follows WorkloadDefinition objects and rebuilds the
// resolver's catalog when they change.
type clusterDefinitions struct {
	r           *Resolver
	client      dynamic.Interface
	lister      cache.GenericLister
	synced      cache.InformerSynced
	fileDefs    []*catalog.Definition
	writeStatus bool
	changed     chan struct{}
	mu          sync.Mutex // serializes rebuilds
}

func newClusterDefinitions(ctx context.Context, r *Resolver, client dynamic.Interface, fileDefs []*catalog.Definition, writeStatus bool) (*clusterDefinitions, error) {
	if _, err := r.mapper.RESTMapping(schema.GroupKind{Group: v1alpha1.GroupName, Kind: "WorkloadDefinition"}, "v1alpha1"); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, fmt.Errorf("following cluster definitions: %w: %w", ErrNoDefinitionCRD, err)
		}
		return nil, err
	}
	// A cluster-scoped resource: not from the namespace-filtered factory.
	inf := r.clusterFactory.ForResource(v1alpha1.WorkloadDefinitionsResource)
	d := &clusterDefinitions{
		r:           r,
		client:      client,
		lister:      inf.Lister(),
		synced:      inf.Informer().HasSynced,
		fileDefs:    fileDefs,
		writeStatus: writeStatus,
		changed:     make(chan struct{}, 1),
	}
	notify := func() {
		select {
		case d.changed <- struct{}{}:
		default: // a rebuild is already pending; it will see this change too
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Following the cluster's WorkloadDefinitions", "writeStatus", writeStatus)
	return d, nil
}

func (d *clusterDefinitions) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.changed:
			if d.synced() {
				d.rebuild(ctx)
			}
		}
	}
}

type verdict struct {
	obj    *unstructured.Unstructured
	def    *catalog.Definition
	reason string
	msg    string
}

// rebuild makes a new catalog of the built-ins, the accepted cluster definitions
// and the file definitions, and records on each WorkloadDefinition whether it is
// in force.
func (d *clusterDefinitions) rebuild(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	objs, err := d.lister.List(labelsEverything())
	if err != nil {
		logger.Error(err, "Listing WorkloadDefinitions from the cache")
		return
	}
	var verdicts []*verdict
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		verdicts = append(verdicts, &verdict{obj: u})
	}
	// The oldest definition of a kind wins; later ones conflict.
	sort.Slice(verdicts, func(i, j int) bool {
		a, b := verdicts[i].obj, verdicts[j].obj
		ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
		if !ta.Equal(&tb) {
			return ta.Before(&tb)
		}
		return a.GetName() < b.GetName()
	})
	fromFile := map[schema.GroupVersionKind]*catalog.Definition{}
	for _, f := range d.fileDefs {
		fromFile[f.RootGVK()] = f
	}
	taken := map[schema.GroupVersionKind]string{}
	var accepted []*catalog.Definition
	for _, v := range verdicts {
		def, err := catalog.DefinitionFromObject(v.obj)
		if err == nil {
			// Compile it alone, so that a bad definition names itself and does
			// not keep the others out.
			_, err = catalog.New([]*catalog.Definition{def}, catalog.WithoutBuiltins())
		}
		switch {
		case err != nil:
			v.reason, v.msg = ReasonInvalid, err.Error()
		case fromFile[def.RootGVK()] != nil:
			f := fromFile[def.RootGVK()]
			v.reason, v.msg = ReasonOverriddenByFile, fmt.Sprintf("definition %q from %s reads %s", f.Name, f.File, catalog.GVKString(def.RootGVK()))
		case taken[def.RootGVK()] != "":
			v.reason, v.msg = ReasonConflict, fmt.Sprintf("WorkloadDefinition %s, older, already reads %s", taken[def.RootGVK()], catalog.GVKString(def.RootGVK()))
		default:
			taken[def.RootGVK()] = v.obj.GetName()
			v.def, v.reason, v.msg = def, ReasonInForce, "in force for "+catalog.GVKString(def.RootGVK())
			accepted = append(accepted, def)
		}
	}
	cat, err := catalog.New(append(append([]*catalog.Definition{}, d.fileDefs...), accepted...))
	if err != nil {
		// Each definition compiled alone; this is not expected. Keep the old catalog.
		logger.Error(err, "Building the catalog from the cluster's definitions; keeping the previous one")
		return
	}
	d.r.cat.Store(cat)
	if err := d.r.ensureKinds(ctx, cat); err != nil {
		logger.Error(err, "Watching the kinds of the cluster's definitions")
	}
	logger.V(2).Info("Catalog rebuilt from the cluster's definitions", "inForce", len(accepted), "definitions", len(verdicts))
	if d.writeStatus {
		for _, v := range verdicts {
			if err := d.setCondition(ctx, v); err != nil {
				logger.Error(err, "Recording the Accepted condition", "workloadDefinition", v.obj.GetName())
			}
		}
	}
}

// setCondition writes the Accepted condition when it differs from the one recorded.
func (d *clusterDefinitions) setCondition(ctx context.Context, v *verdict) error {
	status := metav1.ConditionFalse
	if v.reason == ReasonInForce {
		status = metav1.ConditionTrue
	}
	want := metav1.Condition{
		Type:               ConditionAccepted,
		Status:             status,
		Reason:             v.reason,
		Message:            truncate(v.msg, 32768),
		ObservedGeneration: v.obj.GetGeneration(),
	}
	conds, _, _ := unstructured.NestedSlice(v.obj.Object, "status", "conditions")
	var kept []any
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		if m["type"] == ConditionAccepted {
			if m["status"] == string(want.Status) && m["reason"] == want.Reason && m["message"] == want.Message && fmt.Sprint(m["observedGeneration"]) == fmt.Sprint(want.ObservedGeneration) {
				return nil
			}
			continue
		}
		kept = append(kept, m)
	}
	obj := v.obj.DeepCopy()
	kept = append(kept, map[string]any{
		"type":               want.Type,
		"status":             string(want.Status),
		"reason":             want.Reason,
		"message":            want.Message,
		"observedGeneration": want.ObservedGeneration,
		"lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"),
	})
	if err := unstructured.SetNestedSlice(obj.Object, kept, "status", "conditions"); err != nil {
		return err
	}
	_, err := d.client.Resource(v1alpha1.WorkloadDefinitionsResource).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// A newer version is on its way through the informer; it triggers a rebuild.
		return nil
	}
	if err != nil {
		return fmt.Errorf("updating status of WorkloadDefinition %s: %w", v.obj.GetName(), err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func labelsEverything() labels.Selector { return labels.Everything() }
