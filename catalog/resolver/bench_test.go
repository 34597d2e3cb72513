package resolver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/catalog"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cacheResolver builds a resolver whose PyTorchJob lookups read an informer
// store (the same indexer and lister an informer fills), holding jobs.
func cacheResolver(b *testing.B, jobs int) (*Resolver, []*corev1.Pod) {
	cat, err := catalog.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(testdata, "workloads", "PyTorchJob", "training-operator__pytorch_job_mnist_nccl.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	docs, err := catalog.ParseManifests(data, "job.yaml")
	if err != nil {
		b.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	gvk := schema.GroupVersionKind{Group: "kubeflow.org", Version: "v1", Kind: "PyTorchJob"}
	var pods []*corev1.Pod
	for i := 0; i < jobs; i++ {
		j := docs[0].Object.DeepCopy()
		j.SetNamespace("ns")
		j.SetName(fmt.Sprintf("job-%d", i))
		j.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
		j.SetResourceVersion("1")
		if err := indexer.Add(j); err != nil {
			b.Fatal(err)
		}
		for _, role := range []string{"master", "worker"} {
			pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("job-%d-%s-0", i, role), Namespace: "ns",
				Labels:          map[string]string{"training.kubeflow.org/replica-type": role, "training.kubeflow.org/job-name": j.GetName()},
				OwnerReferences: ownedBy(j, "kubeflow.org/v1", "PyTorchJob"),
			}})
		}
	}
	lister := cache.NewGenericLister(indexer, schema.GroupResource{Group: "kubeflow.org", Resource: "pytorchjobs"})
	r := &Resolver{
		mapped: map[types.UID]mappedEntry{},
		full:   map[schema.GroupVersionKind]bool{gvk: true},
		getters: map[schema.GroupVersionKind]getter{gvk: func(ns, name string) (metav1.Object, runtime.Object, error) {
			o, err := lister.ByNamespace(ns).Get(name)
			if err != nil {
				return nil, nil, err
			}
			mo, err := meta.Accessor(o)
			if err != nil {
				return nil, nil, err
			}
			return mo, o, nil
		}},
	}
	r.cat.Store(cat)
	return r, pods
}

// BenchmarkResolve: pod -> workload lookups against an informer cache of 500
// PyTorchJobs, 1000 pods; the workload model is reused while the job's
// resourceVersion is unchanged, so this is the steady state of a scheduler.
func BenchmarkResolve(b *testing.B) {
	r, pods := cacheResolver(b, 500)
	ctx := context.Background()
	for _, p := range pods {
		if _, err := r.Resolve(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		pw, err := r.Resolve(ctx, pods[i%len(pods)])
		if err != nil || pw.Gang == nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "lookups/cpu-s")
	}
}

// BenchmarkResolveUncached maps the workload on every lookup (every job changed).
func BenchmarkResolveUncached(b *testing.B) {
	r, pods := cacheResolver(b, 500)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		r.mu.Lock()
		r.mapped = map[types.UID]mappedEntry{}
		r.mu.Unlock()
		if _, err := r.Resolve(ctx, pods[i%len(pods)]); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "lookups/cpu-s")
	}
}
