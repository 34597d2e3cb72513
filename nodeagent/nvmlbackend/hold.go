package nvmlbackend

import (
	"fmt"
	"slices"
	"strconv"
)

// Holds are crash points for tests (the chaos run's kill -9 mid-prepare and
// mid-unprepare): a held method's calls park at their entry, before they
// take effect, until the hold is released — or until the process is killed,
// which is the point. The real driver has no such thing; a call that parks
// is a driver call that has not returned yet when the process dies. Set
// through the control socket (hold, held, release; see ServeControl).

// holdableMethods are the calls a hold can park: the MIG calls a prepare or
// an unprepare makes, and GetMigMode — the one driver call a prepare of a
// whole GPU of a MIG-capable GPU makes (is MIG mode off?) — named as
// FailCall names them.
var holdableMethods = []string{"CreateGpuInstanceWithPlacement", "CreateGpuInstance", "CreateComputeInstance", "DestroyComputeInstance", "DestroyGpuInstance", "GetMigMode"}

// callHold is one armed hold.
type callHold struct {
	release chan struct{}
	parked  []string // UUIDs of the GPUs whose calls are parked now
}

// Hold arms a hold on method: from now on its calls, on every GPU of the
// machine, park at their entry until Release.
func (m *Mock) Hold(method string) error {
	if !slices.Contains(holdableMethods, method) {
		return fmt.Errorf("hold: %q is not a method a hold can park (one of %v)", method, holdableMethods)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == nil {
		m.holds = map[string]*callHold{}
	}
	if m.holds[method] == nil {
		m.holds[method] = &callHold{release: make(chan struct{})}
	}
	return nil
}

// Held returns the UUIDs of the GPUs whose calls of method are parked now.
func (m *Mock) Held(method string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.holds[method]; h != nil {
		return slices.Clone(h.parked)
	}
	return nil
}

// Release disarms the hold on method and lets its parked calls go on.
func (m *Mock) Release(method string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked(method)
}

func (m *Mock) releaseLocked(method string) {
	if h := m.holds[method]; h != nil {
		close(h.release)
		delete(m.holds, method)
	}
}

// releaseAllLocked releases every hold (the machine shuts down). Caller
// holds mu.
func (m *Mock) releaseAllLocked() {
	for method := range m.holds {
		m.releaseLocked(method)
	}
}

// park is a holdable call's entry: it waits while method is held. It takes
// mu itself, so it is called before the call locks.
func (m *Mock) park(g *GPU, method string) {
	m.mu.Lock()
	h := m.holds[method]
	if h == nil {
		m.mu.Unlock()
		return
	}
	h.parked = append(h.parked, g.UUID)
	m.mu.Unlock()
	<-h.release
	m.mu.Lock()
	if i := slices.Index(h.parked, g.UUID); i >= 0 {
		h.parked = slices.Delete(h.parked, i, i+1)
	}
	m.mu.Unlock()
}

// controlHold applies a hold, held or release command (no GPU argument: a
// hold is for the whole machine).
func (m *Mock) controlHold(f []string) (string, error) {
	if len(f) != 2 {
		return "", fmt.Errorf("want %s <method>, got %d arguments", f[0], len(f)-1)
	}
	switch f[0] {
	case "hold":
		return "", m.Hold(f[1])
	case "held":
		parked := m.Held(f[1])
		out := strconv.Itoa(len(parked))
		for _, u := range parked {
			out += " " + u
		}
		return out, nil
	default:
		m.Release(f[1])
		return "", nil
	}
}
