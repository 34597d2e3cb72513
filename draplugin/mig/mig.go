// Package mig creates and destroys MIG devices (a GPU instance with one
// compute instance) through NVML at an exact placement. An instance is
// identified by its GPU, its GPU instance and compute instance IDs and its
// profile (FindByID, DestroyByID), which the plugin records when it creates
// it; the placement (Find) only finds an instance the plugin may have
// created just before a crash, before it could record the IDs.
package mig

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Instance is an existing GPU instance on a GPU.
type Instance struct {
	GIID        uint32
	GIProfileID uint32
	Start, Size uint32
	// CIIDs of its compute instances.
	CIIDs []uint32

	gi nvml.GpuInstance
}

// Overlaps reports whether the instance shares a memory slice with the
// placement.
func (i Instance) Overlaps(start, size uint32) bool {
	return i.Start < start+size && start < i.Start+i.Size
}

// ErrOccupied is returned (wrapped) when the placement is taken.
var ErrOccupied = errors.New("MIG placement is occupied")

// Manager acts on the GPUs of one NVML library.
type Manager struct {
	Lib nvml.Interface
}

func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("%s: %w", what, ret)
}

func (m Manager) device(uuid string) (nvml.Device, error) {
	dev, ret := m.Lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("get GPU "+uuid, ret)
	}
	return dev, nil
}

// MigEnabled reports whether MIG mode is on (current mode).
func (m Manager) MigEnabled(uuid string) (bool, error) {
	dev, err := m.device(uuid)
	if err != nil {
		return false, err
	}
	cur, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return false, nil
	}
	if ret != nvml.SUCCESS {
		return false, nvmlErr("get MIG mode of "+uuid, ret)
	}
	return cur == nvml.DEVICE_MIG_ENABLE, nil
}

// List returns the GPU instances on the GPU, of every profile; none while
// MIG mode is off.
func (m Manager) List(uuid string) ([]Instance, error) {
	dev, err := m.device(uuid)
	if err != nil {
		return nil, err
	}
	if on, err := m.MigEnabled(uuid); err != nil || !on {
		return nil, err
	}
	var out []Instance
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := dev.GetGpuInstanceProfileInfo(p)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get GPU instance profile %d of %s", p, uuid), ret)
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("list GPU instances of profile %d on %s", p, uuid), ret)
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, nvmlErr("get GPU instance info on "+uuid, ret)
			}
			inst := Instance{GIID: gii.Id, GIProfileID: uint32(p), Start: gii.Placement.Start, Size: gii.Placement.Size, gi: gi}
			cis, err := computeInstances(gi)
			if err != nil {
				return nil, fmt.Errorf("GPU instance %d on %s: %w", gii.Id, uuid, err)
			}
			for _, ci := range cis {
				cii, ret := ci.GetInfo()
				if ret != nvml.SUCCESS {
					return nil, nvmlErr("get compute instance info", ret)
				}
				inst.CIIDs = append(inst.CIIDs, cii.Id)
			}
			out = append(out, inst)
		}
	}
	return out, nil
}

func computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstance, error) {
	var out []nvml.ComputeInstance
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("get compute instance profile %d", p), ret)
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("list compute instances of profile %d", p), ret)
		}
		out = append(out, cis...)
	}
	return out, nil
}

// Find returns the GPU instance of the profile that starts at start.
func (m Manager) Find(uuid string, giProfileID, start uint32) (*Instance, error) {
	list, err := m.List(uuid)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].GIProfileID == giProfileID && list[i].Start == start {
			return &list[i], nil
		}
	}
	return nil, nil
}

// Create makes a GPU instance of the profile at exactly the placement and
// one compute instance of ciProfileID in it. An occupied placement is
// ErrOccupied: never a different placement. If the compute instance cannot
// be made, the GPU instance is destroyed again.
func (m Manager) Create(uuid string, giProfileID, start, size, ciProfileID uint32) (giID, ciID uint32, err error) {
	dev, err := m.device(uuid)
	if err != nil {
		return 0, 0, err
	}
	info, ret := dev.GetGpuInstanceProfileInfo(int(giProfileID))
	if ret != nvml.SUCCESS {
		return 0, 0, nvmlErr(fmt.Sprintf("get GPU instance profile %d of %s", giProfileID, uuid), ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: start, Size: size})
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
		return 0, 0, fmt.Errorf("%w: GPU %s, memory slices %d..%d", ErrOccupied, uuid, start, start+size-1)
	}
	if ret != nvml.SUCCESS {
		return 0, 0, nvmlErr(fmt.Sprintf("create GPU instance of profile %d at %d on %s", giProfileID, start, uuid), ret)
	}
	gii, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, errors.Join(nvmlErr("get new GPU instance info", ret), destroyGI(gi))
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(int(ciProfileID), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return 0, 0, errors.Join(nvmlErr(fmt.Sprintf("get compute instance profile %d", ciProfileID), ret), destroyGI(gi))
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		return 0, 0, errors.Join(nvmlErr(fmt.Sprintf("create compute instance of profile %d in GPU instance %d on %s", ciProfileID, gii.Id, uuid), ret), destroyGI(gi))
	}
	cii, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, nvmlErr("get new compute instance info", ret)
	}
	return gii.Id, cii.Id, nil
}

// FindByID returns the GPU instance giID on the GPU if it is of the profile
// (index) and starts at start and has compute instance ciID, else nil: an
// instance with the same ID but another profile or placement is someone
// else's.
func (m Manager) FindByID(uuid string, giID, ciID, giProfileID, start uint32) (*Instance, error) {
	list, err := m.List(uuid)
	if err != nil {
		return nil, err
	}
	for i := range list {
		in := &list[i]
		if in.GIID == giID && in.GIProfileID == giProfileID && in.Start == start && slices.Contains(in.CIIDs, ciID) {
			return in, nil
		}
	}
	return nil, nil
}

// DestroyByID removes the instance FindByID finds; none is not an error.
func (m Manager) DestroyByID(uuid string, giID, ciID, giProfileID, start uint32) error {
	inst, err := m.FindByID(uuid, giID, ciID, giProfileID, start)
	if err != nil || inst == nil {
		return err
	}
	return m.DestroyInstance(uuid, *inst)
}

// Destroy removes the GPU instance of the profile at start with all its
// compute instances. An instance that does not exist is not an error.
func (m Manager) Destroy(uuid string, giProfileID, start uint32) error {
	inst, err := m.Find(uuid, giProfileID, start)
	if err != nil || inst == nil {
		return err
	}
	return m.DestroyInstance(uuid, *inst)
}

// DestroyInstance removes a listed instance.
func (m Manager) DestroyInstance(uuid string, inst Instance) error {
	if err := destroyGI(inst.gi); err != nil {
		return fmt.Errorf("destroy GPU instance %d (profile %d at %d) on %s: %w", inst.GIID, inst.GIProfileID, inst.Start, uuid, err)
	}
	return nil
}

func destroyGI(gi nvml.GpuInstance) error {
	cis, err := computeInstances(gi)
	if err != nil {
		return err
	}
	for _, ci := range cis {
		if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
			return nvmlErr("destroy compute instance", ret)
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return nvmlErr("destroy GPU instance", ret)
	}
	return nil
}

// DeviceUUID returns the MIG device UUID of (GI, CI) on the GPU, used as
// CUDA_VISIBLE_DEVICES of an MPS daemon that serves the MIG device.
func (m Manager) DeviceUUID(uuid string, giID, ciID uint32) (string, error) {
	dev, err := m.device(uuid)
	if err != nil {
		return "", err
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("get MIG device count of "+uuid, ret)
	}
	for i := 0; i < n; i++ {
		mdev, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return "", nvmlErr("get MIG device handle", ret)
		}
		g, ret1 := mdev.GetGpuInstanceId()
		c, ret2 := mdev.GetComputeInstanceId()
		if ret1 != nvml.SUCCESS || ret2 != nvml.SUCCESS || uint32(g) != giID || uint32(c) != ciID {
			continue
		}
		id, ret := mdev.GetUUID()
		if ret != nvml.SUCCESS {
			return "", nvmlErr("get MIG device UUID", ret)
		}
		return id, nil
	}
	return "", fmt.Errorf("no MIG device for GPU instance %d, compute instance %d on %s", giID, ciID, uuid)
}
