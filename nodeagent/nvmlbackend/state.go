package nvmlbackend

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The driver state of a mock machine, kept in a file (mock option
// state=FILE) so that it outlives the process that holds the Mock.
//
// On a real node the MIG mode and the MIG instances live in the driver:
// kill -9 of tessera-node leaves every instance it created where it was,
// with the same GPU instance and compute instance IDs and MIG device
// UUIDs, until a GPU reset or a reboot. A mock that lived only in the
// tessera-node process would forget them with the process, and a restarted
// plugin would never meet the instances its predecessor left behind, which
// is the case its startup reconciliation exists for. Not kept, as they are
// not the driver's state either: processes holding the GPU (HoldGPU), event
// registrations (dropped with the process, as NVML's are), armed faults.
// A GPU marked lost is not kept either: the process that marked it (the
// control socket's client) tells the new one again.

const stateVersion = 1

type machineState struct {
	Version int        `json:"version"`
	Machine string     `json:"machine"`
	GPUs    []gpuState `json:"gpus"`
}

type gpuState struct {
	UUID       string    `json:"uuid"`
	MigCurrent int       `json:"migCurrent"`
	MigPending int       `json:"migPending"`
	Resets     int       `json:"resets"`
	GIs        []giState `json:"gpuInstances,omitempty"`
}

type giState struct {
	ID        uint32    `json:"id"`
	ProfileID uint32    `json:"profileID"`
	Start     uint32    `json:"start"`
	Size      uint32    `json:"size"`
	CIs       []ciState `json:"computeInstances,omitempty"`
}

type ciState struct {
	ID           uint32 `json:"id"`
	ProfileIndex int    `json:"profileIndex"`
	Start        uint32 `json:"start"`
	Size         uint32 `json:"size"`
	MigUUID      string `json:"migUUID"`
}

// UseStateFile makes path the machine's driver state: if the file exists
// the machine takes its MIG modes and instances from it (it must describe
// this machine: the same GPUs by UUID), else it is created with the
// machine's state now. From then on every change of MIG mode or instances
// is written to it before the NVML call returns.
func (m *Mock) UseStateFile(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("mock state %s: %w", path, err)
	default:
		var st machineState
		if err := json.Unmarshal(data, &st); err != nil {
			return fmt.Errorf("mock state %s: %w", path, err)
		}
		if err := m.restoreLocked(st); err != nil {
			return fmt.Errorf("mock state %s: %w", path, err)
		}
	}
	m.statePath = path
	return m.writeStateLocked()
}

func (m *Mock) restoreLocked(st machineState) error {
	if st.Version != stateVersion {
		return fmt.Errorf("version %d, this mock reads %d", st.Version, stateVersion)
	}
	if st.Machine != m.Machine || len(st.GPUs) != len(m.gpus) {
		return fmt.Errorf("describes %s with %d GPUs, this is %s with %d", st.Machine, len(st.GPUs), m.Machine, len(m.gpus))
	}
	// Build everything first: a file that does not fit leaves the machine
	// as it was.
	restored := make([]map[uint32]*GpuInstance, len(m.gpus))
	for i, gs := range st.GPUs {
		g := m.gpus[i]
		if gs.UUID != g.UUID {
			return fmt.Errorf("GPU %d is %s there, %s here (another machine: set the same serial)", i, gs.UUID, g.UUID)
		}
		valid := func(mode int) bool { return mode == nvml.DEVICE_MIG_DISABLE || mode == nvml.DEVICE_MIG_ENABLE }
		if !valid(gs.MigCurrent) || !valid(gs.MigPending) || (!g.migCapable() && (gs.MigCurrent != 0 || gs.MigPending != 0)) {
			return fmt.Errorf("GPU %d: MIG mode %d (pending %d) is not one this GPU can have", i, gs.MigCurrent, gs.MigPending)
		}
		if len(gs.GIs) > 0 && gs.MigCurrent != nvml.DEVICE_MIG_ENABLE {
			return fmt.Errorf("GPU %d: GPU instances outside MIG mode", i)
		}
		gis := map[uint32]*GpuInstance{}
		probe := &GPU{m: m, Product: g.Product, gis: gis, migCurrent: gs.MigCurrent}
		for _, s := range gs.GIs {
			p := g.profileByIDLocked(s.ProfileID)
			if p == nil {
				return fmt.Errorf("GPU %d: GPU instance %d has unknown profile %d", i, s.ID, s.ProfileID)
			}
			pl := nvml.GpuInstancePlacement{Start: s.Start, Size: s.Size}
			if ret := probe.placementFreeLocked(p, pl); ret != nvml.SUCCESS || giID(pl) != s.ID {
				return fmt.Errorf("GPU %d: GPU instance %d (profile %d at %d+%d) cannot exist here: %v", i, s.ID, s.ProfileID, s.Start, s.Size, ret)
			}
			gi := &GpuInstance{gpu: g, ID: s.ID, Profile: p, Placement: pl, cis: map[uint32]*ComputeInstance{}}
			for _, cs := range s.CIs {
				c, ok := p.computeProfile(cs.ProfileIndex)
				cpl := nvml.ComputeInstancePlacement{Start: cs.Start, Size: cs.Size}
				if !ok || !slices.Contains(gi.ciPlacements(c), cpl) || gi.cis[cs.ID] != nil || !gi.ciFreeLocked(c, cpl) || cs.MigUUID == "" {
					return fmt.Errorf("GPU %d: compute instance %d of GPU instance %d cannot exist here", i, cs.ID, s.ID)
				}
				ci := &ComputeInstance{gi: gi, ID: cs.ID, profile: c, Placement: cpl}
				ci.mig = &MigDevice{ci: ci, UUID: cs.MigUUID}
				gi.cis[cs.ID] = ci
			}
			gis[gi.ID] = gi
		}
		restored[i] = gis
	}
	for i, gs := range st.GPUs {
		g := m.gpus[i]
		g.migCurrent, g.migPending, g.resets, g.gis = gs.MigCurrent, gs.MigPending, gs.Resets, restored[i]
		for _, gi := range g.gis {
			m.capsChangedLocked(g, gi, nil, true)
			for _, ci := range gi.cis {
				m.capsChangedLocked(g, gi, ci, true)
			}
		}
	}
	return nil
}

// stateChangedLocked writes the state file after a change, when there is
// one. A model that cannot keep its state would go on as a machine that
// forgets, silently easier than the real one: that panics instead.
func (m *Mock) stateChangedLocked() {
	if m.statePath == "" {
		return
	}
	if err := m.writeStateLocked(); err != nil {
		panic(fmt.Sprintf("mock %s: %v", m.Machine, err))
	}
}

// writeStateLocked replaces the file at once (rename), so that a process
// killed while writing leaves the previous state, never half of one. No
// fsync: the fault modelled is a process killed, not the machine.
func (m *Mock) writeStateLocked() error {
	st := machineState{Version: stateVersion, Machine: m.Machine}
	for _, g := range m.gpus {
		gs := gpuState{UUID: g.UUID, MigCurrent: g.migCurrent, MigPending: g.migPending, Resets: g.resets}
		for _, gi := range g.sortedGIsLocked() {
			s := giState{ID: gi.ID, ProfileID: gi.Profile.ID, Start: gi.Placement.Start, Size: gi.Placement.Size}
			for _, ci := range gi.sortedCIsLocked() {
				s.CIs = append(s.CIs, ciState{ID: ci.ID, ProfileIndex: ci.profile.index, Start: ci.Placement.Start, Size: ci.Placement.Size, MigUUID: ci.mig.UUID})
			}
			gs.GIs = append(gs.GIs, s)
		}
		st.GPUs = append(st.GPUs, gs)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(m.statePath), filepath.Base(m.statePath)+".*")
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write state %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), m.statePath); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}
