package catalog

import (
	"context"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
)

func TestListerClaims(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := idx.Add(&resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "four"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "r",
			// A prioritized list: the first choice counts.
			FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "big", DeviceClassName: "gpu.nvidia.com", Count: 4}, {Name: "small", DeviceClassName: "gpu.nvidia.com", Count: 2}},
		}}}}},
	}); err != nil {
		t.Fatal(err)
	}
	claims := ListerClaims{Templates: resourcelisters.NewResourceClaimTemplateLister(idx)}
	c := newBuiltinCatalog(t)
	w, err := c.MapWithClaims(context.Background(), obj(t, `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  resourceClaims: [{name: g, resourceClaimTemplateName: four}, {name: shared, resourceClaimName: nowhere}]
  containers: [{name: c}]
`), claims)
	if err != nil {
		t.Fatal(err)
	}
	if w.GPUs != 4 || len(w.Components[0].UnresolvedClaims) != 1 || w.Components[0].UnresolvedClaims[0] != "shared" {
		t.Errorf("gpus %v unresolved %v", w.GPUs, w.Components[0].UnresolvedClaims)
	}
}
