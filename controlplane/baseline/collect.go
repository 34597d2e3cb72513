package baseline

import (
	"context"
	"fmt"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
)

// Sampler follows pending pods across samples: a pod's wait runs from its creation until it
// was bound (its PodScheduled condition, else the sample that saw it bound), or until the
// last sample while it still waits.
type Sampler struct {
	pods       map[types.UID]*podWait
	pendingNow int
}

type podWait struct {
	created, until time.Time
	bound          bool
}

// NewSampler returns an empty sampler.
func NewSampler() *Sampler { return &Sampler{pods: map[types.UID]*podWait{}} }

// Observe takes one sample of the pods.
func (s *Sampler) Observe(pods []v1.Pod, now time.Time) {
	s.pendingNow = 0
	for i := range pods {
		p := &pods[i]
		w := s.pods[p.UID]
		pending := p.Spec.NodeName == "" && p.Status.Phase == v1.PodPending && p.DeletionTimestamp == nil
		switch {
		case pending:
			s.pendingNow++
			if w == nil {
				w = &podWait{created: p.CreationTimestamp.Time}
				s.pods[p.UID] = w
			}
			w.until = now
		case w != nil && !w.bound && p.Spec.NodeName != "":
			w.bound, w.until = true, now
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue && !c.LastTransitionTime.IsZero() {
					w.until = c.LastTransitionTime.Time
				}
			}
		}
	}
}

// Waits are the waits in seconds of every pod seen pending; PendingNow the pods pending at
// the last sample.
func (s *Sampler) Waits() []float64 {
	out := make([]float64, 0, len(s.pods))
	for _, w := range s.pods {
		out = append(out, max(0, w.until.Sub(w.created).Seconds()))
	}
	return out
}

// PendingNow is the number of pods pending at the last sample.
func (s *Sampler) PendingNow() int { return s.pendingNow }

// Options of Collect.
type Options struct {
	// Window to sample pending pods over, every Interval; 0: one sample.
	Window, Interval time.Duration
	// Definition names the catalog definition of a kind ("" for none).
	Definition func(schema.GroupVersionKind) string
	// Now, when set, replaces time.Now.
	Now func() time.Time
	// Stop, when closed, ends the sampling window early: the report covers the samples
	// taken so far (its WindowSeconds says how long that was). `tessera report baseline`
	// closes it on the first interrupt.
	Stop <-chan struct{}
	// DCGMURLs are dcgm-exporter /metrics URLs (one per GPU node), scraped at every sample
	// for DCGM_FI_DEV_GPU_UTIL; none: utilisation is not measured.
	DCGMURLs []string
	// HTTPClient scrapes them; default http.DefaultClient with a 10 s timeout.
	HTTPClient *http.Client
}

// Collect reads the cluster (only reads) and builds the report.
func Collect(ctx context.Context, cfg *rest.Config, o Options) (Report, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Report{}, fmt.Errorf("kubernetes client: %w", err)
	}
	sampler := NewSampler()
	start := now()
	interval := o.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	var util *UtilSampler
	httpClient := o.HTTPClient
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 10 * time.Second}
	}
	if len(o.DCGMURLs) > 0 {
		util = NewUtilSampler()
	}
	scrape := func() error {
		for _, url := range o.DCGMURLs {
			if err := util.Scrape(ctx, httpClient, url); err != nil {
				return err
			}
		}
		return nil
	}
	window := o.Window
	for {
		pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return Report{}, fmt.Errorf("list pods: %w", err)
		}
		sampler.Observe(pods.Items, now())
		if err := scrape(); err != nil {
			return Report{}, err
		}
		if now().Sub(start)+interval > o.Window {
			break
		}
		stopped := false
		select {
		case <-ctx.Done():
			return Report{}, ctx.Err()
		case <-o.Stop:
			stopped = true
		case <-time.After(interval):
		}
		if stopped {
			// One last sample, so that the report is the cluster at the moment it was
			// stopped.
			if pods, err = kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
				return Report{}, fmt.Errorf("list pods: %w", err)
			}
			sampler.Observe(pods.Items, now())
			if err := scrape(); err != nil {
				return Report{}, err
			}
			window = now().Sub(start)
			break
		}
	}
	in := Input{Now: now(), Window: window, Waits: sampler.Waits(), PendingNow: sampler.PendingNow()}
	if in.Cluster, err = overview.Fetch(ctx, cfg, in.Now); err != nil {
		return Report{}, err
	}
	if in.Coverage, err = coverage(ctx, cfg, o.Definition); err != nil {
		return Report{}, err
	}
	if in.Mapping, err = mappingFailures(ctx, cfg); err != nil {
		return Report{}, err
	}
	if util != nil {
		slices, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return Report{}, fmt.Errorf("list ResourceSlices: %w", err)
		}
		in.GPUUtil, in.GPUNodes = util.Means(), GPUNodes(slices.Items)
	}
	return Build(in), nil
}

// coverage lists every served version of the installed CRDs with its catalog definition.
func coverage(ctx context.Context, cfg *rest.Config, definition func(schema.GroupVersionKind) string) ([]Kind, error) {
	ac, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("apiextensions client: %w", err)
	}
	crds, err := ac.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	var out []Kind
	for _, crd := range crds.Items {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
			k := Kind{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}
			if definition != nil {
				k.Definition = definition(gvk)
			}
			out = append(out, k)
		}
	}
	return out, nil
}

// mappingFailures: tessera's PodGroups whose Mapped condition is a failure, and the gangs of
// shadow reports the catalog could not map. Either kind may not be installed.
func mappingFailures(ctx context.Context, cfg *rest.Config) ([]MappingFail, error) {
	sc, err := schedclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var out []MappingFail
	groups, err := sc.PodGroups(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		for _, pg := range groups.Items {
			if c := meta.FindStatusCondition(pg.Status.Conditions, v1alpha1.PodGroupConditionMapped); c != nil {
				if f, ok := MappingFailure(pg.Namespace, pg.Name, c.Reason, c.Message); ok {
					out = append(out, f)
				}
			}
		}
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("list PodGroups: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	reports, err := shadowreport.Load(ctx, dyn, metav1.NamespaceAll)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return out, nil
		}
		return nil, err
	}
	for _, r := range reports {
		if f, ok := MappingFailure(r.Gang.Namespace, r.Gang.Name, r.Gang.MappedReason, r.Gang.MappedMessage); ok {
			out = append(out, f)
		}
	}
	return out, nil
}
