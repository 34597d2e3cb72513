package deviceplugin

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"
)

// FuzzParseConfig: any input is accepted or refused with an error, never a
// panic, and an accepted config survives a round trip unchanged.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		"",
		"resourceName: nvidia.com/gpu\nmigStrategy: mixed\ntimeSlicing: {replicas: 4, renameByDefault: true, policy: pack}\n",
		"deviceListStrategy: [cdi-cri, cdi-annotations, envvar]\ncdiKind: k8s.gpu.tessera.dev/gpu\n",
		"timeSlicing: {replicas: 0}",
		"resourceName: [1, 2]",
		"{",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal accepted config: %v", err)
		}
		again, err := ParseConfig(out)
		if err != nil {
			t.Fatalf("accepted config %+v refused after a round trip: %v", cfg, err)
		}
		if string(mustYAML(t, again)) != string(out) {
			t.Fatalf("round trip changed the config:\n%s\n%s", out, mustYAML(t, again))
		}
	})
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzPreferred checks what every preferred allocation must satisfy, for
// whole GPUs (with NVLink topology), replicas (both policies) and MIG
// devices, on random available sets, must-include sets and sizes: no
// duplicates, every must-include device first, only available devices
// besides, and as many as asked (or all there are).
func FuzzPreferred(f *testing.F) {
	f.Add(uint64(1), uint8(0), uint8(2))
	f.Add(uint64(7), uint8(1), uint8(5))
	f.Add(uint64(42), uint8(2), uint8(3))
	f.Add(uint64(9), uint8(3), uint8(1))

	m := newMock(f, 8)
	setTopology(f, m)
	createMIG(f, m, 7, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0) // GPU 7: seven 1g devices
	for start := 1; start < 7; start++ {
		createMIG(f, m, 7, nvml.GPU_INSTANCE_PROFILE_1_SLICE, start)
	}
	_, ctx := ktesting.NewTestContext(f)
	_, gpus := discoverTB(f, ctx, m)
	plugins := []*Plugin{}
	for _, cfg := range []Config{
		{MIGStrategy: MIGStrategyMixed},
		{TimeSlicing: &TimeSlicing{Replicas: 4, Policy: ReplicaPolicySpread}},
		{TimeSlicing: &TimeSlicing{Replicas: 4, Policy: ReplicaPolicyPack}},
	} {
		p, err := New(Options{Config: cfg, GPUs: gpus, NVML: m})
		if err != nil {
			f.Fatal(err)
		}
		plugins = append(plugins, p)
	}
	var resources []struct {
		p *Plugin
		r *resource
	}
	for _, p := range plugins {
		for _, r := range p.resources {
			resources = append(resources, struct {
				p *Plugin
				r *resource
			}{p, r})
		}
	}

	f.Fuzz(func(t *testing.T, seed uint64, which, size uint8) {
		pr := resources[int(which)%len(resources)]
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		all := ids(pr.r.devices)
		var available, must []string
		for _, id := range all {
			if rng.IntN(3) > 0 {
				available = append(available, id)
				if rng.IntN(8) == 0 {
					must = append(must, id)
				}
			}
		}
		rng.Shuffle(len(available), func(i, j int) { available[i], available[j] = available[j], available[i] })
		n := int(size) % (len(all) + 2)
		got, unknown := pr.p.preferred(pr.r, available, must, n)
		if len(unknown) > 0 {
			t.Fatalf("known devices reported unknown: %v", unknown)
		}
		seen := map[string]bool{}
		for _, id := range got {
			if seen[id] {
				t.Fatalf("%s size %d: duplicate %s in %v", pr.r.name, n, id, got)
			}
			seen[id] = true
			if !slices.Contains(available, id) && !slices.Contains(must, id) {
				t.Fatalf("%s size %d: %s not available", pr.r.name, n, id)
			}
		}
		for _, id := range must {
			if !seen[id] {
				t.Fatalf("%s size %d: must-include %s missing from %v", pr.r.name, n, id, got)
			}
		}
		want := max(min(n, len(available)), len(must))
		if len(got) != want {
			t.Fatalf("%s: %d devices for size %d (available %d, must %d): %v", pr.r.name, len(got), n, len(available), len(must), got)
		}
	})
}
