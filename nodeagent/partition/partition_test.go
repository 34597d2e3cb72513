package partition_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
)

func TestParseRejectsNamingTheField(t *testing.T) {
	for name, tc := range map[string]struct{ cfg, want string }{
		"unknown field":          {"default: {gpus: [{mode: whole, profle: [1g.10gb]}]}", `unknown field "profle"`},
		"unknown top field":      {"nodez: []", `unknown field "nodez"`},
		"missing mode":           {"default: {gpus: [{indices: [0]}]}", "default.gpus[0].mode: Required value"},
		"bad mode":               {"default: {gpus: [{mode: MIG}]}", `default.gpus[0].mode: Unsupported value: "MIG"`},
		"negative index":         {"default: {gpus: [{mode: whole, indices: [-1]}]}", "default.gpus[0].indices[0]: Invalid value: -1"},
		"duplicate index":        {"default: {gpus: [{mode: whole, indices: [1, 1]}]}", "default.gpus[0].indices[1]: Duplicate value: 1"},
		"profiles on whole":      {"default: {gpus: [{mode: whole, profiles: [1g.10gb]}]}", "default.gpus[0].profiles: Forbidden"},
		"layout on dynamic":      {"default: {gpus: [{mode: dynamicMIG, layout: [{profile: 1g.10gb}]}]}", "default.gpus[0].layout: Forbidden"},
		"shared on whole":        {"default: {gpus: [{mode: whole, shared: {}}]}", "default.gpus[0].shared: Forbidden"},
		"bad profile syntax":     {"default: {gpus: [{mode: dynamicMIG, profiles: [1g10gb]}]}", `default.gpus[0].profiles[0]: Invalid value: "1g10gb"`},
		"layout without profile": {"default: {gpus: [{mode: staticMIG, layout: [{start: 0}]}]}", "default.gpus[0].layout[0].profile: Required value"},
		"negative start":         {"default: {gpus: [{mode: staticMIG, layout: [{profile: 1g.10gb, start: -2}]}]}", "default.gpus[0].layout[0].start: Invalid value: -2"},
		"node without selector":  {"nodes: [{gpus: [{mode: whole}]}]", "nodes[0].nodeSelector: Required value"},
		"bad selector":           {"nodes: [{nodeSelector: {matchExpressions: [{key: a, operator: Foo}]}}]", "nodes[0].nodeSelector: Invalid value"},
		"compute share":          {"default: {gpus: [{mode: shared, shared: {defaultComputeShare: 101}}]}", "default.gpus[0].shared.defaultComputeShare: Invalid value: 101"},
		"memory step":            {"default: {gpus: [{mode: shared, shared: {memoryStep: 0}}]}", "default.gpus[0].shared.memoryStep: Invalid value"},
		"default not a step":     {"default: {gpus: [{mode: shared, shared: {memoryStep: 1Gi, defaultMemory: 1500Mi}}]}", "default.gpus[0].shared.defaultMemory: Invalid value: \"1500Mi\": must be a multiple of memoryStep"},
		"not yaml":               {"[", "error converting YAML"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := partition.Parse([]byte(tc.cfg))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func discover(t *testing.T, lib nvml.Interface) *discovery.Node {
	t.Helper()
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func TestSelectByNodeLabel(t *testing.T) {
	cfg, err := partition.Parse([]byte(`
default: {gpus: [{mode: shared}]}
nodes:
- name: mig-nodes
  nodeSelector: {matchLabels: {partition: mig}}
  gpus: [{mode: dynamicMIG, profiles: [1g.10gb, 7g.80gb]}]
- nodeSelector: {matchExpressions: [{key: partition, operator: In, values: [whole, exclusive]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	lib, _ := nvmlbackend.Open("mock:dgxh100?gpus=2")
	node := discover(t, lib)
	for labels, want := range map[string]string{"mig": "dynamicMIG", "exclusive": "whole", "other": "shared"} {
		plan, err := partition.Resolve(cfg, map[string]string{"partition": labels}, node)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range plan.GPUs {
			if string(g.Mode) != want {
				t.Fatalf("label %s: GPU %d mode %s, want %s (entry %s)", labels, g.Index, g.Mode, want, plan.Entry)
			}
		}
		if labels == "mig" && (plan.Entry != "mig-nodes" || len(plan.GPUs[0].Profiles) != 2) {
			t.Fatalf("mig entry: %s with %d profiles", plan.Entry, len(plan.GPUs[0].Profiles))
		}
	}
	empty, err := partition.Resolve(&partition.Config{}, nil, node)
	if err != nil || empty.GPUs[0].Mode != partition.ModeWhole {
		t.Fatalf("empty config: %+v %v", empty, err)
	}
}

func TestResolveRejectsWhatTheGPUCannotDo(t *testing.T) {
	// GPU 1 is not MIG capable (an L40S beside an H100).
	lib, err := nvmlbackend.NewMockProducts("550.54.15", 12040, "h100-80gb", "l40s-48gb")
	if err != nil {
		t.Fatal(err)
	}
	node := discover(t, lib)
	for name, tc := range map[string]struct{ cfg, want string }{
		"unsupported profile": {"default: {gpus: [{indices: [0], mode: dynamicMIG, profiles: [1g.10gb, 1g.5gb]}]}", `default.gpus[0].profiles[1]: Unsupported value: "1g.5gb": supported values: "1g.10gb"`},
		"MIG on non-MIG GPU":  {"default: {gpus: [{indices: [1], mode: staticMIG}]}", "default.gpus[0].mode: Invalid value: \"staticMIG\": GPU 1 (NVIDIA L40S) does not support MIG"},
		"layout profile":      {"default: {gpus: [{indices: [0], mode: staticMIG, layout: [{profile: 2g.10gb}]}]}", `default.gpus[0].layout[0].profile: Invalid value: "2g.10gb": GPU 0 (NVIDIA H100 80GB HBM3) does not support this profile; supported: 1g.10gb,`},
		"layout placement":    {"default: {gpus: [{indices: [0], mode: staticMIG, layout: [{profile: 4g.40gb, start: 4}]}]}", "default.gpus[0].layout[0].start: Invalid value: 4: profile 4g.40gb can start at memory slices 0"},
		"layout overlap":      {"default: {gpus: [{indices: [0], mode: staticMIG, layout: [{profile: 4g.40gb, start: 0}, {profile: 1g.10gb, start: 3}]}]}", "default.gpus[0].layout[1]: Invalid value: \"1g.10gb at 3\": overlaps memory slices 0-3"},
		"layout full":         {"default: {gpus: [{indices: [0], mode: staticMIG, layout: [{profile: 7g.80gb}, {profile: 1g.10gb}]}]}", "default.gpus[0].layout[1].profile: Invalid value: \"1g.10gb\": no free placement left"},
		"index out of range":  {"default: {gpus: [{indices: [2], mode: whole}]}", "default.gpus[0].indices[0]: Invalid value: 2: this node has 2 GPUs"},
		"reserve everything":  {"default: {gpus: [{mode: shared, shared: {reservedMemory: 80Gi}}]}", "default.gpus[0].shared.reservedMemory: Invalid value"},
		"default too big":     {"default: {gpus: [{mode: shared, shared: {reservedMemory: 79Gi, defaultMemory: 2Gi}}]}", "default.gpus[0].shared.defaultMemory: Invalid value: \"2Gi\": exceeds"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := partition.Parse([]byte(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			_, err = partition.Resolve(cfg, nil, node)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Resolve: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestApplyStaticLayoutAndMIGMode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	lib, _ := nvmlbackend.Open("mock:dgxh100?gpus=3")
	cfg, err := partition.Parse([]byte(`
default:
  gpus:
  - indices: [0]
    mode: staticMIG
    layout: [{profile: 3g.40gb}, {profile: 1g.10gb, start: 6}, {profile: 2g.20gb}]
  - indices: [1]
    mode: dynamicMIG
`))
	if err != nil {
		t.Fatal(err)
	}
	node := discover(t, lib)
	plan, err := partition.Resolve(cfg, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := partition.Apply(ctx, lib, node, plan, nil)
	if err != nil || !changed {
		t.Fatalf("Apply: changed=%v err=%v", changed, err)
	}
	node = discover(t, lib)
	// Static MIG needs MIG mode; a dynamic-MIG GPU's mode follows its
	// claims (the kubelet plugin sets it), so Apply leaves it off.
	if !node.GPUs[0].MigEnabled || node.GPUs[1].MigEnabled || node.GPUs[2].MigEnabled {
		t.Fatalf("MIG modes %v %v %v", node.GPUs[0].MigEnabled, node.GPUs[1].MigEnabled, node.GPUs[2].MigEnabled)
	}
	var got []string
	for _, in := range node.GPUs[0].MigInstances {
		got = append(got, in.Profile)
	}
	if strings.Join(got, ",") != "3g.40gb,2g.20gb,1g.10gb" {
		t.Fatalf("instances %v (ordered by placement)", got)
	}
	// Applying again changes nothing.
	plan, _ = partition.Resolve(cfg, nil, node)
	if changed, err := partition.Apply(ctx, lib, node, plan, nil); err != nil || changed {
		t.Fatalf("second Apply: changed=%v err=%v", changed, err)
	}
	// A config that wants GPU 0 whole is refused while instances exist, and
	// nothing else is changed (GPU 1 keeps its MIG mode).
	if err := lib.(*nvmlbackend.Mock).GPUs()[1].EnableMIG(); err != nil {
		t.Fatal(err)
	}
	node = discover(t, lib)
	whole, _ := partition.Parse([]byte("default: {gpus: [{mode: whole}]}"))
	plan, _ = partition.Resolve(whole, nil, node)
	if _, err := partition.Apply(ctx, lib, node, plan, nil); err == nil || !strings.Contains(err.Error(), "has 3 MIG instances") {
		t.Fatalf("Apply whole over instances: %v", err)
	}
	if node2 := discover(t, lib); !node2.GPUs[1].MigEnabled {
		t.Fatal("a refused plan changed GPU 1")
	}
	// A different layout over existing instances is refused too.
	other, _ := partition.Parse([]byte("default: {gpus: [{indices: [0], mode: staticMIG, layout: [{profile: 7g.80gb}]}]}"))
	plan, _ = partition.Resolve(other, nil, node)
	if _, err := partition.Apply(ctx, lib, node, plan, nil); err == nil || !strings.Contains(err.Error(), "not the configured layout") {
		t.Fatalf("Apply other layout: %v", err)
	}
}

func TestApplyUndoesAFailedLayout(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	lib, _ := nvmlbackend.Open("mock:dgxa100?gpus=1")
	mock := lib.(*nvmlbackend.Mock)
	gpu := mock.GPUs()[0]
	// The third GPU instance fails, as a driver error would.
	mock.FailCall(gpu.UUID, "CreateGpuInstanceWithPlacement", 2, nvml.ERROR_UNKNOWN)
	cfg, _ := partition.Parse([]byte("default: {gpus: [{mode: staticMIG, layout: [{profile: 1g.5gb}, {profile: 1g.5gb}, {profile: 1g.5gb}]}]}"))
	node := discover(t, lib)
	plan, err := partition.Resolve(cfg, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	_, err = partition.Apply(ctx, lib, node, plan, nil)
	if err == nil || !strings.Contains(err.Error(), "default.gpus[0].layout: GPU 0: create 1g.5gb at memory slice 2: ERROR_UNKNOWN") {
		t.Fatalf("Apply: %v", err)
	}
	if left := gpu.Instances(); len(left) != 0 {
		t.Fatalf("GPU instances left after a failed layout: %v", left)
	}
}

// FuzzParse: any input gives a config or an error, never a panic, and a
// config that parses resolves against a real GPU layout without panicking.
// FuzzParse: any partition config is accepted or refused with an error,
// never a panic; an accepted one encodes and parses back to the same
// config, and resolves on a node (two H100s, and an A100 beside them for
// product rules) to a plan with one known mode per GPU and MIG layouts that
// fit the GPU without overlapping, or to an error naming the entry. Seeds:
// testdata/fuzz/FuzzParse (the chart's and the docs' configs, bad ones).
func FuzzParse(f *testing.F) {
	var nodes []*discovery.Node
	for _, spec := range []string{"mock:dgxh100?gpus=2", "mock:dgxa100?gpus=1"} {
		lib, err := nvmlbackend.Open(spec)
		if err != nil {
			f.Fatal(err)
		}
		node, err := discovery.Discover(context.Background(), lib)
		if err != nil {
			f.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := partition.Parse(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("config returned with error %v", err)
			}
			return
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("encode accepted config: %v", err)
		}
		again, err := partition.Parse(out)
		if err != nil {
			t.Fatalf("accepted config refused after a round trip: %v\n%s", err, out)
		}
		if out2, _ := yaml.Marshal(again); string(out2) != string(out) {
			t.Fatalf("round trip changed the config:\n%s\n%s", out, out2)
		}
		for _, node := range nodes {
			for _, labels := range []map[string]string{nil, {"a": "b"}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}} {
				plan, err := partition.Resolve(cfg, labels, node)
				if err != nil {
					if plan != nil || !strings.Contains(err.Error(), "partition config entry") {
						t.Fatalf("resolve: plan %v with error %v", plan, err)
					}
					continue
				}
				checkPlan(t, plan, node)
			}
		}
	})
}

func checkPlan(t *testing.T, plan *partition.Plan, node *discovery.Node) {
	t.Helper()
	if len(plan.GPUs) != len(node.GPUs) {
		t.Fatalf("plan for %d GPUs on a node of %d", len(plan.GPUs), len(node.GPUs))
	}
	for i, gp := range plan.GPUs {
		g := node.GPUs[i]
		if gp.Index != g.Index || gp.UUID != g.UUID || !gp.Mode.Valid() {
			t.Fatalf("GPU %d planned as %+v", i, gp)
		}
		for a, s := range gp.Layout {
			if s.Placement.Start < 0 || s.Placement.Size < 1 {
				t.Fatalf("GPU %d: slot %+v", i, s)
			}
			for _, o := range gp.Layout[a+1:] {
				if s.Placement.Overlaps(o.Placement) {
					t.Fatalf("GPU %d: slots %+v and %+v overlap", i, s, o)
				}
			}
		}
	}
}

// devicePlugin GPUs keep their MIG mode: the device plugin serves whatever
// MIG devices exist, and the agent must not switch them.
func TestApplyLeavesDevicePluginGPUsAlone(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	lib, _ := nvmlbackend.Open("mock:dgxh100?gpus=2")
	dyn, _ := partition.Parse([]byte("default: {gpus: [{mode: staticMIG}]}"))
	node := discover(t, lib)
	plan, err := partition.Resolve(dyn, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := partition.Apply(ctx, lib, node, plan, nil); err != nil {
		t.Fatal(err)
	}
	dp, err := partition.Parse([]byte("default: {gpus: [{indices: [0], mode: devicePlugin}, {indices: [1], mode: whole}]}"))
	if err != nil {
		t.Fatal(err)
	}
	node = discover(t, lib)
	plan, err = partition.Resolve(dp, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := partition.Apply(ctx, lib, node, plan, nil); err != nil {
		t.Fatal(err)
	}
	node = discover(t, lib)
	if !node.GPUs[0].MigEnabled || node.GPUs[1].MigEnabled {
		t.Fatalf("MIG modes %v %v: want GPU 0 left in MIG mode (devicePlugin), GPU 1 switched off (whole)", node.GPUs[0].MigEnabled, node.GPUs[1].MigEnabled)
	}
	if _, err := partition.Parse([]byte("default: {gpus: [{mode: devicePlugin, profiles: [1g.10gb]}]}")); err == nil || !strings.Contains(err.Error(), "default.gpus[0].profiles") {
		t.Fatalf("profiles with devicePlugin: %v", err)
	}
}

// TestApplyWithdrawsAMIGModeChangeThatNeedsAReset: on a GPU that processes
// hold, turning MIG mode on would only take effect after a reset; Apply
// reports it and leaves no pending change behind.
func TestApplyWithdrawsAMIGModeChangeThatNeedsAReset(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mock, _ := nvmlbackend.NewMock("dgxh100", 1)
	gpu := mock.GPUs()[0]
	_ = mock.HoldGPU(gpu.UUID, 1) // nvidia-persistenced
	cfg, _ := partition.Parse([]byte("default: {gpus: [{mode: staticMIG}]}"))
	node := discover(t, mock)
	plan, err := partition.Resolve(cfg, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	_, err = partition.Apply(ctx, mock, node, plan, nil)
	if !errors.Is(err, partition.ErrResetNeeded) || !strings.Contains(err.Error(), "default.gpus[0]: GPU 0") {
		t.Fatalf("Apply: %v, want ErrResetNeeded naming the rule and GPU", err)
	}
	if st := gpu.MIGMode(); st.Current || st.Pending {
		t.Fatalf("MIG mode %+v left behind", st)
	}
}
