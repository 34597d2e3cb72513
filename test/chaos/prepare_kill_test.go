package chaos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/contract"
	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
)

// Kills mid-prepare of the claims that make no MIG call: a whole GPU, an
// MPS share, a time-sliced GPU. Each has its crash point in a stand-in, as
// the MIG kills have theirs in the mock machine's MIG calls:
//
//   - whole GPU (a whole node): the mock machine's GetMigMode, the one
//     driver call of a whole GPU's prepare (is MIG mode off?), held on the
//     control socket. It runs after the plan and before the CDI spec and the
//     checkpoint's PrepareCompleted record are written (a whole GPU writes
//     no PrepareStarted record: nothing needs undoing).
//   - MPS share (a shared node): the fake nvidia-cuda-mps-control -d, the
//     claim's control daemon start, held by a file (realnode.HoldTool).
//   - time-sliced GPU (whole and MIG nodes: both publish whole GPUs): the
//     fake nvidia-smi compute-policy that sets the GPU's time slice, after
//     PrepareStarted is checkpointed.
//
// The kill counts as landed when a call was parked and the checkpoint shows
// the claim mid-prepare: not PrepareCompleted (whole GPU, MPS share, whose
// prepare writes no intent), PrepareStarted with the time slice not yet set
// (time-sliced).
//
// unprepTimeSliced is the same crash point met from the other side: half of
// the mid-unprepare kills park the compute-policy call of an unprepare (the
// reset to the default slice, after the CDI spec was removed and before the
// checkpoint entry goes); it lands when the checkpoint still has the claim
// PrepareCompleted, time-slicing the parked GPU.
const unprepTimeSliced = "unprepare of a time-sliced GPU"

// unprepMPS: a third of the mid-unprepare kills park an MPS share's
// unprepare at its control daemon's quit (after the CDI spec was removed,
// before the daemon goes and the checkpoint entry with it); it lands when the
// checkpoint still has the claim PrepareCompleted. The parked quit goes on
// after the kill (a quit already sent reaches the daemon whatever happens to
// the sender), so the restarted plugin's unprepare finds the daemon gone.
const unprepMPS = "unprepare of an MPS share"

func (in *injector) killMidPrepare(ctx context.Context, rec *faultRecord, kind string) error {
	// A whole GPU's GetMigMode is held on one whole node (on a MIG node a
	// MIG prepare asks it too; on every node it would stall each agent's
	// discovery). The tool holds are armed on every candidate node at once
	// (time-sliced and MPS prepares are rarer) and the first node where a
	// call parks is killed; the others' parked calls go on at the release.
	var candidates []*chaosNode
	switch kind {
	case faultKillPrepWhole:
		candidates = []*chaosNode{in.pickNodeFor([]string{modeWhole}, "whole")}
	case faultKillPrepMPS, unprepMPS:
		candidates = in.nodesOf(modeShared)
	default:
		candidates = in.nodesOf(modeWhole, modeMIG)
	}

	var arm, disarm func(n *chaosNode) error
	var parked func(n *chaosNode) ([]string, error)
	var what string
	switch kind {
	case faultKillPrepWhole:
		what = "GetMigMode"
		arm = func(n *chaosNode) error { return nvmlbackend.SendControl(ctx, n.controlSocket(), "hold GetMigMode") }
		disarm = func(n *chaosNode) error { return nil } // the hold dies with the process
		parked = func(n *chaosNode) ([]string, error) {
			out, err := nvmlbackend.QueryControl(ctx, n.controlSocket(), "held GetMigMode")
			if err != nil || out == "0" {
				return nil, err
			}
			return strings.Fields(out)[1:], nil
		}
	case faultKillPrepMPS, faultKillPrepTS, unprepTimeSliced, unprepMPS:
		hold := realnode.HoldSMIComputePolicy
		what = "nvidia-smi compute-policy"
		switch kind {
		case faultKillPrepMPS:
			hold, what = realnode.HoldMPSDaemonStart, "nvidia-cuda-mps-control -d"
		case unprepMPS:
			hold, what = realnode.HoldMPSDaemonQuit, "nvidia-cuda-mps-control quit"
		}
		arm = func(n *chaosNode) error { return realnode.HoldTool(n.holdDir(), hold) }
		disarm = func(n *chaosNode) error { return realnode.ReleaseTool(n.holdDir(), hold) }
		parked = func(n *chaosNode) ([]string, error) { return realnode.HeldTool(n.holdDir(), hold) }
	}

	var errs []error
	for _, n := range candidates {
		if err := arm(n); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
		}
	}
	var target *chaosNode
	var calls []string
	for deadline := time.Now().Add(30 * time.Second); target == nil && len(errs) == 0 && time.Now().Before(deadline); {
		for _, n := range candidates {
			c, err := parked(n)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
				break
			}
			if len(c) > 0 && ((kind == faultKillPrepTS && !slices.ContainsFunc(c, settingTimeSlice)) ||
				(kind == unprepTimeSliced && !slices.ContainsFunc(c, resettingTimeSlice))) {
				// Only the other side's calls are parked here (an
				// unprepare's reset while a prepare is wanted, or the
				// reverse): let them go on and wait.
				if err := realnode.PassTool(n.holdDir(), realnode.HoldSMIComputePolicy); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
				}
				continue
			}
			if len(c) > 0 {
				target, calls = n, c
				break
			}
		}
		if target == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if target == nil {
		target = candidates[in.rng.IntN(len(candidates))]
	}
	n := target
	rec.Target = n.name
	n.mu.Lock()
	defer n.mu.Unlock()
	in.c.nodeFault(n.name, true)
	defer in.c.nodeFault(n.name, false)
	landed := false
	if calls != nil {
		// Parked: the state is what it will be at the kill.
		mid, err := in.midPrepare(ctx, n, kind, calls)
		if err != nil {
			errs = append(errs, err)
		}
		landed = mid > 0
		phase := "mid-prepare"
		if kind == unprepTimeSliced || kind == unprepMPS {
			phase = "mid-unprepare (still PrepareCompleted)"
		}
		rec.Note = fmt.Sprintf("killed with %s parked (%s); checkpoint: %d claim(s) there %s", what, strings.Join(calls, ", "), mid, phase)
	}
	n.killPlugin()
	for _, c := range candidates {
		if err := disarm(c); err != nil {
			errs = append(errs, err)
		}
	}
	rec.Landed = &landed
	if rec.Note == "" {
		rec.Note = fmt.Sprintf("no %s within 30s on %d node(s): killed anyway", what, len(candidates))
	}
	if err := errors.Join(errs...); err != nil {
		rec.Note += fmt.Sprintf(" (hold: %v)", err)
	}
	time.Sleep(in.between(time.Second, 3*time.Second))
	return n.startPlugin(ctx)
}

// settingTimeSlice: a parked nvidia-smi compute-policy call sets a slice
// other than the default — the prepare of the run's time-sliced shape (Long);
// an unprepare resets the GPU to the default (0).
func settingTimeSlice(call string) bool {
	f := strings.Fields(call)
	return len(f) > 0 && f[len(f)-1] != strconv.Itoa(int(sharing.TimeSliceDefault))
}

// resettingTimeSlice: a parked nvidia-smi compute-policy call is an
// unprepare's reset to the default slice.
func resettingTimeSlice(call string) bool {
	f := strings.Fields(call)
	return len(f) > 0 && f[len(f)-1] == strconv.Itoa(int(sharing.TimeSliceDefault))
}

// nodesOf returns the nodes of modes.
func (in *injector) nodesOf(modes ...string) []*chaosNode {
	var out []*chaosNode
	for _, n := range in.e.nodes {
		if slices.Contains(modes, n.mode) {
			out = append(out, n)
		}
	}
	return out
}

// midPrepare counts the claims the parked calls belong to that the
// checkpoint shows mid-prepare.
func (in *injector) midPrepare(ctx context.Context, n *chaosNode, kind string, calls []string) (int, error) {
	ck, err := checkpoint.Read(n.checkpointPath())
	if err != nil {
		ck = &checkpoint.Checkpoint{Data: checkpoint.NewData()}
	}
	state := func(uid types.UID) checkpoint.ClaimState {
		if c := ck.Data.Claims[uid]; c != nil {
			return c.State
		}
		return ""
	}
	count := 0
	switch kind {
	case faultKillPrepMPS, unprepMPS:
		// A parked daemon start or quit reports its pipe directory,
		// <mps dir>/claims/<claim UID>/pipe: a start is mid-prepare while
		// the claim is not PrepareCompleted, a quit mid-unprepare while it
		// still is.
		for _, pipe := range calls {
			if done := state(types.UID(filepath.Base(filepath.Dir(pipe)))) == checkpoint.PrepareCompleted; done == (kind == unprepMPS) {
				count++
			}
		}
	case faultKillPrepTS, unprepTimeSliced:
		// compute-policy -i <GPU UUID> --set-timeslice <n>; a prepare is
		// mid-way in PrepareStarted, an unprepare while the entry is still
		// PrepareCompleted.
		want := checkpoint.PrepareStarted
		if kind == unprepTimeSliced {
			want = checkpoint.PrepareCompleted
		}
		for _, call := range calls {
			f := strings.Fields(call)
			for i := 0; i+1 < len(f); i++ {
				if f[i] != "-i" {
					continue
				}
				for _, c := range ck.Data.Claims {
					if c != nil && c.State == want && timeSlicedOn(c, f[i+1]) {
						count++
					}
				}
			}
		}
	case faultKillPrepWhole:
		// The parked GPUs' claims in the API that the checkpoint does not
		// show prepared (a GetMigMode parked in the agent's discovery
		// while no claim of the GPU is being prepared does not count).
		claims, err := in.claimsOnGPUs(ctx, n, calls)
		if err != nil {
			return 0, err
		}
		for _, uid := range claims {
			if state(uid) != checkpoint.PrepareCompleted {
				count++
			}
		}
	}
	return count, nil
}

func timeSlicedOn(c *checkpoint.Claim, gpu string) bool {
	for _, d := range c.Devices {
		if d.GPUUUID == gpu && d.Sharing != nil && d.Sharing.Strategy == string(configapi.TimeSlicingStrategy) {
			return true
		}
	}
	return false
}

// claimsOnGPUs returns the claims allocated (and reserved for a pod) to a
// whole-GPU device of n on one of gpus (UUIDs).
func (in *injector) claimsOnGPUs(ctx context.Context, n *chaosNode, gpus []string) ([]types.UID, error) {
	sliceList, err := in.e.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
	if err != nil {
		return nil, fmt.Errorf("list slices: %w", err)
	}
	onGPU := map[devKey]bool{}
	for _, s := range sliceList.Items {
		if s.Spec.Driver != contract.DriverName {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			for _, g := range gpus {
				if contract.StringAttr(d, contract.AttrUUID) == g {
					onGPU[devKey{s.Spec.Pool.Name, d.Name}] = true
				}
			}
		}
	}
	claims, err := in.e.kube.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	var out []types.UID
	for _, c := range claims.Items {
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == contract.DriverName && onGPU[devKey{r.Pool, r.Device}] {
				out = append(out, c.UID)
				break
			}
		}
	}
	return out, nil
}

// pickNodeFor picks a node of one of modes at random, preferring one with a
// pod of the shape (its name has "-<shape>-") that was bound but does not
// run yet (its claims are about to be prepared), then one with any such
// pod, then one with running pods.
func (in *injector) pickNodeFor(modes []string, shape string) *chaosNode {
	pendingShape, pending, running := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, obj := range in.tr.store.List() {
		p := obj.(*v1.Pod)
		switch {
		case p.Spec.NodeName == "":
		case p.Status.Phase == v1.PodPending:
			pending[p.Spec.NodeName] = true
			if strings.Contains(p.Name, "-"+shape+"-") {
				pendingShape[p.Spec.NodeName] = true
			}
		case p.Status.Phase == v1.PodRunning:
			running[p.Spec.NodeName] = true
		}
	}
	sets := make([][]*chaosNode, 4)
	for _, n := range in.e.nodes {
		if !slices.Contains(modes, n.mode) {
			continue
		}
		for i, ok := range []bool{pendingShape[n.name], pending[n.name], running[n.name], true} {
			if ok {
				sets[i] = append(sets[i], n)
			}
		}
	}
	for _, set := range sets {
		if len(set) > 0 {
			return set[in.rng.IntN(len(set))]
		}
	}
	return in.e.nodes[in.rng.IntN(len(in.e.nodes))]
}
