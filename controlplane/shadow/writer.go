package shadow

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
)

// writer persists reports: the shadow's only writes.
type writer struct {
	client dynamic.ResourceInterface
}

func newWriter(dyn dynamic.Interface, namespace string) *writer {
	return &writer{client: dyn.Resource(shadowv1.Resource).Namespace(namespace)}
}

// load lists the reports an earlier run left, so that a restart continues them.
func (w *writer) load(ctx context.Context) ([]*shadowv1.ShadowReport, error) {
	list, err := w.client.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ShadowReports (is the CRD installed?): %w", err)
	}
	out := make([]*shadowv1.ShadowReport, 0, len(list.Items))
	for i := range list.Items {
		r, err := fromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func fromUnstructured(u *unstructured.Unstructured) (*shadowv1.ShadowReport, error) {
	r := &shadowv1.ShadowReport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err != nil {
		return nil, fmt.Errorf("ShadowReport %s: %w", u.GetName(), err)
	}
	return r, nil
}

func toUnstructured(r *shadowv1.ShadowReport) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(r)
	if err != nil {
		return nil, fmt.Errorf("ShadowReport %s: %w", r.Name, err)
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// changed: the report differs from what was last written.
func (r *record) changed() bool {
	if r.written == nil {
		return true
	}
	return !equality.Semantic.DeepEqual(r.report.Gang, r.written.Gang) || !equality.Semantic.DeepEqual(r.report.Actual, r.written.Actual) ||
		!equality.Semantic.DeepEqual(r.report.Tessera, r.written.Tessera)
}

// write creates or updates the report; on a conflict it takes the stored resourceVersion and
// writes again (the shadow's view wins: it is the only writer).
func (w *writer) write(ctx context.Context, r *record) error {
	obj := r.report.DeepCopy()
	if r.written != nil {
		obj.ResourceVersion = r.written.ResourceVersion
	}
	for attempt := 0; attempt < 3; attempt++ {
		u, err := toUnstructured(obj)
		if err != nil {
			return err
		}
		var got *unstructured.Unstructured
		verb := "update"
		if obj.ResourceVersion == "" {
			verb = "create"
			got, err = w.client.Create(ctx, u, metav1.CreateOptions{})
		} else {
			got, err = w.client.Update(ctx, u, metav1.UpdateOptions{})
		}
		switch {
		case err == nil:
			reportWrites.WithLabelValues(verb).Inc()
			written, err := fromUnstructured(got)
			if err != nil {
				return err
			}
			r.written = written
			return nil
		case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
			cur, gerr := w.client.Get(ctx, obj.Name, metav1.GetOptions{})
			if gerr != nil {
				return fmt.Errorf("write ShadowReport %s: %w (then get: %w)", obj.Name, err, gerr)
			}
			obj.ResourceVersion = cur.GetResourceVersion()
		case apierrors.IsNotFound(err):
			obj.ResourceVersion = "" // deleted by hand: create it again
		default:
			return fmt.Errorf("write ShadowReport %s: %w", obj.Name, err)
		}
	}
	return fmt.Errorf("write ShadowReport %s: still conflicting after 3 tries", obj.Name)
}

func (w *writer) delete(ctx context.Context, name string) error {
	err := w.client.Delete(ctx, name, metav1.DeleteOptions{})
	if err == nil {
		reportWrites.WithLabelValues("delete").Inc()
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ShadowReport %s: %w", name, err)
	}
	return nil
}

// persist writes the reports that changed and deletes those of gangs that ended longer
// than the TTL ago. A failed write is retried next cycle (the report still differs).
func (s *Shadow) persist(ctx context.Context, now time.Time) {
	logger := klog.FromContext(ctx)
	for key, rec := range s.records {
		if ended := rec.report.Gang.EndedTime; ended != nil && s.opts.ReportTTL > 0 && now.Sub(ended.Time) > s.opts.ReportTTL {
			if rec.written != nil {
				if err := s.writer.delete(ctx, rec.report.Name); err != nil {
					logger.Error(err, "Deleting an expired report failed; retrying next cycle")
					continue
				}
			}
			delete(s.records, key)
			continue
		}
		if !rec.changed() {
			continue
		}
		if err := s.writer.write(ctx, rec); err != nil {
			logger.Error(err, "Writing a shadow report failed; retrying next cycle", "gang", key)
		}
	}
}
