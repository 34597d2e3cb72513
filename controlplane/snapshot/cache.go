package snapshot

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Cache keeps, across scheduling cycles, what a snapshot derives from objects that did not
// change: objects from informers are replaced, never modified, so an unchanged object is
// the same pointer in the next cycle's lists. One Cache serves the snapshots of one
// scheduler (several per cycle: the cycle's, reclaim's, the empty cluster's). Safe for
// concurrent use.
type Cache struct {
	mu    sync.Mutex
	nodes map[string]*nodeDevices

	// incMu serializes Snapshot calls; inc is their state (incremental.go).
	incMu sync.Mutex
	inc   *incremental
}

// Snapshot returns the snapshot that New(in, cfg) builds, derived from what changed since
// the previous call: the scheduler's snapshot of each cycle. Only that one sequence of
// inputs should go through it: a what-if through it would make the next cycle derive most
// of it again (the cluster without some pods is a WhatIf derived from the state of the
// cycle's snapshot, whatif.go; the empty cluster is built with New).
// A snapshot it returned stays valid after later calls. cfg.Cache is set to c.
func (c *Cache) Snapshot(in Input, cfg Config) *Snapshot {
	c.incMu.Lock()
	defer c.incMu.Unlock()
	key := keyOfConfig(cfg)
	if c.inc == nil || c.inc.key != key {
		cfg.Cache = c
		c.inc = newIncremental(key, defaults(cfg))
	}
	return c.inc.update(in)
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{nodes: map[string]*nodeDevices{}}
}

// nodeDevices returns the pre-selection state of a node, reused while its slices are the
// same objects.
func (c *Cache) nodeDevices(node string, slices []*resourceapi.ResourceSlice, features structured.Features) *nodeDevices {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd := c.nodes[node]; nd != nil && sameSlices(nd.slices, slices) && nd.features == features {
		return nd
	}
	nd := newNodeDevices(slices, features)
	c.nodes[node] = nd
	return nd
}

// retain forgets the nodes not in names (deleted nodes), so the cache holds no more than
// the cluster has.
func (c *Cache) retain(names map[string]*NodeInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n := range c.nodes {
		if _, ok := names[n]; !ok {
			delete(c.nodes, n)
		}
	}
}

func sameSlices(a, b []*resourceapi.ResourceSlice) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
