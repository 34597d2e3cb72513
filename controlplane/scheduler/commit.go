package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Hooks let tests interrupt a commit the way a crash would.
type Hooks struct {
	// BeforeClaimWrite is called before the n-th claim write of a commit (0-based). An error
	// aborts the commit at once, without undoing anything, like a killed process.
	BeforeClaimWrite func(n int) error
}

// errCrashed marks a commit aborted by a hook: nothing is undone.
var errCrashed = errors.New("commit aborted by hook")

// committer writes a solved gang to the API: for every pod, its claims' allocation and
// reservedFor (optimistic concurrency on resourceVersion), then the pod bindings. On failure it
// undoes the claim writes of pods that are not bound.
type committer struct {
	client      kubernetes.Interface
	hooks       Hooks
	parallelism int
}

// claimWrite is one claim update of a commit.
type claimWrite struct {
	claim      *resourceapi.ResourceClaim
	allocation *resourceapi.AllocationResult // nil: reserve only
	pod        *v1.Pod
	// written is the claim as the API returned it, once done.
	written *resourceapi.ResourceClaim
}

// commitResult tells the caller what reached the API.
type commitResult struct {
	claims []*resourceapi.ResourceClaim // as written (for the assume cache)
	bound  []*v1.Pod
}

func (c *committer) commit(ctx context.Context, res *solver.Result) (*commitResult, error) {
	logger := klog.FromContext(ctx)
	// Claims first, for all pods, so that no pod is bound before every device of the gang is
	// held: a gang never starts half-placed because a later claim conflicted.
	var writes []*claimWrite
	reserveOnly := map[string]bool{}
	for i := range res.Placements {
		p := &res.Placements[i]
		for _, ca := range p.Allocate {
			writes = append(writes, &claimWrite{claim: ca.Claim, allocation: ca.Allocation, pod: p.Pod})
		}
		for _, cl := range p.Reserve {
			reserveOnly[cl.Namespace+"/"+cl.Name] = true
			writes = append(writes, &claimWrite{claim: cl, pod: p.Pod})
		}
	}
	// Allocating writes run in parallel; reserve-only writes of claims shared inside the gang
	// must follow the allocation of the same claim, so they run afterwards, serially.
	var alloc, reserve []*claimWrite
	for _, w := range writes {
		if w.allocation != nil {
			alloc = append(alloc, w)
		} else {
			reserve = append(reserve, w)
		}
	}
	out := &commitResult{}
	n := 0
	var crashed error
	runWrites := func(ws []*claimWrite, parallel int) error {
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		for _, w := range ws {
			if c.hooks.BeforeClaimWrite != nil {
				if err := c.hooks.BeforeClaimWrite(n); err != nil {
					wg.Wait()
					crashed = fmt.Errorf("%w: %w", errCrashed, err)
					return crashed
				}
			}
			n++
			sem <- struct{}{}
			wg.Add(1)
			go func(w *claimWrite) {
				defer func() { <-sem; wg.Done() }()
				written, err := c.writeClaim(ctx, w)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if first == nil {
						first = err
					}
					return
				}
				w.written = written
			}(w)
		}
		wg.Wait()
		return first
	}
	err := runWrites(alloc, c.parallelism)
	if err == nil {
		err = runWrites(reserve, 1)
	}
	if crashed != nil {
		return nil, crashed
	}
	if err != nil {
		c.undo(ctx, writes, nil)
		return nil, fmt.Errorf("write claims: %w", err)
	}
	for _, w := range writes {
		out.claims = append(out.claims, w.written)
	}
	// Bind.
	sem := make(chan struct{}, c.parallelism)
	var wg sync.WaitGroup
	var mu sync.Mutex
	bound := map[*v1.Pod]bool{}
	var firstErr error
	for i := range res.Placements {
		p := &res.Placements[i]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := c.client.CoreV1().Pods(p.Pod.Namespace).Bind(ctx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: p.Pod.UID},
				Target:     v1.ObjectReference{Kind: "Node", Name: p.Node},
			}, metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("bind pod %s to %s: %w", klog.KObj(p.Pod), p.Node, err)
				}
				return
			}
			bound[p.Pod] = true
			out.bound = append(out.bound, p.Pod)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		logger.Info("Binding failed, undoing claims of unbound pods", "err", firstErr, "bound", len(out.bound), "pods", len(res.Placements))
		c.undo(ctx, writes, bound)
		return out, firstErr
	}
	return out, nil
}

// writeClaim adds the finalizer (a normal update; the claim controller clears allocations only
// of claims that carry it), then allocation and reservedFor (status update). Conflicts are
// retried on a fresh copy, which must still be unallocated: someone else allocating the claim
// in between is an error, never an overwrite.
func (c *committer) writeClaim(ctx context.Context, w *claimWrite) (*resourceapi.ResourceClaim, error) {
	claims := c.client.ResourceV1().ResourceClaims(w.claim.Namespace)
	claim := w.claim.DeepCopy()
	refresh := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if refresh {
			fresh, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("get claim %s after conflict: %w", klog.KObj(claim), err)
			}
			claim = fresh
		}
		refresh = true
		if claim.UID != w.claim.UID || claim.DeletionTimestamp != nil {
			return fmt.Errorf("claim %s was deleted or replaced", klog.KObj(claim))
		}
		if w.allocation != nil {
			if claim.Status.Allocation != nil {
				return fmt.Errorf("claim %s got allocated elsewhere in the meantime", klog.KObj(claim))
			}
			if !slices.Contains(claim.Finalizers, resourceapi.Finalizer) {
				claim.Finalizers = append(claim.Finalizers, resourceapi.Finalizer)
				updated, err := claims.Update(ctx, claim, metav1.UpdateOptions{})
				if err != nil {
					return fmt.Errorf("add finalizer to claim %s: %w", klog.KObj(claim), err)
				}
				claim = updated
			}
			claim.Status.Allocation = w.allocation.DeepCopy()
			if claim.Status.Allocation.AllocationTimestamp == nil {
				claim.Status.Allocation.AllocationTimestamp = &metav1.Time{Time: time.Now()}
			}
		} else if claim.Status.Allocation == nil {
			return fmt.Errorf("claim %s is not allocated; cannot reserve it", klog.KObj(claim))
		}
		for _, r := range claim.Status.ReservedFor {
			if r.UID == w.pod.UID {
				return nil
			}
		}
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{
			Resource: "pods", Name: w.pod.Name, UID: w.pod.UID,
		})
		updated, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		claim = updated
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim %s for pod %s: %w", klog.KObj(w.claim), klog.KObj(w.pod), err)
	}
	return claim, nil
}

// undo releases what the commit wrote for pods that are not bound: their reservedFor entries,
// and the allocation when no consumer remains.
func (c *committer) undo(ctx context.Context, writes []*claimWrite, bound map[*v1.Pod]bool) {
	logger := klog.FromContext(ctx)
	// Undo only releases what this commit wrote for pods that are not bound, which is safe
	// even after the scheduler was told to stop; finish it rather than leave it to recovery.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, w := range writes {
		if bound[w.pod] {
			continue
		}
		if err := releaseClaim(ctx, c.client, w.claim.Namespace, w.claim.Name, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.UID == w.pod.UID
		}); err != nil {
			logger.Error(err, "Undo of claim write failed; it is retried when the scheduler rebuilds its state", "claim", klog.KObj(w.claim))
		}
	}
}

// releaseClaim removes the reservedFor entries drop selects, clears the allocation when no
// consumer remains, and then removes the finalizer (as the claim controller does).
func releaseClaim(ctx context.Context, client kubernetes.Interface, namespace, name string, drop func(resourceapi.ResourceClaimConsumerReference) bool) error {
	claims := client.ResourceV1().ResourceClaims(namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		claim, err := claims.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		var keep []resourceapi.ResourceClaimConsumerReference
		for _, r := range claim.Status.ReservedFor {
			if !drop(r) {
				keep = append(keep, r)
			}
		}
		if len(keep) == len(claim.Status.ReservedFor) && (len(keep) > 0 || claim.Status.Allocation == nil) {
			return nil
		}
		claim.Status.ReservedFor = keep
		if len(keep) == 0 {
			claim.Status.Allocation = nil
		}
		claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		if claim.Status.Allocation == nil {
			if i := slices.Index(claim.Finalizers, resourceapi.Finalizer); i >= 0 {
				claim.Finalizers = slices.Delete(claim.Finalizers, i, i+1)
				if _, err := claims.Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
