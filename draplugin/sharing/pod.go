package sharing

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Labels and annotations of daemon pods.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	// ComponentMPSDaemon marks a claim's MPS control daemon pod.
	ComponentMPSDaemon = "mps-control-daemon"
	// LabelClaimUID holds the claim UID (the daemon ID).
	LabelClaimUID = "gpu.tessera.dev/claim-uid"
	// AnnotationClaim holds the claim's namespace/name.
	AnnotationClaim = "gpu.tessera.dev/claim"
	// DaemonContainer is the daemon pod's container.
	DaemonContainer = "mps-control-daemon"
	// podPrefix starts every daemon pod's name; the claim UID follows.
	podPrefix = "tessera-mps-"
	// podDriverRoot is where the chroot variant mounts the driver root.
	podDriverRoot = "/driver-root"
)

// DefaultDaemonCommand is what a daemon pod runs: tessera-node's
// mps-daemon command (sharing.RunDaemon) with DaemonFlags.
var DefaultDaemonCommand = []string{"/usr/bin/tessera-node", "mps-daemon"}

// PodName is the name of the daemon pod of claim uid.
func PodName(id string) string { return podPrefix + id }

// PodLauncher runs each claim's MPS control daemon in a pod of its own,
// bound to the node, in tessera's namespace: a crash, OOM kill or rolling
// update of tessera-node does not touch it, and the next tessera-node
// adopts it (it asks the daemon, through the pipe directory both see).
// This is what NVIDIA's DRA driver does (a daemon per claim in its own pod)
// and why: a process tessera-node starts lives in tessera-node's container
// cgroup, which the runtime kills with the container.
type PodLauncher struct {
	Client    kubernetes.Interface
	Namespace string
	NodeName  string
	// Image is tessera's image (tessera-node mps-daemon runs in the pod).
	Image      string
	PullPolicy corev1.PullPolicy
	// Command overrides DefaultDaemonCommand.
	Command []string
	// MPSDir is the host's MPS directory (the same path in tessera-node).
	MPSDir string
	// RuntimeClassName, when set (the NVIDIA runtime class), gives the pod
	// the driver's user space and exactly the claim's devices
	// (NVIDIA_VISIBLE_DEVICES), unprivileged. Empty: the pod is privileged,
	// mounts HostDriverRoot and runs the MPS tools chrooted into it, as
	// NVIDIA's MPS daemon pod does.
	RuntimeClassName string
	HostDriverRoot   string
	// PriorityClassName of the pods (tessera-node's: evicting a daemon
	// kills its claim's workloads).
	PriorityClassName string
	Resources         corev1.ResourceRequirements
}

var _ Launcher = (*PodLauncher)(nil)

// Name implements Launcher.
func (l *PodLauncher) Name() string { return "pod" }

// Pod builds the daemon pod of a spec.
func (l *PodLauncher) Pod(spec DaemonSpec, dirs Dirs) *corev1.Pod {
	hostPathDir := corev1.HostPathDirectory
	flags := DaemonFlags{Spec: spec, MPSDir: l.MPSDir}
	mounts := []corev1.VolumeMount{
		{Name: "mps", MountPath: dirs.Root},
		{Name: "shm", MountPath: ContainerShmDir},
	}
	volumes := []corev1.Volume{
		{Name: "mps", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dirs.Root, Type: &hostPathDir}}},
		{Name: "shm", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dirs.Shm, Type: &hostPathDir}}},
	}
	var env []corev1.EnvVar
	// Root with the runtime's default capabilities: the MPS control daemon
	// starts each server as the user of its first client (setuid/setgid),
	// in a host directory the plugin created as root. Otherwise as Pod
	// Security restricted asks: no privilege escalation, RuntimeDefault
	// seccomp. The pod needs the privileged level all the same (hostPID
	// and hostPath volumes, below); docs/install.md names each exception.
	sc := &corev1.SecurityContext{
		RunAsUser:                ptr.To[int64](0),
		AllowPrivilegeEscalation: ptr.To(false),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	var runtimeClass *string
	if l.RuntimeClassName != "" {
		// The NVIDIA runtime injects the MPS tools and libcuda matching the
		// host's driver, and the device nodes of exactly these devices.
		runtimeClass = ptr.To(l.RuntimeClassName)
		env = []corev1.EnvVar{
			{Name: "NVIDIA_VISIBLE_DEVICES", Value: strings.Join(spec.Devices, ",")},
			{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "compute,utility"},
		}
	} else {
		// Privileged: the device cgroup admits the GPUs; the MPS tools run
		// chrooted into the driver root, which sees the claim's directories
		// at their host paths.
		flags.Chroot = podDriverRoot
		sc = &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}
		toHost := corev1.MountPropagationHostToContainer
		mounts = []corev1.VolumeMount{
			{Name: "driver-root", MountPath: podDriverRoot, ReadOnly: true, MountPropagation: &toHost},
			{Name: "mps", MountPath: filepath.Join(podDriverRoot, dirs.Root)},
			{Name: "shm", MountPath: filepath.Join(podDriverRoot, ContainerShmDir)},
		}
		volumes = append(volumes, corev1.Volume{Name: "driver-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: l.HostDriverRoot, Type: &hostPathDir}}})
	}
	command := l.Command
	if len(command) == 0 {
		command = DefaultDaemonCommand
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(spec.ID),
			Namespace:   l.Namespace,
			Labels:      map[string]string{LabelName: "tessera", LabelComponent: ComponentMPSDaemon, LabelClaimUID: spec.ID},
			Annotations: map[string]string{AnnotationClaim: spec.Claim},
		},
		Spec: corev1.PodSpec{
			NodeName: l.NodeName,
			// MPS tracks its clients by PID: the daemon and its server must
			// see the clients' processes, which run in other pods (NVIDIA's
			// daemon pod does the same).
			HostPID: true,
			// The limits are in the daemon's environment: a restarted
			// container starts a daemon with the same limits.
			RestartPolicy:                 corev1.RestartPolicyAlways,
			PriorityClassName:             l.PriorityClassName,
			RuntimeClassName:              runtimeClass,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			Containers: []corev1.Container{{
				Name:            DaemonContainer,
				Image:           l.Image,
				ImagePullPolicy: l.PullPolicy,
				Command:         command,
				Args:            flags.Args(),
				Env:             env,
				Resources:       l.Resources,
				SecurityContext: sc,
				VolumeMounts:    mounts,
			}},
			Volumes: volumes,
		},
	}
}

// Launch implements Launcher: it creates the claim's daemon pod. A pod
// that exists already is kept, unless it is being deleted (a daemon of an
// earlier prepare of the claim that is still stopping): then the prepare
// fails and the kubelet retries.
func (l *PodLauncher) Launch(ctx context.Context, spec DaemonSpec, dirs Dirs) error {
	pod := l.Pod(spec, dirs)
	_, err := l.Client.CoreV1().Pods(l.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, gerr := l.Client.CoreV1().Pods(l.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("daemon pod %s/%s: %w", l.Namespace, pod.Name, gerr)
		}
		if old.DeletionTimestamp != nil {
			return fmt.Errorf("daemon pod %s/%s of an earlier prepare is still terminating", l.Namespace, pod.Name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("create daemon pod %s/%s: %w", l.Namespace, pod.Name, err)
	}
	klog.FromContext(ctx).Info("Created MPS control daemon pod", "pod", klog.KObj(pod), "claim", spec.Claim)
	return nil
}

// Remove implements Launcher: it deletes the daemon pod (its container
// quits the daemon on SIGTERM).
func (l *PodLauncher) Remove(ctx context.Context, id string) error {
	err := l.Client.CoreV1().Pods(l.Namespace).Delete(ctx, PodName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete daemon pod %s/%s: %w", l.Namespace, PodName(id), err)
	}
	return nil
}

// Launched implements Launcher: the daemon pods on this node.
func (l *PodLauncher) Launched(ctx context.Context) ([]string, error) {
	list, err := l.Client.CoreV1().Pods(l.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{LabelComponent: ComponentMPSDaemon}).String(),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", l.NodeName).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list daemon pods: %w", err)
	}
	var out []string
	for _, p := range list.Items {
		if id := p.Labels[LabelClaimUID]; idPattern.MatchString(id) && p.Name == PodName(id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// Describe implements Launcher.
func (l *PodLauncher) Describe(ctx context.Context, id string) string {
	p, err := l.Client.CoreV1().Pods(l.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("daemon pod %s/%s: %v", l.Namespace, PodName(id), err)
	}
	s := fmt.Sprintf("daemon pod %s/%s is %s", l.Namespace, p.Name, p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			s += fmt.Sprintf(", container waiting: %s %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			s += fmt.Sprintf(", container terminated: %s (exit %d) %s", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message)
		}
		if cs.RestartCount > 0 {
			s += fmt.Sprintf(", %d restarts", cs.RestartCount)
		}
	}
	return strings.TrimSpace(s)
}
