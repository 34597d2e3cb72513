package simkubelet

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// Call is one prepare or unprepare of a claim for a pod.
type Call struct {
	Pod       types.NamespacedName
	PodUID    types.UID
	Driver    string
	Claim     types.NamespacedName
	ClaimUID  types.UID
	Devices   []string // pool/device of each prepared device
	CDIDevice []string
	Unprepare bool
}

// Ledger records every call a simulated kubelet made to DRA plugins, so tests
// can assert that nothing was prepared twice and everything was unprepared.
type Ledger struct {
	mu    sync.Mutex
	calls []Call
}

func (l *Ledger) recordPrepare(pod *corev1.Pod, driver string, c *drapb.Claim, devices []*drapb.Device) {
	call := Call{
		Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID, Driver: driver,
		Claim: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, ClaimUID: types.UID(c.Uid),
	}
	for _, d := range devices {
		call.Devices = append(call.Devices, d.PoolName+"/"+d.DeviceName)
		call.CDIDevice = append(call.CDIDevice, d.CdiDeviceIds...)
	}
	l.mu.Lock()
	l.calls = append(l.calls, call)
	l.mu.Unlock()
}

func (l *Ledger) recordUnprepare(pod *corev1.Pod, driver string, c *drapb.Claim) {
	l.mu.Lock()
	l.calls = append(l.calls, Call{
		Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID, Driver: driver,
		Claim: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, ClaimUID: types.UID(c.Uid), Unprepare: true,
	})
	l.mu.Unlock()
}

// Calls returns a copy of the calls so far, in order.
func (l *Ledger) Calls() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Call(nil), l.calls...)
}

// Outstanding returns the claims that were prepared and not unprepared since.
func (l *Ledger) Outstanding() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	open := map[types.UID]Call{}
	for _, c := range l.calls {
		if c.Unprepare {
			delete(open, c.ClaimUID)
		} else {
			open[c.ClaimUID] = c
		}
	}
	out := make([]Call, 0, len(open))
	for _, c := range open {
		out = append(out, c)
	}
	return out
}
