package operators

import (
	"context"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "", ""},
		{"trainer", "jobset,trainer", ""},
		{"pytorch, ray,jobset", "jobset,ray,pytorch", ""},
		{"kueue", "", `unknown operator "kueue"`},
	} {
		got, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q): error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestWebhooksServedAndRemovedOnStop: JobSet runs with its own webhooks, which
// the API server calls (its validating webhook rejects a JobSet whose dependsOn
// names a later job, which the CRD schema alone accepts); the pod webhook keeps
// the objectSelector of the operator's kustomize patch; Stop ends the process
// and removes the configurations, so that no failurePolicy: Fail webhook is
// left pointing at nothing.
func TestWebhooksServedAndRemovedOnStop(t *testing.T) {
	cp := framework.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, []string{JobSet}, Options{Config: cp.Config, Kubeconfig: cp.KubeconfigPath, Dir: t.TempDir(), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Get(JobSet)
	if r == nil || !strings.HasPrefix(r.Version, "sigs.k8s.io/jobset v0.12.0") {
		t.Fatalf("running %+v", r)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	mwc, err := dyn.Resource(webhookGVR["MutatingWebhookConfiguration"]).Get(ctx, "jobset-mutating-webhook-configuration", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
	var podHook map[string]any
	for _, h := range hooks {
		if hm := h.(map[string]any); hm["name"] == "mpod.kb.io" {
			podHook = hm
		}
	}
	sel, _, _ := unstructured.NestedSlice(podHook, "objectSelector", "matchExpressions")
	url, _, _ := unstructured.NestedString(podHook, "clientConfig", "url")
	if len(sel) != 1 || sel[0].(map[string]any)["key"] != "jobset.sigs.k8s.io/jobset-name" || !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Errorf("pod webhook: selector %v url %q", sel, url)
	}

	ns := cp.CreateNamespace(t)
	gvr := schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}
	var bad map[string]any
	if err := yaml.Unmarshal([]byte(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: bad}
spec:
  replicatedJobs:
  - name: a
    dependsOn: [{name: b, status: Complete}]
    template: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}}}}
  - name: b
    template: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}}}}
`), &bad); err != nil {
		t.Fatal(err)
	}
	_, err = dyn.Resource(gvr).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: bad}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err == nil || !strings.Contains(err.Error(), "webhook") {
		t.Errorf("JobSet with a forward dependsOn: %v, want a denial by the JobSet webhook", err)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Alive(); err == nil {
		t.Error("operator still running after Stop")
	}
	for kind, name := range map[string]string{"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration", "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"} {
		if _, err := dyn.Resource(webhookGVR[kind]).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after Stop: %v, want NotFound", kind, name, err)
		}
	}
}

// TestApplyPatch: the operators' kustomize patches are applied as JSON patches; an
// operation whose path does not exist is an error, not skipped.
func TestApplyPatch(t *testing.T) {
	doc := map[string]any{"metadata": map[string]any{"name": "a"}, "webhooks": []any{map[string]any{"name": "x"}}}
	patch, err := jsonpatch.DecodePatch([]byte(`[{"op":"replace","path":"/metadata/name","value":"b"},{"op":"replace","path":"/webhooks/0","value":{"name":"y"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := applyPatch(doc, patch)
	if err != nil {
		t.Fatal(err)
	}
	if got["metadata"].(map[string]any)["name"] != "b" || got["webhooks"].([]any)[0].(map[string]any)["name"] != "y" {
		t.Errorf("patched %v", got)
	}
	for _, op := range []string{`[{"op":"replace","path":"/webhooks/3","value":1}]`, `[{"op":"replace","path":"/missing/x","value":1}]`, `[{"op":"test","path":"/metadata/name","value":"zz"}]`} {
		patch, err := jsonpatch.DecodePatch([]byte(op))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := applyPatch(doc, patch); err == nil {
			t.Errorf("%s applied", op)
		}
	}
}
