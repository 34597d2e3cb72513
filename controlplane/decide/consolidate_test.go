package decide

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// runningPod adds a bound, running 1-GPU pod of a one-pod gang on a node, owned by a
// ReplicaSet (its workload recreates it when it is evicted).
func (s *sim) runningPod(name, queue, node string, gpu int, mutate ...func(*v1alpha1.PodGroup)) {
	s.seq++
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pg-" + name), Generation: 1, ResourceVersion: "1",
		CreationTimestamp: metav1.NewTime(s.now.Add(time.Duration(s.seq) * time.Second))}, Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: queue}}
	for _, m := range mutate {
		m(pg)
	}
	s.pgs["ns/"+name] = pg
	c := fixture.AllocatedClaim("ns", name, node, fmt.Sprintf("gpu-%d", gpu))
	p := fixture.Pod("ns", name, c.Name)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: p.UID}}
	p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: name}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs", Controller: ptr.To(true)}}
	p.Spec.NodeName, p.Status.Phase, p.ResourceVersion = node, v1.PodRunning, "1"
	s.claims["ns/"+c.Name] = c
	s.pods["ns/"+name] = p
}

// The consolidation case: 4 nodes × 8 GPUs, each with four 1-GPU pods (those on
// node d non-preemptible); a gang of 2 pods × 8 GPUs does not fit although 16 GPUs are free.
// The fewest pods are moved to free two whole nodes (never the non-preemptible ones), the
// freed nodes are kept for the gang, the moved pods run again elsewhere and the gang binds.
func TestConsolidationFreesWholeNodes(t *testing.T) {
	s := newSim(t)
	for _, n := range []string{"a", "b", "c", "d"} {
		s.node(n, 8)
		for i := range 4 {
			var m []func(*v1alpha1.PodGroup)
			if n == "d" {
				m = append(m, notPreemptible)
			}
			s.runningPod(fmt.Sprintf("%s-p%d", n, i), "q", n, i, m...)
		}
	}
	s.queue("q", "", "", "", 1)
	s.gang("big", "q", 2, 8)
	d := s.cycle(time.Second)
	if len(d.Evictions) != 8 {
		t.Fatalf("evicted %d pods (%v), want the 8 of two nodes", len(d.Evictions), evictedGangs(d))
	}
	// One node freed does not make the gang fit, two do: two sets, both consolidation's.
	if d.VictimSetsSimulated != 2 || d.VictimSetsByRule[RuleConsolidation] != 2 || d.VictimSetsByRule[RulePreemption]+d.VictimSetsByRule[RuleReclaim] != 0 {
		t.Errorf("victim sets simulated %d by rule %v, want 2, all consolidation's", d.VictimSetsSimulated, d.VictimSetsByRule)
	}
	freed := map[string]bool{}
	for _, p := range d.Evictions {
		if p.Spec.NodeName == "d" {
			t.Fatalf("non-preemptible pod %s moved", p.Name)
		}
		freed[p.Spec.NodeName] = true
		// Its ReplicaSet recreates it.
		s.pod(p.Name, p.Name, 1)
		np := s.pods["ns/"+p.Name]
		np.UID += "-again"
		np.OwnerReferences = p.OwnerReferences
	}
	if r := eventReasons(d); !strings.Contains(r, ReasonConsolidating) || !strings.Contains(r, ReasonMoved) {
		t.Errorf("events %s lack Consolidating/Moved", r)
	}
	// A gang of another queue comes, which ranks before q's: the freed nodes are kept for big.
	s.queue("r", "", "", "", 1)
	s.gang("intruder", "r", 1, 8)
	s.cycle(time.Second)
	for _, p := range s.pods {
		if p.Annotations[v1alpha1.PodGroupAnnotation] == "intruder" && freed[p.Spec.NodeName] {
			t.Fatalf("intruder took freed node %s, reserved for big", p.Spec.NodeName)
		}
	}
	s.cycle(time.Second)
	if got := boundPods(s, "big"); got != 2 {
		t.Fatalf("big has %d pods bound, want 2", got)
	}
	for _, p := range s.pods {
		if p.Spec.NodeName == "" && p.Annotations[v1alpha1.PodGroupAnnotation] != "intruder" {
			t.Fatalf("pod %s does not run again", p.Name)
		}
		if p.Annotations[v1alpha1.PodGroupAnnotation] == "big" && !freed[p.Spec.NodeName] {
			t.Errorf("big's pod %s on %s, not on a freed node %v", p.Name, p.Spec.NodeName, freed)
		}
	}
}

// Pods of a gang whose upstream PodGroup says disruptionMode all are never moved one by one:
// with node a's pods so protected (and node d's non-preemptible), the two nodes freed are b
// and c.
func TestConsolidationSkipsDisruptedTogether(t *testing.T) {
	s := newSim(t)
	s.upstream = map[string]*schedulingv1beta1.PodGroup{}
	for _, n := range []string{"a", "b", "c", "d"} {
		s.node(n, 8)
		for i := range 4 {
			var m []func(*v1alpha1.PodGroup)
			if n == "d" {
				m = append(m, notPreemptible)
			}
			name := fmt.Sprintf("%s-p%d", n, i)
			s.runningPod(name, "q", n, i, m...)
			if n == "a" {
				s.upstream["ns/"+name] = &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
					Spec: schedulingv1beta1.PodGroupSpec{DisruptionMode: &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}}}
			}
		}
	}
	s.queue("q", "", "", "", 1)
	s.gang("big", "q", 2, 8)
	d := s.cycle(time.Second)
	freed := map[string]int{}
	for _, p := range d.Evictions {
		freed[p.Spec.NodeName]++
	}
	if len(freed) != 2 || freed["b"] != 4 || freed["c"] != 4 {
		t.Fatalf("moved pods of nodes %v, want the 4 of b and the 4 of c", freed)
	}
}
