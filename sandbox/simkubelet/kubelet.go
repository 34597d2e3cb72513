// Package simkubelet is a simulated kubelet for tests, benchmarks and the
// sandbox. For each pod bound to its node it does what the real kubelet does
// with DRA: it calls NodePrepareResources on the driver's plugin over the
// plugin's real registration and DRA gRPC sockets, marks the pod Running,
// completes it after the duration in the annotation tessera.dev/sim-duration,
// and calls NodeUnprepareResources once the pod has terminated or is deleted;
// the deletion of the pod object waits for that. A prepare that fails leaves
// the pod Pending with the kubelet's FailedPrepareDynamicResources event and
// is retried. It runs no containers. docs/testing.md lists what it does
// differently from the real kubelet (test/e2e/realnode runs that one).
package simkubelet

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// EventFailedPrepare is the pod event of a failed prepare, as the kubelet names it.
const EventFailedPrepare = "FailedPrepareDynamicResources"

const (
	// AnnotationDuration makes a pod succeed this long after it started
	// (a Go duration, e.g. "90s"); without it the pod runs until deleted.
	AnnotationDuration = "tessera.dev/sim-duration"
	// AnnotationExitCode is the exit code the pod ends with after its duration;
	// non-zero makes it Failed.
	AnnotationExitCode = "tessera.dev/sim-exit-code"
)

// Options configure a simulated kubelet.
type Options struct {
	NodeName string
	Client   kubernetes.Interface
	// RegistryDir is the kubelet plugins_registry directory that DRA plugins
	// put their registration sockets in.
	RegistryDir string
	// Labels are set on the Node object.
	Labels map[string]string
	// CPU, Memory and Pods are the node's capacity (defaults: 128 CPUs, 1Ti, 256 pods).
	CPU, Memory resource.Quantity
	Pods        int64
	// StateFile, when set, is where the kubelet keeps which claims it
	// prepared for which pods, as the real kubelet keeps its DRA checkpoint
	// (dra_manager_state): a simulated kubelet restarted on the same file
	// does not prepare the claims of running pods again.
	StateFile string
}

// Kubelet is a running simulated kubelet.
type Kubelet struct {
	opts     Options
	plugins  *pluginRegistry
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	podStore cache.Indexer

	mu    sync.Mutex
	state map[types.UID]*podState
	// gone are pods whose object was deleted before their claims were
	// unprepared (a terminal pod is deleted at once), by key: the
	// unprepare is retried until it succeeds, as the real kubelet's pod
	// workers retry it, so that a plugin that is down (killed, restarting)
	// when the pod goes does not leave the claims prepared for ever.
	gone map[string]*corev1.Pod
	log  *Ledger

	// saveMu makes each state save (snapshot and write) one step, so that
	// concurrent saves neither race on the temporary file nor write an
	// older snapshot over a newer one.
	saveMu sync.Mutex

	// callMu makes each plugin call and its ledger entry one step, so that
	// the ledger's order is the order in which the plugins handled the calls
	// (the upstream helper serializes them anyway).
	callMu sync.Mutex
}

type podState struct {
	prepared bool
	claims   map[string][]*drapb.Claim // by driver
	done     bool                      // unprepared after termination
}

// New returns a simulated kubelet; Run starts it.
func New(opts Options) *Kubelet {
	if opts.CPU.IsZero() {
		opts.CPU = resource.MustParse("128")
	}
	if opts.Memory.IsZero() {
		opts.Memory = resource.MustParse("1Ti")
	}
	if opts.Pods == 0 {
		opts.Pods = 256
	}
	return &Kubelet{
		opts:    opts,
		plugins: newPluginRegistry(opts.RegistryDir),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		state:   map[types.UID]*podState{},
		gone:    map[string]*corev1.Pod{},
		log:     &Ledger{},
	}
}

// Ledger returns the record of every prepare and unprepare call, for tests.
func (k *Kubelet) Ledger() *Ledger { return k.log }

// Run registers the Node and handles its pods until ctx is cancelled. It
// returns after every goroutine it started has ended.
func (k *Kubelet) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", k.opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if err := k.loadState(); err != nil {
		return err
	}
	if err := k.registerNode(ctx); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.opts.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	k.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: k.opts.NodeName})
	defer k.plugins.close()

	factory := informers.NewSharedInformerFactoryWithOptions(k.opts.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.opts.NodeName).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	k.podStore = podInformer.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				key, err := cache.MetaNamespaceKeyFunc(pod)
				if err != nil {
					return
				}
				k.mu.Lock()
				k.gone[key] = pod
				k.mu.Unlock()
				k.queue.Add(key)
			}
		},
	}); err != nil {
		return fmt.Errorf("pod event handler: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		return fmt.Errorf("pod informer of node %s did not sync: %w", k.opts.NodeName, ctx.Err())
	}
	k.forgetOrphans()

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for k.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	return nil
}

func (k *Kubelet) registerNode(ctx context.Context) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: k.opts.NodeName, Labels: map[string]string{corev1.LabelHostname: k.opts.NodeName}},
	}
	for key, v := range k.opts.Labels {
		node.Labels[key] = v
	}
	created, err := k.opts.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = k.opts.Client.CoreV1().Nodes().Get(ctx, k.opts.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", k.opts.NodeName, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    k.opts.CPU,
		corev1.ResourceMemory: k.opts.Memory,
		corev1.ResourcePods:   *resource.NewQuantity(k.opts.Pods, resource.DecimalSI),
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated kubelet is ready", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: k.opts.NodeName}},
		NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "v1.37.2-sim", OperatingSystem: "linux", Architecture: "amd64"},
	}
	updated, err := k.opts.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("set status of node %s: %w", k.opts.NodeName, err)
	}
	// The API server taints every new Node not-ready (TaintNodesByCondition);
	// in a real cluster the node lifecycle controller lifts the taint once the
	// kubelet reports Ready. The test control plane runs no such controller,
	// because simulated nodes send no heartbeats, so lift it here.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var kept []corev1.Taint
		for _, t := range updated.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(updated.Spec.Taints) {
			return nil
		}
		updated.Spec.Taints = kept
		_, err := k.opts.Client.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			updated, _ = k.opts.Client.CoreV1().Nodes().Get(ctx, k.opts.NodeName, metav1.GetOptions{})
		}
		return err
	})
}

func (k *Kubelet) processNext(ctx context.Context) bool {
	key, shutdown := k.queue.Get()
	if shutdown {
		return false
	}
	defer k.queue.Done(key)
	requeueAfter, err := k.sync(ctx, key)
	switch {
	case err != nil:
		klog.FromContext(ctx).V(2).Info("Retrying pod", "pod", key, "err", err)
		k.queue.AddRateLimited(key)
	case requeueAfter > 0:
		k.queue.Forget(key)
		k.queue.AddAfter(key, requeueAfter)
	default:
		k.queue.Forget(key)
	}
	return true
}

func (k *Kubelet) sync(ctx context.Context, key string) (time.Duration, error) {
	obj, exists, err := k.podStore.GetByKey(key)
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	gone := k.gone[key]
	k.mu.Unlock()
	if gone != nil && (!exists || obj.(*corev1.Pod).UID != gone.UID) {
		if err := k.forget(ctx, key, gone); err != nil {
			return 0, err // retried (rate limited) until the plugin answers
		}
	}
	if !exists {
		return 0, nil
	}
	pod := obj.(*corev1.Pod)
	switch {
	case pod.DeletionTimestamp != nil:
		if err := k.unprepare(ctx, pod); err != nil {
			return 0, err
		}
		// The kubelet confirms the deletion once the containers are gone.
		err := k.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return 0, fmt.Errorf("finish deleting pod: %w", err)
		}
		return 0, nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return 0, k.unprepare(ctx, pod)
	case pod.Status.Phase == corev1.PodRunning:
		if !k.isPrepared(pod.UID) {
			// Restarted without a StateFile: the real kubelet would know
			// from its checkpoint; prepare again (plugins treat it as a no-op).
			if err := k.prepare(ctx, pod); err != nil {
				return 0, err
			}
		}
		return k.maybeComplete(ctx, pod)
	default: // Pending and bound to this node
		// As the real kubelet: a prepare that fails leaves the pod Pending
		// (it never gets a sandbox) and is retried.
		if err := k.prepare(ctx, pod); err != nil {
			return 0, err
		}
		if err := k.setRunning(ctx, pod); err != nil {
			return 0, err
		}
		return durationOf(pod), nil
	}
}

// prepare calls NodePrepareResources for every claim of the pod, grouped by
// driver. An error means try again: the claim is not allocated and reserved
// yet, the driver is not registered, the call failed, or the plugin failed a
// claim; the last three are the pod's FailedPrepareDynamicResources event,
// with the real kubelet's wording.
func (k *Kubelet) prepare(ctx context.Context, pod *corev1.Pod) error {
	byDriver := map[string][]*drapb.Claim{}
	for i := range pod.Spec.ResourceClaims {
		name, mustCheckOwner, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return fmt.Errorf("claim %s of pod: %w", pod.Spec.ResourceClaims[i].Name, err)
		}
		if name == nil {
			continue // the pod does not need this claim
		}
		claim, err := k.opts.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get claim %s: %w", *name, err)
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
				return err
			}
		}
		if claim.Status.Allocation == nil || !reservedFor(claim, pod.UID) {
			return fmt.Errorf("claim %s is not allocated and reserved for the pod yet", *name)
		}
		drivers := map[string]bool{}
		for _, r := range claim.Status.Allocation.Devices.Results {
			drivers[r.Driver] = true
		}
		for d := range drivers {
			byDriver[d] = append(byDriver[d], &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)})
		}
	}
	failed := func(err error) error {
		k.recorder.Eventf(pod, corev1.EventTypeWarning, EventFailedPrepare, "Failed to prepare dynamic resources: prepare dynamic resources: %v", err)
		return err
	}
	for driver, claims := range byDriver {
		plugin, err := k.plugin(ctx, driver)
		if err != nil {
			return failed(err)
		}
		k.callMu.Lock()
		resp, err := plugin.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
		if err == nil {
			for _, c := range claims {
				if r := resp.Claims[c.Uid]; r != nil && r.Error == "" {
					k.log.recordPrepare(pod, driver, c, r.Devices)
				}
			}
		}
		k.callMu.Unlock()
		if err != nil {
			return failed(fmt.Errorf("NodePrepareResources failed for driver %s: %w", driver, err))
		}
		for _, c := range claims {
			r := resp.Claims[c.Uid]
			if r == nil {
				return failed(fmt.Errorf("NodePrepareResources skipped 1 ResourceClaim"))
			}
			if r.Error != "" {
				return failed(fmt.Errorf("NodePrepareResources failed for ResourceClaim %s: %s", c.Name, r.Error))
			}
		}
	}
	k.mu.Lock()
	k.state[pod.UID] = &podState{prepared: true, claims: byDriver}
	k.mu.Unlock()
	k.saveState(ctx)
	return nil
}

func (k *Kubelet) plugin(ctx context.Context, driver string) (*draPlugin, error) {
	if p := k.plugins.get(driver); p != nil && !k.plugins.changed() {
		return p, nil
	}
	// A rescan may replace a connection: not under a call in flight.
	k.callMu.Lock()
	err := k.plugins.scan(ctx)
	k.callMu.Unlock()
	if err != nil {
		return nil, err
	}
	if p := k.plugins.get(driver); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("DRA driver %s is not registered", driver)
}

// unprepare calls NodeUnprepareResources once for a pod that was prepared.
func (k *Kubelet) unprepare(ctx context.Context, pod *corev1.Pod) error {
	k.mu.Lock()
	st := k.state[pod.UID]
	k.mu.Unlock()
	if st == nil || !st.prepared || st.done {
		return nil
	}
	for driver, claims := range st.claims {
		plugin, err := k.plugin(ctx, driver)
		if err != nil {
			return err
		}
		k.callMu.Lock()
		resp, err := plugin.client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
		if err == nil {
			for _, c := range claims {
				if r := resp.Claims[c.Uid]; r == nil || r.Error == "" {
					k.log.recordUnprepare(pod, driver, c)
				}
			}
		}
		k.callMu.Unlock()
		if err != nil {
			return fmt.Errorf("NodeUnprepareResources on %s: %w", driver, err)
		}
		for _, c := range claims {
			if r := resp.Claims[c.Uid]; r != nil && r.Error != "" {
				return fmt.Errorf("unprepare claim %s with %s: %s", c.Name, driver, r.Error)
			}
		}
	}
	k.mu.Lock()
	st.done = true
	k.mu.Unlock()
	k.saveState(ctx)
	return nil
}

// forget runs when the pod object is gone: unprepare if that has not
// happened, then drop the pod. An error leaves it to be retried.
func (k *Kubelet) forget(ctx context.Context, key string, pod *corev1.Pod) error {
	if err := k.unprepare(ctx, pod); err != nil {
		klog.FromContext(ctx).Error(err, "Unprepare for deleted pod failed; retrying", "pod", klog.KObj(pod))
		return err
	}
	k.mu.Lock()
	delete(k.state, pod.UID)
	if k.gone[key] == pod {
		delete(k.gone, key)
	}
	k.mu.Unlock()
	k.saveState(ctx)
	return nil
}

// forgetOrphans queues the pods of the state file that are not on the node
// any more (deleted while this kubelet was down) to be unprepared and
// dropped, as the real kubelet's DRA manager reconciles its checkpoint with
// the active pods. Their key is orphanKeyPrefix+UID, which names no pod.
func (k *Kubelet) forgetOrphans() {
	live := map[types.UID]bool{}
	for _, obj := range k.podStore.List() {
		live[obj.(*corev1.Pod).UID] = true
	}
	var keys []string
	k.mu.Lock()
	for uid := range k.state {
		if !live[uid] {
			key := orphanKeyPrefix + string(uid)
			k.gone[key] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: string(uid), UID: uid}}
			keys = append(keys, key)
		}
	}
	k.mu.Unlock()
	for _, key := range keys {
		k.queue.Add(key)
	}
}

// orphanKeyPrefix: a namespace no pod can have (it is not a DNS label).
const orphanKeyPrefix = "orphan:/"

func (k *Kubelet) isPrepared(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.state[uid]
	return st != nil && st.prepared
}

func (k *Kubelet) setRunning(ctx context.Context, pod *corev1.Pod) error {
	return k.updateStatus(ctx, pod, func(p *corev1.Pod) {
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.HostIP = "127.0.0.1"
		p.Status.StartTime = &now
		for _, t := range []corev1.PodConditionType{corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
			setCondition(p, t, now)
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: new(bool),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
	})
}

func (k *Kubelet) maybeComplete(ctx context.Context, pod *corev1.Pod) (time.Duration, error) {
	d := durationOf(pod)
	if d == 0 || pod.Status.StartTime == nil {
		return 0, nil
	}
	if left := time.Until(pod.Status.StartTime.Add(d)); left > 0 {
		return left, nil
	}
	code, _ := strconv.Atoi(pod.Annotations[AnnotationExitCode])
	phase := corev1.PodSucceeded
	reason := "Completed"
	if code != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	if err := k.setPhase(ctx, pod, phase, reason, fmt.Sprintf("simulated run of %s ended with exit code %d", d, code), int32(code)); err != nil {
		return 0, err
	}
	return 0, nil
}

func (k *Kubelet) setPhase(ctx context.Context, pod *corev1.Pod, phase corev1.PodPhase, reason, message string, exitCode int32) error {
	return k.updateStatus(ctx, pod, func(p *corev1.Pod) {
		now := metav1.Now()
		p.Status.Phase = phase
		p.Status.Reason = reason
		p.Status.Message = message
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: exitCode, Reason: reason, Message: message, FinishedAt: now,
				}},
			})
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status = corev1.ConditionFalse
				p.Status.Conditions[i].LastTransitionTime = now
			}
		}
	})
}

func (k *Kubelet) updateStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.Pod)) error {
	pods := k.opts.Client.CoreV1().Pods(pod.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.UID != pod.UID {
			return nil // replaced by another pod of the same name
		}
		mutate(current)
		_, err = pods.UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
}

func setCondition(p *corev1.Pod, t corev1.PodConditionType, now metav1.Time) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			p.Status.Conditions[i].Status = corev1.ConditionTrue
			p.Status.Conditions[i].LastTransitionTime = now
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

func reservedFor(claim *resourceapi.ResourceClaim, uid types.UID) bool {
	for _, r := range claim.Status.ReservedFor {
		if r.UID == uid {
			return true
		}
	}
	return false
}

func durationOf(pod *corev1.Pod) time.Duration {
	d, err := time.ParseDuration(pod.Annotations[AnnotationDuration])
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// Wait polls until cond holds, for tests of code that drives simulated nodes.
func Wait(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, cond)
}
