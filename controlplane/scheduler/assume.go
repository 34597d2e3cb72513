package scheduler

import (
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// assumeCache holds what the scheduler decided (and is writing, or wrote) before the informers
// show it, so that the next cycle does not hand out the same devices again.
type assumeCache struct {
	mu     sync.Mutex
	pods   map[types.UID]string // pod → node
	claims map[types.UID]*assumedClaim
	// extended are the extended-resource claims being created, by pod UID: not in the
	// informers at all until the commit creates them, so they are added to the claim list.
	extended map[types.UID]*resourceapi.ResourceClaim
	// gen counts changes (the scheduler's input epoch, epoch.go).
	gen uint64
}

// assumedClaim is a claim as it will be (pending: the commit is writing it) or as the API
// returned it after the write.
type assumedClaim struct {
	claim   *resourceapi.ResourceClaim
	pending bool
}

func newAssumeCache() *assumeCache {
	return &assumeCache{pods: map[types.UID]string{}, claims: map[types.UID]*assumedClaim{}, extended: map[types.UID]*resourceapi.ResourceClaim{}}
}

// assumeExtended records the extended-resource claim (with its allocation) a commit is about
// to create for a pod.
func (a *assumeCache) assumeExtended(pod types.UID, c *resourceapi.ResourceClaim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	a.extended[pod] = c
}

func (a *assumeCache) forgetExtended(pod types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	delete(a.extended, pod)
}

func (a *assumeCache) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	a.pods = map[types.UID]string{}
	a.claims = map[types.UID]*assumedClaim{}
	a.extended = map[types.UID]*resourceapi.ResourceClaim{}
}

func (a *assumeCache) assumePod(uid types.UID, node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	a.pods[uid] = node
}

func (a *assumeCache) assumeClaim(c *resourceapi.ResourceClaim, pending bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	a.claims[c.UID] = &assumedClaim{claim: c, pending: pending}
}

func (a *assumeCache) forgetPod(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	delete(a.pods, uid)
}

func (a *assumeCache) forgetClaim(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen++
	delete(a.claims, uid)
}

// overlay returns the informers' objects with the assumed changes applied; entries that the
// informers have caught up with (or whose objects are gone) are dropped.
func (a *assumeCache) overlay(pods []*v1.Pod, claims []*resourceapi.ResourceClaim) ([]*v1.Pod, []*resourceapi.ResourceClaim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	seenPods := make(map[types.UID]bool, len(a.pods))
	outPods := make([]*v1.Pod, 0, len(pods))
	for _, p := range pods {
		node, ok := a.pods[p.UID]
		if ok {
			seenPods[p.UID] = true
			if p.Spec.NodeName != "" {
				delete(a.pods, p.UID)
			} else {
				p = p.DeepCopy()
				p.Spec.NodeName = node
			}
		}
		outPods = append(outPods, p)
	}
	for uid := range a.pods {
		if !seenPods[uid] {
			delete(a.pods, uid)
		}
	}
	seenClaims := make(map[types.UID]bool, len(a.claims))
	outClaims := make([]*resourceapi.ResourceClaim, 0, len(claims))
	for _, c := range claims {
		assumed, ok := a.claims[c.UID]
		if ok {
			seenClaims[c.UID] = true
			if !assumed.pending && caughtUp(c, assumed.claim) {
				delete(a.claims, c.UID)
			} else {
				c = assumed.claim
			}
		}
		outClaims = append(outClaims, c)
	}
	for uid := range a.claims {
		if !seenClaims[uid] {
			delete(a.claims, uid)
		}
	}
	// Extended-resource claims being created: until the informers show the created claim
	// allocated (or its pod is gone), the assumed one holds its devices.
	if len(a.extended) > 0 {
		livePods := make(map[types.UID]bool, len(pods))
		for _, p := range pods {
			livePods[p.UID] = true
		}
		created := map[types.UID]bool{}
		for _, c := range claims {
			if c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || c.Status.Allocation == nil {
				continue
			}
			for _, o := range c.OwnerReferences {
				created[o.UID] = true
			}
		}
		for pod, c := range a.extended {
			if created[pod] || !livePods[pod] {
				delete(a.extended, pod)
				continue
			}
			outClaims = append(outClaims, c)
		}
	}
	return outPods, outClaims
}

// state returns the change count and whether anything is assumed.
func (a *assumeCache) state() (gen uint64, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gen, len(a.pods)+len(a.claims)+len(a.extended) > 0
}

// caughtUp: the informer has the written version of the claim or a later one.
func caughtUp(informer, written *resourceapi.ResourceClaim) bool {
	if informer.ResourceVersion == written.ResourceVersion {
		return true
	}
	// Resource versions are opaque, but the API server's are increasing integers; when they
	// do not parse, wait for the exact version.
	iv, err1 := strconv.ParseUint(informer.ResourceVersion, 10, 64)
	wv, err2 := strconv.ParseUint(written.ResourceVersion, 10, 64)
	return err1 == nil && err2 == nil && iv > wv
}
