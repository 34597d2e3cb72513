package simkubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// savedPod is one pod's prepared claims in the state file.
type savedPod struct {
	Claims map[string][]savedClaim `json:"claims"` // by driver
	Done   bool                    `json:"done,omitempty"`
}

type savedClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// loadState reads the state file (Options.StateFile), if there is one.
func (k *Kubelet) loadState() error {
	if k.opts.StateFile == "" {
		return nil
	}
	data, err := os.ReadFile(k.opts.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read simulated kubelet state: %w", err)
	}
	var saved map[types.UID]savedPod
	if err := json.Unmarshal(data, &saved); err != nil {
		return fmt.Errorf("simulated kubelet state %s: %w", k.opts.StateFile, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for uid, sp := range saved {
		st := &podState{prepared: true, done: sp.Done, claims: map[string][]*drapb.Claim{}}
		for driver, claims := range sp.Claims {
			for _, c := range claims {
				st.claims[driver] = append(st.claims[driver], &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
			}
		}
		k.state[uid] = st
	}
	return nil
}

// saveState writes the prepared claims (atomically: a temporary file renamed).
// A write that fails is logged: the state is a convenience for restarts.
func (k *Kubelet) saveState(ctx context.Context) {
	if k.opts.StateFile == "" {
		return
	}
	k.saveMu.Lock()
	defer k.saveMu.Unlock()
	k.mu.Lock()
	saved := make(map[types.UID]savedPod, len(k.state))
	for uid, st := range k.state {
		if !st.prepared {
			continue
		}
		sp := savedPod{Claims: map[string][]savedClaim{}, Done: st.done}
		for driver, claims := range st.claims {
			for _, c := range claims {
				sp.Claims[driver] = append(sp.Claims[driver], savedClaim{Namespace: c.Namespace, Name: c.Name, UID: c.Uid})
			}
		}
		saved[uid] = sp
	}
	data, err := json.Marshal(saved)
	k.mu.Unlock()
	if err == nil {
		tmp := k.opts.StateFile + ".tmp"
		if err = os.MkdirAll(filepath.Dir(k.opts.StateFile), 0o755); err == nil {
			if err = os.WriteFile(tmp, data, 0o600); err == nil {
				err = os.Rename(tmp, k.opts.StateFile)
			}
		}
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Saving the simulated kubelet's DRA state failed", "file", k.opts.StateFile)
	}
}
