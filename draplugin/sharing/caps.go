package sharing

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"

	"github.com/tessera-gpu/tessera/draplugin/executor"
)

// Versions of nvidia-cuda-mps-control (CUDA major*1000 + minor*10, as -v
// reports it) that brought what tessera uses or could use.
const (
	// VersionStaticPartitioning: static SM partitioning (-S, sm_partition,
	// CUDA_MPS_SM_PARTITION), CUDA 13.1.
	VersionStaticPartitioning = 13010
	// VersionV3: the MPS v3 interface (-p 3: named servers, namespaces,
	// file-based configuration), driver r615 / CUDA 13.4.
	VersionV3 = 13040
)

// Capabilities is what the installed MPS can do, as the tool reports it.
type Capabilities struct {
	// Version is what nvidia-cuda-mps-control -v reported (0: unknown).
	Version int
	// StaticPartitioning and V3 follow from the version.
	StaticPartitioning bool
	V3                 bool
	// Reason says why a capability is missing (the version, or why it is
	// unknown).
	Reason string
}

var versionNumber = regexp.MustCompile(`\b(\d{5})\b`)

type capsCache struct {
	mu   sync.Mutex
	caps *Capabilities
}

// Capabilities asks nvidia-cuda-mps-control -v for its version once (a
// failed ask is asked again next time). A tool that does not report a
// version (before CUDA 13, -v was documented for Tegra only) has neither
// static partitioning nor v3, with that as the reason.
func (c *Controller) Capabilities(ctx context.Context) Capabilities {
	c.caps.mu.Lock()
	defer c.caps.mu.Unlock()
	if c.caps.caps != nil {
		return *c.caps.caps
	}
	caps, cache := detect(ctx, c.Exec)
	if cache {
		c.caps.caps = &caps
	}
	return caps
}

func detect(ctx context.Context, ex executor.Executor) (Capabilities, bool) {
	out, err := ex.Run(ctx, executor.Command{Name: MPSControl, Args: []string{"-v"}})
	if err != nil {
		return Capabilities{Reason: fmt.Sprintf("nvidia-cuda-mps-control -v failed (%v): static SM partitioning needs version %d (CUDA 13.1) or later", err, VersionStaticPartitioning)}, false
	}
	m := versionNumber.FindStringSubmatch(string(out))
	if m == nil {
		return Capabilities{Reason: fmt.Sprintf("nvidia-cuda-mps-control -v reports no version (%q): static SM partitioning needs version %d (CUDA 13.1) or later", out, VersionStaticPartitioning)}, true
	}
	v, _ := strconv.Atoi(m[1])
	caps := Capabilities{Version: v, StaticPartitioning: v >= VersionStaticPartitioning, V3: v >= VersionV3}
	if !caps.StaticPartitioning {
		caps.Reason = fmt.Sprintf("nvidia-cuda-mps-control is version %d; static SM partitioning needs %d (CUDA 13.1) or later", v, VersionStaticPartitioning)
	}
	return caps, true
}
