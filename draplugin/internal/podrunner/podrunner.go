// Package podrunner does for tests what the kubelet does with tessera's
// MPS control daemon pods on one node: for each daemon pod bound to the
// node it runs the pod's container — tessera-node mps-daemon with the pod's
// arguments — as sharing.RunDaemon in a goroutine with the tools on PATH
// (the fakes), reports the pod Running, restarts the container when it
// exits with an error (restartPolicy Always), and when the pod is deleted
// stops the container (its context ends, as SIGTERM would: RunDaemon quits
// the daemon) and removes the pod object, as the kubelet does once the
// containers stopped. The daemons live as long as their pods, whatever
// happens to the plugin that created them.
package podrunner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// Runner runs the daemon pods of one node.
type Runner struct {
	client    kubernetes.Interface
	namespace string
	poll      time.Duration

	mu         sync.Mutex
	containers map[string]*container // by pod name
	wg         sync.WaitGroup
	stop       context.CancelFunc
}

type container struct {
	cancel   context.CancelFunc
	done     chan struct{}
	restarts int
	lastErr  error
}

// Start runs the node's daemon pods in namespace until Stop. poll is how
// often each daemon's supervisor asks its daemon (the real pod: 5s).
func Start(ctx context.Context, client kubernetes.Interface, namespace, node string, poll time.Duration) *Runner {
	ctx, cancel := context.WithCancel(ctx)
	r := &Runner{client: client, namespace: namespace, poll: poll, containers: map[string]*container{}, stop: cancel}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{sharing.LabelComponent: sharing.ComponentMPSDaemon}).String()
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.sync(ctx, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { r.sync(ctx, obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				r.kill(p.Name)
			}
		},
	})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	r.wg.Go(func() { <-ctx.Done(); factory.Shutdown() })
	return r
}

// Stop stops every container (as a node shutting down the pods would not:
// the daemons are told to quit) and the watch.
func (r *Runner) Stop() {
	r.mu.Lock()
	for name, c := range r.containers {
		c.cancel()
		delete(r.containers, name)
	}
	r.mu.Unlock()
	r.stop()
	r.wg.Wait()
}

// Restarts says how often the pod's container was restarted.
func (r *Runner) Restarts(pod string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.containers[pod]; c != nil {
		return c.restarts
	}
	return -1
}

func (r *Runner) sync(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		r.kill(p.Name)
		// The containers stopped: the kubelet removes the pod object.
		err := r.client.CoreV1().Pods(p.Namespace).Delete(context.WithoutCancel(ctx), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			klog.FromContext(ctx).Error(err, "Remove deleted daemon pod", "pod", klog.KObj(p))
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.containers[p.Name] != nil {
		return
	}
	var flags sharing.DaemonFlags
	fs := pflag.NewFlagSet("mps-daemon", pflag.ContinueOnError)
	flags.AddFlags(fs)
	if len(p.Spec.Containers) != 1 {
		klog.FromContext(ctx).Error(nil, "Daemon pod has not one container", "pod", klog.KObj(p))
		return
	}
	if err := fs.Parse(p.Spec.Containers[0].Args); err != nil {
		r.fail(ctx, p, fmt.Errorf("parse daemon arguments: %w", err))
		return
	}
	if err := flags.Validate(); err != nil {
		r.fail(ctx, p, err)
		return
	}
	cctx, cancel := context.WithCancel(ctx)
	c := &container{cancel: cancel, done: make(chan struct{})}
	r.containers[p.Name] = c
	// The tools are the fakes on PATH: --chroot (the driver root inside a
	// privileged pod) has no meaning here.
	ex := executor.OS{}
	dirs := sharing.DirsOf(flags.MPSDir, flags.Spec.ID)
	r.wg.Go(func() {
		defer close(c.done)
		r.setRunning(cctx, p, 0)
		for {
			err := sharing.RunDaemon(cctx, ex, flags.Spec, dirs, r.poll)
			if cctx.Err() != nil {
				return
			}
			r.mu.Lock()
			c.restarts++
			c.lastErr = err
			n := c.restarts
			r.mu.Unlock()
			klog.FromContext(cctx).Info("Daemon container exited, restarting", "pod", klog.KObj(p), "err", err, "restarts", n)
			r.setRunning(cctx, p, n)
			select {
			case <-cctx.Done():
				return
			case <-time.After(r.poll):
			}
		}
	})
}

// kill stops a pod's container and waits for it.
func (r *Runner) kill(name string) {
	r.mu.Lock()
	c := r.containers[name]
	delete(r.containers, name)
	r.mu.Unlock()
	if c != nil {
		c.cancel()
		<-c.done
	}
}

func (r *Runner) setRunning(ctx context.Context, p *corev1.Pod, restarts int) {
	now := metav1.Now()
	st := p.DeepCopy()
	st.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: sharing.DaemonContainer, Ready: true, Started: ptr.To(true), RestartCount: int32(restarts), Image: p.Spec.Containers[0].Image,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if _, err := r.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, st, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.FromContext(ctx).Error(err, "Report daemon pod running", "pod", klog.KObj(p))
	}
}

func (r *Runner) fail(ctx context.Context, p *corev1.Pod, err error) {
	st := p.DeepCopy()
	st.Status = corev1.PodStatus{Phase: corev1.PodFailed, Message: err.Error(), Reason: "BadArguments"}
	_, _ = r.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, st, metav1.UpdateOptions{})
}
