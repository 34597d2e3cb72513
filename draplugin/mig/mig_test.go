package mig

import (
	"context"
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func TestCreateDestroy(t *testing.T) {
	lib, err := nvmlbackend.NewMock("dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	gpu := lib.GPUs()[0]
	if ret, _ := gpu.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := node.GPUByUUID(gpu.UUID)
	small, ok := g.Profile("1g.10gb")
	if !ok {
		t.Fatalf("no 1g.10gb profile: %v", g.ProfileNames())
	}
	big, ok := g.Profile("3g.40gb")
	if !ok {
		t.Fatalf("no 3g.40gb profile: %v", g.ProfileNames())
	}
	m := Manager{Lib: lib}
	if on, err := m.MigEnabled(gpu.UUID); err != nil || !on {
		t.Fatalf("MigEnabled = %v, %v", on, err)
	}
	pl := small.Placements[len(small.Placements)-1] // not the first: Create must not pick another
	giID, ciID, err := m.Create(gpu.UUID, uint32(small.GIProfileID), uint32(pl.Start), uint32(pl.Size), uint32(small.CIProfileID))
	if err != nil {
		t.Fatal(err)
	}
	list, err := m.List(gpu.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].GIID != giID || list[0].Start != uint32(pl.Start) || len(list[0].CIIDs) != 1 || list[0].CIIDs[0] != ciID {
		t.Fatalf("instances = %+v", list)
	}
	if id, err := m.DeviceUUID(gpu.UUID, giID, ciID); err != nil || id == gpu.UUID || id[:4] != "MIG-" {
		t.Errorf("DeviceUUID = %q, %v", id, err)
	}
	// The same placement again is occupied.
	if _, _, err := m.Create(gpu.UUID, uint32(small.GIProfileID), uint32(pl.Start), uint32(pl.Size), uint32(small.CIProfileID)); !errors.Is(err, ErrOccupied) {
		t.Errorf("second create: %v, want ErrOccupied", err)
	}
	// An overlapping bigger instance is occupied too.
	for _, bp := range big.Placements {
		if bp.Overlaps(pl) {
			if _, _, err := m.Create(gpu.UUID, uint32(big.GIProfileID), uint32(bp.Start), uint32(bp.Size), uint32(big.CIProfileID)); !errors.Is(err, ErrOccupied) {
				t.Errorf("overlapping create at %d: %v, want ErrOccupied", bp.Start, err)
			}
		}
	}
	if err := m.Destroy(gpu.UUID, uint32(small.GIProfileID), uint32(pl.Start)); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(gpu.UUID, uint32(small.GIProfileID), uint32(pl.Start)); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if list, _ := m.List(gpu.UUID); len(list) != 0 {
		t.Errorf("instances left: %+v", list)
	}
}

// TestFindByIDChecksProfileAndPlacement: after a reboot GPU instance IDs are
// reused; an instance with the recorded ID but another profile is not the
// recorded one and is not destroyed.
func TestFindByIDChecksProfileAndPlacement(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 1)
	gpu := lib.GPUs()[0]
	_ = gpu.EnableMIG()
	m := Manager{Lib: lib}
	// 1g.10gb at 2 and 1g.10gb+me at 2 share the GPU instance ID 9.
	mine, err := gpu.CreateInstance("1g.10gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	found, err := m.FindByID(gpu.UUID, mine.GIID, mine.CIID, uint32(mine.ProfileIndex), 2)
	if err != nil || found == nil {
		t.Fatalf("FindByID of the instance: %v %v", found, err)
	}
	if err := m.DestroyByID(gpu.UUID, mine.GIID, mine.CIID, uint32(mine.ProfileIndex), 2); err != nil || len(gpu.Instances()) != 0 {
		t.Fatalf("DestroyByID: %v, left %v", err, gpu.Instances())
	}
	theirs, err := gpu.CreateInstance("1g.10gb+me", 2)
	if err != nil || theirs.GIID != mine.GIID {
		t.Fatalf("setup: %+v %v", theirs, err)
	}
	if err := m.DestroyByID(gpu.UUID, mine.GIID, mine.CIID, uint32(mine.ProfileIndex), 2); err != nil || len(gpu.Instances()) != 1 {
		t.Fatalf("DestroyByID of another profile's instance with the same ID: %v, left %v", err, gpu.Instances())
	}
}
