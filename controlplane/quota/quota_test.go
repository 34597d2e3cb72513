package quota

import (
	"math/rand"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

func queue(name, parent string, quota, limit string, weight int32) *v1alpha1.Queue {
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent}}
	rq := &v1alpha1.ResourceQuota{OverQuotaWeight: ptr.To(weight)}
	if quota != "" {
		rq.Quota = ptr.To(resource.MustParse(quota))
	}
	if limit != "" {
		rq.Limit = ptr.To(resource.MustParse(limit))
	}
	q.Spec.Resources.GPU = rq
	return q
}

func gpus(n float64) Usage { return Usage{v1alpha1.ResourceGPU: n} }

func TestParentLoopsAndMissingParents(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{
		queue("a", "b", "", "", 1), queue("b", "c", "", "", 1), queue("c", "a", "", "", 1),
		queue("orphan", "gone", "", "", 1), queue("ok", "", "", "", 1),
	})
	for _, name := range []string{"a", "b", "c"} {
		if n := tree.Get(name); n.InvalidReason != v1alpha1.ReasonParentLoop || !strings.Contains(n.Invalid, "parent loop") {
			t.Errorf("%s: invalid = %q (%s), want a parent loop", name, n.Invalid, n.InvalidReason)
		}
	}
	if n := tree.Get("orphan"); n.InvalidReason != v1alpha1.ReasonParentNotFound {
		t.Errorf("orphan: %q", n.Invalid)
	}
	if ok, why := tree.Admit("a", gpus(1)); ok || !strings.Contains(why, "parent loop") {
		t.Errorf("Admit into a loop = %v %q", ok, why)
	}
	if ok, _ := tree.Admit("ok", gpus(1)); !ok {
		t.Error("valid root queue refused")
	}
}

func TestLimitAlongThePath(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{queue("org", "", "8", "10", 1), queue("team", "org", "4", "", 1)})
	tree.Charge("team", gpus(9))
	ok, why := tree.Admit("team", gpus(2))
	if ok || !strings.Contains(why, `queue "org" would use 11 of gpu, above its limit 10`) {
		t.Fatalf("Admit = %v %q", ok, why)
	}
	if ok, _ := tree.Admit("team", gpus(1)); !ok {
		t.Fatal("1 GPU up to the limit refused")
	}
}

func TestZeroWeightNeverBorrows(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{queue("q", "", "4", "", 0)})
	tree.Charge("q", gpus(4))
	if ok, why := tree.Admit("q", gpus(1)); ok || !strings.Contains(why, "overQuotaWeight is 0") {
		t.Fatalf("Admit = %v %q", ok, why)
	}
}

// TestBorrowingByWeight: 16 idle GPUs, queues a (quota 4, weight 1) and b (quota 4, weight 3)
// each want far more. Placing one-GPU gangs in rank order gives each its quota, then the 8
// idle GPUs 1:3.
func TestBorrowingByWeight(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{queue("a", "", "4", "", 1), queue("b", "", "4", "", 3)})
	for placed := 0; placed < 16; placed++ {
		next := "a"
		if tree.RankOf("b", gpus(1)).Less(tree.RankOf("a", gpus(1))) {
			next = "b"
		}
		if ok, why := tree.Admit(next, gpus(1)); !ok {
			t.Fatal(why)
		}
		tree.Charge(next, gpus(1))
		if placed == 7 {
			if a, b := tree.Get("a").Allocated[v1alpha1.ResourceGPU], tree.Get("b").Allocated[v1alpha1.ResourceGPU]; a != 4 || b != 4 {
				t.Fatalf("after 8 GPUs: a=%g b=%g, want both at quota 4", a, b)
			}
		}
	}
	if a, b := tree.Get("a").Allocated[v1alpha1.ResourceGPU], tree.Get("b").Allocated[v1alpha1.ResourceGPU]; a != 6 || b != 10 {
		t.Fatalf("a=%g b=%g, want 6 and 10 (idle 8 shared 1:3)", a, b)
	}
}

// TestLimitInvariantRandom admits random gangs into a random hierarchy and checks after every
// admission that no queue is above its limit.
func TestLimitInvariantRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	tree := Build([]*v1alpha1.Queue{
		queue("root", "", "32", "40", 1), queue("x", "root", "8", "12", 1), queue("y", "root", "8", "30", 2),
		queue("x1", "x", "4", "6", 1), queue("x2", "x", "4", "", 1),
	})
	leaves := []string{"x1", "x2", "y"}
	admitted := 0
	for i := 0; i < 500; i++ {
		q := leaves[rng.Intn(len(leaves))]
		u := gpus(float64(1 + rng.Intn(4)))
		if ok, _ := tree.Admit(q, u); ok {
			tree.Charge(q, u)
			admitted++
		}
		for _, n := range tree.Nodes() {
			if lim, ok := n.lim.limit[v1alpha1.ResourceGPU]; ok && n.Allocated[v1alpha1.ResourceGPU] > lim {
				t.Fatalf("queue %s at %g above limit %g", n.Queue.Name, n.Allocated[v1alpha1.ResourceGPU], lim)
			}
		}
	}
	if admitted == 0 || tree.Get("root").Allocated[v1alpha1.ResourceGPU] < 37 {
		t.Fatalf("admitted %d gangs, root at %g: the test should fill the root close to its limit", admitted, tree.Get("root").Allocated[v1alpha1.ResourceGPU])
	}
}

func TestNoGPUQuotaMeansBorrowing(t *testing.T) {
	none := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "none"}}
	tree := Build([]*v1alpha1.Queue{none, queue("q", "", "4", "", 1)})
	if !tree.RankOf("none", gpus(1)).Borrowing {
		t.Error("a GPU gang of a queue without GPU quota is not borrowing")
	}
	if tree.RankOf("none", Usage{v1alpha1.ResourceCPU: 2}).Borrowing {
		t.Error("a CPU-only gang borrows from a queue without any quota")
	}
	if tree.RankOf("q", Usage{v1alpha1.ResourceGPU: 1, v1alpha1.ResourceCPU: 2}).Borrowing {
		t.Error("CPU without a CPU quota made a gang within its GPU quota borrow")
	}
}
