package operators

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
	"github.com/tessera-gpu/tessera/catalog/resolver"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestClusterDefinitionAtRunTime: a platform team adds a CRD and a
// WorkloadDefinition for it while tessera-scheduler runs; the pods of such a
// workload are placed as one gang of the definition's size without a restart,
// and the definition is Accepted. A broken definition for JobSet is rejected
// with a False condition naming the field, and JobSets keep their built-in
// gangs.
func TestClusterDefinitionAtRunTime(t *testing.T) {
	t.Parallel()
	h := setup(t)
	group := framework.UniqueName("x") + ".example.tessera.dev"
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "trainers." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "trainers", Singular: "trainer", Kind: "Trainer", ListKind: "TrainerList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
	ext, err := apiextensionsclient.NewForConfig(env.sb.Config())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(h.ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ext.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	if err := framework.WaitCRDEstablished(h.ctx, ext, crd.Name); err != nil {
		t.Fatal(err)
	}

	def := h.definition(framework.UniqueName("trainers"), fmt.Sprintf(`
  structureDefinition:
    rootComponent:
      name: trainer
      kind: {group: %s, version: v1, kind: Trainer}
    childComponents:
    - name: worker
      kind: {group: "", version: v1, kind: Pod}
      ownerRef: trainer
      specDefinition: {podTemplateSpecPath: .spec.template}
      scaleDefinition: {replicasPath: .spec.replicas}
  optimizationInstructions:
    gangScheduling:
      podGroups:
      - name: all
        members: [{componentName: worker}]
`, group))
	if reason := h.waitAccepted(def, "True"); reason != resolver.ReasonInForce {
		t.Errorf("Accepted reason %q, want %s", reason, resolver.ReasonInForce)
	}

	// The "operator" of the new kind: the test creates the object and its pods.
	tr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": "Trainer",
		"metadata": map[string]any{"name": "llm", "namespace": h.ns},
		"spec": map[string]any{"replicas": int64(3), "template": map[string]any{
			"spec": map[string]any{"containers": []any{map[string]any{"name": "main", "image": "busybox"}}},
		}},
	}}
	tr = h.create(tr)
	for i := range 3 {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("llm-%d", i), Namespace: h.ns,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: group + "/v1", Kind: "Trainer", Name: "llm", UID: tr.GetUID(), Controller: ptr.To(true)}},
			},
			Spec: corev1.PodSpec{
				SchedulerName: schedulerName,
				Containers: []corev1.Container{{Name: "main", Image: "busybox",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(claimTemplate)}},
			},
		}
		if _, err := h.client.CoreV1().Pods(h.ns).Create(h.ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.waitGangs(map[string]gang{"trainer-llm-all": {3, 3}}, 0, placeTimeout)

	// A broken definition for a built-in kind: rejected, built-in kept.
	broken := h.definition(framework.UniqueName("broken-jobset"), `
  structureDefinition:
    rootComponent:
      name: jobset
      kind: {group: jobset.x-k8s.io, version: v1alpha2, kind: JobSet}
    childComponents:
    - name: job
      ownerRef: jobset
      specDefinition: {podTemplateSpecPath: '.spec.replicatedJobs[].template.spec.template'}
      scaleDefinition: {replicasPath: '.spec.replicatedJobs[] | .replicas *'}
  optimizationInstructions:
    gangScheduling:
      podGroups:
      - name: one-per-pod
        members: [{componentName: job}]
`)
	if reason := h.waitAccepted(broken, "False"); reason != resolver.ReasonInvalid {
		t.Errorf("broken definition: Accepted reason %q, want %s", reason, resolver.ReasonInvalid)
	}
	h.create(h.load("JobSet/jobset__paralleljobs.yaml", nil))
	h.waitGangs(map[string]gang{"trainer-llm-all": {3, 3}, "jobset-paralleljobs-jobset": {5, 5}}, 0, placeTimeout)
}

func (h *harness) definition(name, spec string) string {
	h.t.Helper()
	u := h.parse("apiVersion: catalog.tessera.dev/v1alpha1\nkind: WorkloadDefinition\nmetadata: {name: "+name+"}\nspec:"+spec, func([]string) bool { return false })
	u.SetNamespace("")
	if _, err := h.dyn.Resource(v1alpha1.WorkloadDefinitionsResource).Create(h.ctx, u, metav1.CreateOptions{}); err != nil {
		h.t.Fatalf("create WorkloadDefinition %s: %v", name, err)
	}
	h.t.Cleanup(func() {
		_ = h.dyn.Resource(v1alpha1.WorkloadDefinitionsResource).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// waitAccepted waits for the definition's Accepted condition to have status and
// returns its reason.
func (h *harness) waitAccepted(name, status string) string {
	h.t.Helper()
	var reason, msg string
	err := wait.PollUntilContextTimeout(h.ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := h.dyn.Resource(v1alpha1.WorkloadDefinitionsResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			cm := c.(map[string]any)
			if cm["type"] == resolver.ConditionAccepted && cm["status"] == status {
				reason, _ = cm["reason"].(string)
				msg, _ = cm["message"].(string)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		h.t.Fatalf("WorkloadDefinition %s: no Accepted=%s condition: %v", name, status, err)
	}
	h.t.Logf("WorkloadDefinition %s: Accepted=%s %s: %s", name, status, reason, msg)
	return reason
}
