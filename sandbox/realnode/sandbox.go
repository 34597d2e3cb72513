package realnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/sandbox/nodebin"
)

// SandboxTaint keeps the sandbox's workloads (which use images no registry
// serves here) off its real node: pods for it tolerate this taint and use
// BusyboxImage with imagePullPolicy Never.
var SandboxTaint = corev1.Taint{Key: "tessera.dev/real-node", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// ErrUnavailable wraps the reason a machine cannot run the sandbox's real node.
var ErrUnavailable = errors.New("this machine cannot run a real node")

// SandboxOptions configure the real node of `tessera sandbox up --real-node`.
type SandboxOptions struct {
	NodeName   string
	Kubeconfig string
	// Machine is the mock machine ("dgxh100"); the node gets all 8 of its GPUs.
	Machine string
	// Config is the sandbox's partition config (nil: every GPU whole) and
	// Labels the node's labels, which select its entry.
	Config *partition.Config
	Labels map[string]string
	Log    func(format string, args ...any)
	// Out receives the progress lines of building the node binaries, when
	// they are not in the cache yet (nil: silence).
	Out io.Writer
}

// StartForSandbox starts the sandbox's real node beside its simulated ones,
// building the node binaries into the cache first where they are missing
// (sandbox/nodebin, from the Go module proxy; no checkout needed). An error
// wrapping ErrUnavailable says why the machine cannot run one (not root, no
// runc, no tessera-node binary, the node binaries cannot be built): the
// sandbox then goes on with its simulated nodes.
func StartForSandbox(ctx context.Context, o SandboxOptions) (*Node, error) {
	if err := CheckMachine(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	bin, err := findTesseraNode(ctx, o.Out)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	binDir, err := nodebin.Ensure(ctx, nodebin.Options{Out: o.Out})
	if err != nil {
		return nil, fmt.Errorf("%w: the node binaries: %w", ErrUnavailable, err)
	}
	var cfg []byte
	if o.Config != nil {
		if cfg, err = yaml.Marshal(o.Config); err != nil {
			return nil, fmt.Errorf("partition config of the real node: %w", err)
		}
	}
	return Start(ctx, Options{
		NodeName:        o.NodeName,
		Kubeconfig:      o.Kubeconfig,
		TesseraNode:     bin,
		BinDir:          binDir,
		Machine:         o.Machine,
		GPUs:            8,
		PartitionConfig: string(cfg),
		Labels:          o.Labels,
		Taints:          []corev1.Taint{SandboxTaint},
		Log:             o.Log,
	})
}

// findTesseraNode looks for tessera-node next to the running program (make
// build puts tessera and tessera-node into bin/), then on PATH; an
// installed tessera (go install …/cmd/tessera@version) has neither, and
// builds tessera-node of its own version into the cache (nodebin.TesseraNode).
func findTesseraNode(ctx context.Context, out io.Writer) (string, error) {
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "tessera-node"))
	}
	if p, err := exec.LookPath("tessera-node"); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		if executable(c) {
			return c, nil
		}
	}
	bin, err := nodebin.TesseraNode(ctx, nodebin.Options{Out: out}, nodebin.ModuleVersion())
	if err != nil {
		return "", fmt.Errorf("no tessera-node next to this program or on PATH, and %w", err)
	}
	return bin, nil
}
