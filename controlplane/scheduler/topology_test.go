package scheduler_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// TestMultiLevelTopologyRequireBlockPreferRack: 2 blocks × 2 racks × 4 nodes × 8 GPUs and a
// Topology object (block > rack). A 24-GPU gang with "require block, prefer rack" lands in
// one rack of one block; a 48-GPU gang then fits only the other block and lands there; a
// 64-GPU gang waits with a reason naming the largest free block in numbers.
func TestMultiLevelTopologyRequireBlockPreferRack(t *testing.T) {
	e := newEnv(t)
	const blockKey, rackKey = "example.com/block", "example.com/rack"
	topo := &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: e.id + "-dc"},
		Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: blockKey}, {NodeLabel: rackKey}}}}
	if _, err := e.sc.Topologies().Create(e.ctx, topo); err != nil {
		t.Fatalf("create Topology: %v", err)
	}
	t.Cleanup(func() { _ = e.sc.Topologies().Delete(context.Background(), topo.Name) })
	nodeBlock, nodeRack := map[string]string{}, map[string]string{}
	for b := range 2 {
		for r := range 2 {
			for n := range 4 {
				block, rack := fmt.Sprintf("b%d", b), fmt.Sprintf("b%d-r%d", b, r)
				name := e.addNode(fmt.Sprintf("%s-n%d", rack, n), 8, false, map[string]string{blockKey: block, rackKey: rack})
				nodeBlock[name], nodeRack[name] = block, rack
			}
		}
	}
	q := e.addQueue("q", "", "", "", 1)
	constraint := func(pg *v1alpha1.PodGroup) {
		pg.Spec.Topology = &v1alpha1.TopologyConstraint{Required: blockKey, Preferred: rackKey, Topology: topo.Name}
	}
	eight := func(ns, name string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, name, 8) }
	e.startScheduler(defaultOptions())
	where := func(names map[string]bool) (map[string]bool, map[string]bool) {
		blocks, racks := map[string]bool{}, map[string]bool{}
		for _, p := range e.pods() {
			if names[p.Name] {
				blocks[nodeBlock[p.Spec.NodeName]], racks[nodeRack[p.Spec.NodeName]] = true, true
			}
		}
		return blocks, racks
	}
	names := func(pods []*v1.Pod) map[string]bool {
		out := map[string]bool{}
		for _, p := range pods {
			out[p.Name] = true
		}
		return out
	}

	g24 := e.gang("g24", q, 24, gpuClaim, constraint)
	e.waitBound(g24, 60*time.Second)
	blocks24, racks24 := where(names(g24))
	if len(blocks24) != 1 || len(racks24) != 1 {
		t.Fatalf("24-GPU gang on blocks %v, racks %v; want one rack of one block", blocks24, racks24)
	}
	g48 := e.gang("g48", q, 6, eight, constraint)
	e.waitBound(g48, 60*time.Second)
	blocks48, racks48 := where(names(g48))
	if len(blocks48) != 1 || len(racks48) != 2 {
		t.Fatalf("48-GPU gang on blocks %v, racks %v; want both racks of one block", blocks48, racks48)
	}
	for b := range blocks48 {
		if blocks24[b] {
			t.Fatalf("48-GPU gang in block %s, which has only 40 free", b)
		}
	}
	g64 := e.gang("g64", q, 8, eight, constraint)
	c := e.waitCondition("g64", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return strings.Contains(c.Message, "has 40 free (required level "+blockKey+", 2 domains)")
	})
	t.Logf("condition: %s", c.Message)
	if n := e.boundCount(g64); n != 0 {
		t.Fatalf("%d pods of the 64-GPU gang bound", n)
	}
	e.checkClaims()
}
