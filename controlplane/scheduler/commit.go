package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Hooks let tests interrupt a commit the way a crash or a failing API server would.
type Hooks struct {
	// BeforeClaimWrite is called before the n-th claim write of a commit (0-based). An error
	// aborts the commit at once, without undoing anything, like a killed process.
	BeforeClaimWrite func(n int) error
	// BeforeBind is called before each binding attempt of a pod (attempt counts from 0); an
	// error is taken as the binding's failure.
	BeforeBind func(pod *v1.Pod, attempt int) error
}

// errCrashed marks a commit aborted by a hook: nothing is undone.
var errCrashed = errors.New("commit aborted by hook")

// committer writes a solved gang to the API: for every pod, its claims' allocation and
// reservedFor (optimistic concurrency on resourceVersion), its extended-resource claim, its
// volumes (the volume binder's PreBind), then the pod bindings. On failure it undoes what it
// wrote for pods that are not bound; a gang whose binding fails part-way is completed (failed
// bindings retried) or, if that does not succeed within one period, rolled back.
type committer struct {
	client      kubernetes.Interface
	hooks       Hooks
	parallelism int
	clock       clock.Clock
	period      time.Duration
}

// claimWrite is one claim update of a commit.
type claimWrite struct {
	claim      *resourceapi.ResourceClaim
	allocation *resourceapi.AllocationResult // nil: reserve only
	pod        *v1.Pod
	consumer   resourceapi.ResourceClaimConsumerReference
	// created: the claim was created by this commit (a pod's extended-resource claim);
	// undo deletes it.
	created bool
	// written is the claim as the API returned it, once done.
	written *resourceapi.ResourceClaim
}

// commitResult tells the caller what reached the API.
type commitResult struct {
	claims []*resourceapi.ResourceClaim // as written (for the assume cache)
	bound  []*v1.Pod
	// rolledBack: the binding failed part-way and the bound pods were deleted.
	rolledBack bool
	deleted    []*v1.Pod
	// unreleased are claims the commit wrote (allocated, reserved) whose undo failed: they
	// stay allocated in the API, so the caller keeps them assumed as written until the
	// informers show it (forgetting them would let the next cycle see an informer's older
	// copy without the allocation and hand the same devices out again).
	unreleased []*resourceapi.ResourceClaim
}

// completionWindow is how long failed bindings of a partly bound gang are retried.
func (c *committer) completionWindow() time.Duration { return max(c.period, time.Second) }

func (c *committer) commit(ctx context.Context, p *decide.Placement) (*commitResult, error) {
	logger := klog.FromContext(ctx)
	res := p.Result
	// Extended-resource claims are created first (with generateName), so that their writes
	// below work like any other claim's.
	var writes []*claimWrite
	extended := map[types.UID]*resourceapi.ResourceClaim{} // pod → its created claim
	undoCreated := func() {
		for _, cl := range extended {
			c.deleteClaim(ctx, cl)
		}
	}
	for i := range res.Placements {
		pl := &res.Placements[i]
		if pl.Extended == nil {
			continue
		}
		claim := pl.Extended.Claim.DeepCopy()
		claim.Name, claim.UID = "", ""
		created, err := c.client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			undoCreated()
			return nil, fmt.Errorf("create extended-resource claim for pod %s: %w", klog.KObj(pl.Pod), err)
		}
		extended[pl.Pod.UID] = created
		writes = append(writes, &claimWrite{claim: created, allocation: pl.Extended.Allocation, pod: pl.Pod, created: true,
			consumer: resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pl.Pod.Name, UID: pl.Pod.UID}})
	}
	// Claims, for all pods, before any binding: no pod is bound before every device of its
	// gang is held, so a gang never starts half-placed because a later claim conflicted.
	for i := range res.Placements {
		pl := &res.Placements[i]
		for _, ca := range pl.Allocate {
			writes = append(writes, &claimWrite{claim: ca.Claim, allocation: ca.Allocation, pod: pl.Pod, consumer: consumerOf(pl.Pod, pl.Consumers, ca.Claim)})
		}
		for _, cl := range pl.Reserve {
			writes = append(writes, &claimWrite{claim: cl, pod: pl.Pod, consumer: consumerOf(pl.Pod, pl.Consumers, cl)})
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
		return &commitResult{unreleased: c.undo(ctx, writes, nil)}, fmt.Errorf("write claims: %w", err)
	}
	for _, w := range writes {
		out.claims = append(out.claims, w.written)
	}
	// The kubelet finds an extended-resource claim through the pod's status.
	for i := range res.Placements {
		pl := &res.Placements[i]
		if cl := extended[pl.Pod.UID]; cl != nil {
			if err := c.patchExtendedStatus(ctx, pl.Pod, cl, pl.Extended.Mappings); err != nil {
				return &commitResult{unreleased: c.undo(ctx, writes, nil)}, err
			}
		}
	}
	// Volumes: the volume binder's PreBind for every pod that has volumes to bind, in
	// parallel; it waits until the PV controller has bound them.
	if err := c.bindVolumes(ctx, res); err != nil {
		return &commitResult{unreleased: c.undo(ctx, writes, nil)}, err
	}
	// Bind; complete a partial binding within one period, else roll it back.
	bound, unknown, bindErr := c.bindAll(ctx, res)
	out.bound = bound
	if bindErr == nil {
		return out, nil
	}
	boundSet := map[*v1.Pod]bool{}
	for _, pod := range bound {
		boundSet[pod] = true
	}
	if len(bound) > 0 && p.AlreadyBound+len(bound) < p.MinMember {
		// Some pods bound, too few for the gang: evict them so that the gang is not left
		// half-bound (their controllers recreate them and the gang is placed anew). Eviction,
		// like reclaim, is the only way the scheduler takes pods away (it may not delete
		// pods); a PodDisruptionBudget that refuses is retried within the same window.
		logger.Info("Binding failed part-way; rolling back the bound pods", "podGroup", p.Key, "bound", len(bound), "pods", len(res.Placements), "err", bindErr)
		out.rolledBack = true
		for _, pod := range bound {
			if err := c.evict(ctx, pod); err != nil {
				logger.Error(err, "Evict bound pod of a rolled-back gang", "pod", klog.KObj(pod))
				continue
			}
			out.deleted = append(out.deleted, pod)
		}
		boundSet = nil
	}
	// A binding sent when the scheduler was told to stop may still be applied by the API
	// server after the read that found its pod unbound: releasing that pod's claims could
	// leave a bound pod without its devices. They are left as written, for the recovery at
	// the start of the next term (recover.go), which reads what happened: a claim reserved
	// for a pod that is not bound is rolled back there, one of a bound pod kept.
	if len(unknown) > 0 {
		if boundSet == nil {
			boundSet = map[*v1.Pod]bool{}
		}
		for _, pod := range unknown {
			boundSet[pod] = true
		}
		logger.Info("Binding interrupted by a stop; the claims of its pods are left to recovery", "podGroup", p.Key, "pods", len(unknown))
	}
	logger.Info("Binding failed, undoing claims of unbound pods", "err", bindErr, "bound", len(bound), "pods", len(res.Placements))
	out.unreleased = c.undo(ctx, writes, boundSet)
	// Left allocated in the API, like claims whose undo failed: they stay assumed as written.
	for _, w := range writes {
		if w.written != nil && slices.Contains(unknown, w.pod) {
			out.unreleased = append(out.unreleased, w.written)
		}
	}
	return out, bindErr
}

// bindAll binds every pod; bindings that fail with an error that may pass (not a pod that
// is gone) are retried until the completion window has passed. unknown are the pods whose
// binding was cut short by ctx ending: the API server may have applied it or may yet.
func (c *committer) bindAll(ctx context.Context, res *solver.Result) (bound, unknown []*v1.Pod, _ error) {
	deadline := c.clock.Now().Add(c.completionWindow())
	todo := make([]*solver.Placement, 0, len(res.Placements))
	for i := range res.Placements {
		todo = append(todo, &res.Placements[i])
	}
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		sem := make(chan struct{}, c.parallelism)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed []*solver.Placement
		var lastErr error
		final := false
		for _, pl := range todo {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				err := c.bind(ctx, pl, attempt)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, pl)
					lastErr = fmt.Errorf("bind pod %s to %s: %w", klog.KObj(pl.Pod), pl.Node, err)
					if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
						unknown = append(unknown, pl.Pod)
					}
					if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
						final = true // the pod is gone or the binding can never be valid
					}
					return
				}
				bound = append(bound, pl.Pod)
			}()
		}
		wg.Wait()
		if len(failed) == 0 {
			return bound, nil, nil
		}
		if final || ctx.Err() != nil || !c.clock.Now().Add(backoff).Before(deadline) {
			return bound, unknown, lastErr
		}
		unknown = nil
		select {
		case <-ctx.Done():
			return bound, nil, lastErr
		case <-c.clock.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
		todo = failed
	}
}

func (c *committer) bind(ctx context.Context, pl *solver.Placement, attempt int) error {
	if c.hooks.BeforeBind != nil {
		if err := c.hooks.BeforeBind(pl.Pod, attempt); err != nil {
			return err
		}
	}
	err := c.client.CoreV1().Pods(pl.Pod.Namespace).Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pl.Pod.Namespace, Name: pl.Pod.Name, UID: pl.Pod.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: pl.Node},
	}, metav1.CreateOptions{})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		return err
	}
	// The API server may have applied a binding whose answer was lost (a 500 from a load
	// balancer, a cut connection, the scheduler told to stop while the answer was on its
	// way); a retry of it then gets 409 "already assigned". A pod bound to this node is
	// bound: counting it unbound would roll back a gang that runs and release the claims of
	// a pod that holds its devices. The read outlives a stop for that reason: with the
	// cancelled context it would fail, and the undo (which does run after a stop) would
	// release the claims of a bound pod for the next scheduler to give away.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	pod, gerr := c.client.CoreV1().Pods(pl.Pod.Namespace).Get(readCtx, pl.Pod.Name, metav1.GetOptions{})
	if gerr == nil && pod.UID == pl.Pod.UID && pod.Spec.NodeName == pl.Node {
		klog.FromContext(ctx).V(2).Info("Binding failed but the pod is bound to its node: the answer was lost", "pod", klog.KObj(pl.Pod), "node", pl.Node, "err", err)
		return nil
	}
	return err
}

// evict evicts a pod through the Eviction API (with its UID as precondition), retrying
// refusals (a PodDisruptionBudget, 429) for up to the completion window.
func (c *committer) evict(ctx context.Context, pod *v1.Pod) error {
	ctx = context.WithoutCancel(ctx)
	deadline := c.clock.Now().Add(c.completionWindow())
	for {
		err := c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}},
		})
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsTooManyRequests(err) || !c.clock.Now().Before(deadline) {
			return err
		}
		<-c.clock.After(100 * time.Millisecond)
	}
}

// bindVolumes runs the volume binder's PreBind for every pod with volumes. On failure the
// volume writes of every pod of the gang are undone.
func (c *committer) bindVolumes(ctx context.Context, res *solver.Result) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	some := false
	for i := range res.Placements {
		pl := &res.Placements[i]
		if !pl.Volumes.Any() {
			continue
		}
		some = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pl.Volumes.Bind(ctx); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		return nil
	}
	if some {
		for i := range res.Placements {
			c.undoVolumes(ctx, res.Placements[i].Pod)
		}
	}
	return fmt.Errorf("volumes: %w", first)
}

// selectedNodeAnnotation is what the volume binder sets on a claim to be provisioned.
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// undoVolumes takes back the volume binder's writes for a pod whose claims are not bound
// yet: a PersistentVolume's claimRef to the pod's claim, a claim's selected-node annotation.
// A claim the PV controller has bound meanwhile stays bound.
func (c *committer) undoVolumes(ctx context.Context, pod *v1.Pod) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, vol := range pod.Spec.Volumes {
		name := ""
		switch {
		case vol.PersistentVolumeClaim != nil:
			name = vol.PersistentVolumeClaim.ClaimName
		case vol.Ephemeral != nil:
			name = pod.Name + "-" + vol.Name
		default:
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pvc, err := c.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil || pvc.Spec.VolumeName != "" {
				return client404(err)
			}
			if _, ok := pvc.Annotations[selectedNodeAnnotation]; ok {
				delete(pvc.Annotations, selectedNodeAnnotation)
				if _, err := c.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
			pvs, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for i := range pvs.Items {
				pv := &pvs.Items[i]
				if ref := pv.Spec.ClaimRef; ref != nil && ref.UID == pvc.UID && pv.Status.Phase != v1.VolumeBound {
					pv.Spec.ClaimRef = nil
					if _, err := c.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			logger.Error(err, "Undo of volume binding failed", "pod", klog.KObj(pod), "claim", name)
		}
	}
}

func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// patchExtendedStatus writes the mapping of a pod's containers to the requests of its
// extended-resource claim into pod.status.extendedResourceClaimStatus.
func (c *committer) patchExtendedStatus(ctx context.Context, pod *v1.Pod, claim *resourceapi.ResourceClaim, mappings []v1.ContainerExtendedResourceRequest) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"extendedResourceClaimStatus": v1.PodExtendedResourceClaimStatus{
		RequestMappings: mappings, ResourceClaimName: claim.Name,
	}}})
	if err != nil {
		return err
	}
	if _, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("pod %s: extendedResourceClaimStatus: %w", klog.KObj(pod), err)
	}
	return nil
}

// writeClaim adds the finalizer (a normal update; the claim controller clears allocations only
// of claims that carry it), then allocation and reservedFor (status update). Conflicts are
// retried on a fresh copy, which must still be unallocated: someone else allocating the claim
// in between is an error, never an overwrite.
func (c *committer) writeClaim(ctx context.Context, w *claimWrite) (*resourceapi.ResourceClaim, error) {
	claims := c.client.ResourceV1().ResourceClaims(w.claim.Namespace)
	claim := w.claim.DeepCopy()
	// A reserve-only write follows the allocation of the same claim by an earlier pod of the
	// gang: start from the claim as it is now, not as the decision saw it.
	refresh := w.allocation == nil
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
				claim.Status.Allocation.AllocationTimestamp = &metav1.Time{Time: c.clock.Now()}
			}
		} else if claim.Status.Allocation == nil {
			return fmt.Errorf("claim %s is not allocated; cannot reserve it", klog.KObj(claim))
		}
		for _, r := range claim.Status.ReservedFor {
			if r.UID == w.consumer.UID {
				return nil
			}
		}
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, w.consumer)
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
// the allocation when no consumer remains, and the claims it created. It returns the claims
// it wrote and could not release, as written.
func (c *committer) undo(ctx context.Context, writes []*claimWrite, bound map[*v1.Pod]bool) (unreleased []*resourceapi.ResourceClaim) {
	logger := klog.FromContext(ctx)
	// Undo only releases what this commit wrote for pods known to be unbound (the caller
	// counts a pod whose binding a stop cut short as bound: the API server may still apply
	// it, so its claims are left to recovery), which is safe even after the scheduler was
	// told to stop; finish it rather than leave it to recovery.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, w := range writes {
		if bound[w.pod] {
			continue
		}
		if w.created {
			c.deleteClaim(ctx, w.claim)
			continue
		}
		if err := releaseClaim(ctx, c.client, w.claim.Namespace, w.claim.Name, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.UID == w.consumer.UID
		}); err != nil {
			logger.Error(err, "Undo of claim write failed; it is retried when the scheduler rebuilds its state", "claim", klog.KObj(w.claim))
			if w.written != nil {
				unreleased = append(unreleased, w.written)
			}
		}
	}
	return unreleased
}

// deleteClaim removes a claim this commit created, finalizer first.
func (c *committer) deleteClaim(ctx context.Context, claim *resourceapi.ResourceClaim) {
	claims := c.client.ResourceV1().ResourceClaims(claim.Namespace)
	_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return client404(err)
		}
		if i := slices.Index(cur.Finalizers, resourceapi.Finalizer); i >= 0 {
			cur.Finalizers = slices.Delete(cur.Finalizers, i, i+1)
			if _, err := claims.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := claims.Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Error(err, "Delete extended-resource claim", "claim", klog.KObj(claim))
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
