package deviceplugin

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// setTopology gives the mock's 8 GPUs an NVLink topology that GPU index
// order gets wrong: two NVLink quads {0,2,5,7} and {1,3,4,6}, two links
// between every pair of a quad and four between 0-5 and 3-6; the quads sit
// on different CPUs (PCIe ancestor NODE inside a quad, SYSTEM across).
func setTopology(t testing.TB, m *nvmlbackend.Mock) {
	t.Helper()
	if n := len(m.GPUs()); n != 8 {
		t.Fatalf("want 8 GPUs, have %d", n)
	}
	quad := func(i int) int {
		if slices.Contains([]int{0, 2, 5, 7}, i) {
			return 0
		}
		return 1
	}
	setLinks(m, quad, func(i, j int) int {
		switch {
		case quad(i) != quad(j):
			return 0
		case (i == 0 && j == 5) || (i == 5 && j == 0) || (i == 3 && j == 6) || (i == 6 && j == 3):
			return 4
		default:
			return 2
		}
	})
}

// setLinks sets the NVML calls go-gpuallocator v0.6.0 makes
// (internal/links): GetTopologyCommonAncestor (NODE within a CPU group,
// SYSTEM across), GetNvLinkState and GetNvLinkRemotePciInfo (links(i, j)
// NVLinks between GPUs i and j; links must be symmetric).
func setLinks(m *nvmlbackend.Mock, cpu func(i int) int, links func(i, j int) int) {
	gpus := m.GPUs()
	for i, d := range gpus {
		// remote[l] is the GPU at the far end of NVLink l.
		var remote []*nvmlbackend.GPU
		for j := range gpus {
			if j == i {
				continue
			}
			for n := 0; n < links(i, j); n++ {
				remote = append(remote, gpus[j])
			}
		}
		d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			// go-gpuallocator passes go-nvlib's wrapper, not the mock device.
			id, ret := other.GetUUID()
			if ret != nvml.SUCCESS {
				return 0, ret
			}
			j := slices.IndexFunc(gpus, func(g *nvmlbackend.GPU) bool { return g.UUID == id })
			if j < 0 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if cpu(j) == cpu(i) {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= len(remote) {
				return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if link >= len(remote) {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return remote[link].GetPciInfo()
		}
	}
}

// preferredClient runs a plugin with cfg on the mock and returns a client
// of its only resource plus the GPU UUIDs by index.
func preferredClient(t *testing.T, m *nvmlbackend.Mock, cfg Config) (pluginapi.DevicePluginClient, []string, *Plugin) {
	t.Helper()
	node, gpus := discover(t, m)
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	cfg.PluginDir = dir
	p := newPlugin(t, Options{Config: cfg, GPUs: gpus, NVML: m})
	runPlugin(t, p)
	reg := k.nextRegistration()
	var uuids []string
	for _, g := range node.GPUs {
		uuids = append(uuids, g.UUID)
	}
	return k.dial(reg.Endpoint), uuids, p
}

func askPreferred(t *testing.T, c pluginapi.DevicePluginClient, available, must []string, size int) []string {
	t.Helper()
	resp, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, MustIncludeDeviceIDs: must, AllocationSize: int32(size)}},
	})
	if err != nil {
		t.Fatalf("GetPreferredAllocation: %v", err)
	}
	if len(resp.ContainerResponses) != 1 {
		t.Fatalf("%d container responses, want 1", len(resp.ContainerResponses))
	}
	return resp.ContainerResponses[0].DeviceIDs
}

// indexes maps UUIDs (or UUID::replica IDs) back to "gpu[::replica]"
// strings sorted, so that sets read like the topology above.
func indexes(t *testing.T, uuids, ids []string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		uuid, replica, isReplica := strings.Cut(id, replicaSeparator)
		i := slices.Index(uuids, uuid)
		if i < 0 {
			t.Fatalf("unknown device %q", id)
		}
		s := fmt.Sprint(i)
		if isReplica {
			s += replicaSeparator + replica
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func pick(uuids []string, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, uuids[i])
	}
	return out
}

func TestPreferredAllocationFollowsNVLink(t *testing.T) {
	m := newMock(t, 8)
	setTopology(t, m)
	c, uuids, _ := preferredClient(t, m, Config{})
	all := pick(uuids, 0, 1, 2, 3, 4, 5, 6, 7)
	for _, tc := range []struct {
		name      string
		available []int
		must      []int
		size      int
		want      []string
	}{
		// The best pair is one of the two 4-link pairs; 0-5 comes first.
		{"pair from all", []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, 2, []string{"0", "5"}},
		{"quad from all", []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, 4, []string{"0", "2", "5", "7"}},
		{"pair without 0 and 5", []int{1, 2, 3, 6, 7}, nil, 2, []string{"3", "6"}},
		// Must include 7: its best partner that keeps the rest paired well.
		{"pair with 7", []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{7}, 2, []string{"2", "7"}},
		// Three of quad B beat the 4-link pair 0-5 plus any third GPU.
		{"three of five", []int{0, 1, 3, 5, 6}, nil, 3, []string{"1", "3", "6"}},
		{"all", []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, 8, []string{"0", "1", "2", "3", "4", "5", "6", "7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := indexes(t, uuids, askPreferred(t, c, pick(uuids, tc.available...), pick(uuids, tc.must...), tc.size))
			if !slices.Equal(got, tc.want) {
				t.Errorf("picked GPUs %v, want %v", got, tc.want)
			}
		})
	}
	// Devices the plugin does not serve (e.g. from a kubelet checkpoint
	// older than the plugin's device list) never fail the pod's admission:
	// unknown available devices are not picked, unknown must-include ones
	// are kept.
	got := askPreferred(t, c, append([]string{"GPU-gone"}, all...), nil, 2)
	if g := indexes(t, uuids, got); !slices.Equal(g, []string{"0", "5"}) {
		t.Errorf("with an unknown available device: picked %v, want [0 5]", g)
	}
	got = askPreferred(t, c, append([]string{"GPU-gone"}, all...), []string{"GPU-gone"}, 3)
	if len(got) != 3 || got[0] != "GPU-gone" || !slices.Equal(indexes(t, uuids, got[1:]), []string{"0", "5"}) {
		t.Errorf("with an unknown must-include device: picked %v, want GPU-gone then GPUs 0 and 5", got)
	}
	// Fewer devices than asked: all of them, the kubelet decides.
	if got := indexes(t, uuids, askPreferred(t, c, pick(uuids, 4, 1), nil, 3)); !slices.Equal(got, []string{"1", "4"}) {
		t.Errorf("too few available: %v, want [1 4]", got)
	}
}

// TestPreferredAllocationManyGPUs: above maxExactGPUs available GPUs the
// picks are greedy over the same link scores. 16 GPUs in four NVLink quads
// {q, q+4, q+8, q+12} (one CPU each), two links per pair, four between 5-9.
func TestPreferredAllocationManyGPUs(t *testing.T) {
	m := newMock(t, 16)
	setLinks(m, func(i int) int { return i % 4 }, func(i, j int) int {
		switch {
		case i%4 != j%4:
			return 0
		case (i == 5 && j == 9) || (i == 9 && j == 5):
			return 4
		default:
			return 2
		}
	})
	c, uuids, _ := preferredClient(t, m, Config{})
	all := make([]int, 16)
	for i := range all {
		all[i] = i
	}
	without9 := slices.DeleteFunc(slices.Clone(all), func(i int) bool { return i == 9 })
	for _, tc := range []struct {
		name      string
		available []int
		must      []int
		size      int
		want      []string
	}{
		{"pair", all, nil, 2, []string{"5", "9"}},
		{"quad with the 4-link pair", all, nil, 4, []string{"1", "13", "5", "9"}},
		{"three with 14", all, []int{14}, 3, []string{"14", "2", "6"}},
		{"quad without 9", without9, nil, 4, []string{"0", "12", "4", "8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := indexes(t, uuids, askPreferred(t, c, pick(uuids, tc.available...), pick(uuids, tc.must...), tc.size))
			if !slices.Equal(got, tc.want) {
				t.Errorf("picked GPUs %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPreferredAllocationWithoutTopology: the mock backends of tessera-node
// model no topology (go-nvml mocks panic on the calls); the plugin must not
// crash and falls back to GPU index order.
func TestPreferredAllocationWithoutTopology(t *testing.T) {
	m := newMock(t, 4)
	c, uuids, _ := preferredClient(t, m, Config{})
	if got := indexes(t, uuids, askPreferred(t, c, pick(uuids, 3, 1, 2, 0), pick(uuids, 2), 2)); !slices.Equal(got, []string{"0", "2"}) {
		t.Errorf("picked %v, want must-include 2 then the lowest index, 0", got)
	}
}

func TestPreferredReplicas(t *testing.T) {
	replicasOf := func(uuids []string, gpu int, n ...int) []string {
		var out []string
		for _, r := range n {
			out = append(out, fmt.Sprintf("%s::%d", uuids[gpu], r))
		}
		return out
	}
	// GPU 0 has 4 free replicas, GPU 1 has 2 (two in use), GPU 2 has 3.
	available := func(uuids []string) []string {
		return slices.Concat(replicasOf(uuids, 2, 1, 2, 3), replicasOf(uuids, 0, 0, 1, 2, 3), replicasOf(uuids, 1, 2, 3))
	}
	for _, tc := range []struct {
		policy ReplicaPolicy
		must   func([]string) []string
		size   int
		want   []string
	}{
		// spread: one replica per GPU, least shared GPU first.
		{ReplicaPolicySpread, nil, 1, []string{"0::0"}},
		{ReplicaPolicySpread, nil, 2, []string{"0::0", "2::1"}},
		{ReplicaPolicySpread, nil, 3, []string{"0::0", "1::2", "2::1"}},
		{ReplicaPolicySpread, nil, 5, []string{"0::0", "0::1", "1::2", "2::1", "2::2"}},
		{ReplicaPolicySpread, func(u []string) []string { return replicasOf(u, 1, 3) }, 2, []string{"0::0", "1::3"}},
		// pack: the tightest GPU that fits, already shared ones first.
		{ReplicaPolicyPack, nil, 1, []string{"1::2"}},
		{ReplicaPolicyPack, nil, 2, []string{"1::2", "1::3"}},
		{ReplicaPolicyPack, nil, 3, []string{"2::1", "2::2", "2::3"}},
		{ReplicaPolicyPack, nil, 4, []string{"0::0", "0::1", "0::2", "0::3"}},
		{ReplicaPolicyPack, nil, 6, []string{"0::0", "0::1", "0::2", "0::3", "1::2", "1::3"}},
		{ReplicaPolicyPack, func(u []string) []string { return replicasOf(u, 2, 3) }, 3, []string{"2::1", "2::2", "2::3"}},
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.policy, tc.size), func(t *testing.T) {
			m := newMock(t, 3)
			c, uuids, _ := preferredClient(t, m, Config{TimeSlicing: &TimeSlicing{Replicas: 4, Policy: tc.policy}})
			var must []string
			if tc.must != nil {
				must = tc.must(uuids)
			}
			if got := indexes(t, uuids, askPreferred(t, c, available(uuids), must, tc.size)); !slices.Equal(got, tc.want) {
				t.Errorf("picked %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGreedyAgreesWithBestEffort: on the 8-GPU topology, the greedy pick
// used for large nodes finds the same sets as go-gpuallocator's exact
// policy, which shows that pairScore reads the link types as it does.
func TestGreedyAgreesWithBestEffort(t *testing.T) {
	m := newMock(t, 8)
	setTopology(t, m)
	_, gpus := discover(t, m)
	p := newPlugin(t, Options{GPUs: gpus, NVML: m})
	if p.topo == nil || p.topo.err != nil {
		t.Fatalf("topology not read: %+v", p.topo)
	}
	var avail []*gpuallocator.Device
	for _, g := range gpus {
		avail = append(avail, p.topo.byUUID[g.UUID])
	}
	for _, size := range []int{2, 4, 8} {
		exact := p.topo.policy.Allocate(avail, nil, size)
		greedy := greedyPick(avail, nil, size)
		if !slices.Equal(sortedIndexes(exact), sortedIndexes(greedy)) {
			t.Errorf("size %d: greedy %v, best-effort %v", size, sortedIndexes(greedy), sortedIndexes(exact))
		}
		if setScore(exact) != setScore(greedy) {
			t.Errorf("size %d: scores differ: greedy %d, best-effort %d", size, setScore(greedy), setScore(exact))
		}
	}
	// 0-5 has four NVLinks (400) and the same CPU (20).
	if got := pairScore(p.topo.byUUID[gpus[0].UUID], p.topo.byUUID[gpus[5].UUID]); got != 420 {
		t.Errorf("pair score of GPUs 0 and 5: %d, want 420", got)
	}
	if got := pairScore(p.topo.byUUID[gpus[0].UUID], p.topo.byUUID[gpus[1].UUID]); got != 10 {
		t.Errorf("pair score of GPUs 0 and 1: %d, want 10 (cross-CPU, no NVLink)", got)
	}
}

func sortedIndexes(devs []*gpuallocator.Device) []int {
	var out []int
	for _, d := range devs {
		out = append(out, d.Index)
	}
	slices.Sort(out)
	return out
}
