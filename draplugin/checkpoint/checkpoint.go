// Package checkpoint persists what the kubelet plugin has prepared on this
// node, so that a restarted plugin can finish or undo its work.
//
// The file is a versioned envelope around the state:
//
//	{"version":"tessera.gpu/checkpoint-v3","readableAs":"tessera.gpu/checkpoint-v2","bootID":"…","checksum":"crc32c:…","data":{…}}
//
// Versions (convert.go): v1 (wave 1) and v2 are read and converted; v3 is
// written. v3 only adds fields (a claim's own MPS control daemon, a whole
// GPU's compute mode), so it declares itself readable as v2: a tessera-node
// that writes v2 keeps reading it after a downgrade. A newer file is read
// only where its writer declared it readable as v2 or v3 ("readableAs"), and
// refused otherwise with ErrNewerVersion, leaving the file and the prepared
// claims alone.
//
// The checksum covers the exact bytes of data. Writes go to a temporary
// file in the same directory, are fsynced, renamed over the old file and
// the directory is fsynced, so a crash leaves either the old or the new
// checkpoint, never a mix.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The formats. Version is the one written.
const (
	// VersionV1 identified MIG instances by placement only.
	VersionV1 = "tessera.gpu/checkpoint-v1"
	// VersionV2 records every MIG instance tessera created by GPU UUID, GPU
	// and compute instance ID and boot ID.
	VersionV2 = "tessera.gpu/checkpoint-v2"
	// VersionV3 adds Claim.MPS (the claim's own MPS control daemon, which
	// replaces v2's daemon per GPU) and Sharing.DeviceIndex and
	// Sharing.ExclusiveProcess.
	VersionV3 = "tessera.gpu/checkpoint-v3"
	Version   = VersionV3
)

// State of a claim in the checkpoint.
type ClaimState string

const (
	// PrepareStarted is written before the first side effect of a prepare.
	PrepareStarted ClaimState = "PrepareStarted"
	// PrepareCompleted is written after the last side effect of a prepare.
	PrepareCompleted ClaimState = "PrepareCompleted"
)

// DeviceKind is what a prepared device is.
type DeviceKind string

const (
	KindGPU    DeviceKind = "gpu"    // a whole GPU held exclusively
	KindMIG    DeviceKind = "mig"    // a MIG device held exclusively
	KindShared DeviceKind = "shared" // a fractional share of a GPU
)

// Data is everything the plugin remembers.
type Data struct {
	// Claims by UID.
	Claims map[types.UID]*Claim `json:"claims,omitempty"`
}

// Claim is one prepared (or being prepared) ResourceClaim.
type Claim struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	Devices   []Device   `json:"devices"`
	// MPS is the claim's own MPS control daemon (v3), serving every device
	// of the claim whose sharing strategy is MPS. Nil when no device uses
	// MPS, and in a record converted from v2, whose MPS devices were served
	// by a daemon per device (Sharing.MPSDevice).
	MPS *ClaimDaemon `json:"mps,omitempty"`
}

// ClaimDaemon is a claim's MPS control daemon: where it lives and what it
// was started with. Everything here is decided before the daemon starts,
// except SMPartitions, which the daemon hands out.
type ClaimDaemon struct {
	// ID names its directory under the MPS directory (claims/<ID>) and its
	// pod; it is the claim UID.
	ID string `json:"id"`
	// Launcher started it: "pod" (a pod of its own) or "process" (a child
	// of tessera-node).
	Launcher string `json:"launcher"`
	// Devices are the UUIDs (GPU-… or MIG-…) in CUDA_VISIBLE_DEVICES order:
	// the order CUDA enumerates the claim's devices in its containers.
	Devices []string `json:"devices"`
	// PinnedMemoryMiB is the daemon's default pinned device memory limit
	// per device ordinal (0: none).
	PinnedMemoryMiB []int64 `json:"pinnedMemoryMiB,omitempty"`
	// ActiveThreadPercentage is the daemon's default (0: none).
	ActiveThreadPercentage int32 `json:"activeThreadPercentage,omitempty"`
	// StaticPartitioning: started with -S; SMPartitions[i] is the static SM
	// partition (ID from sm_partition add) of device ordinal i, of
	// SMPartitionChunks[i] chunks.
	StaticPartitioning bool     `json:"staticPartitioning,omitempty"`
	SMPartitions       []string `json:"smPartitions,omitempty"`
	SMPartitionChunks  []int    `json:"smPartitionChunks,omitempty"`
}

// Device is one allocated device of a claim and what was done for it.
type Device struct {
	Requests []string   `json:"requests"`
	Pool     string     `json:"pool"`
	Device   string     `json:"device"`
	ShareID  *types.UID `json:"shareID,omitempty"`
	// AdminAccess devices are reachable by a monitoring claim beside the
	// claim that uses them: never exclusive, never created or destroyed.
	AdminAccess bool       `json:"adminAccess,omitempty"`
	Kind        DeviceKind `json:"kind"`
	// GPUUUID and GPUMinor identify the physical (parent) GPU.
	GPUUUID  string `json:"gpuUUID"`
	GPUMinor int    `json:"gpuMinor"`
	// MIG is set for KindMIG.
	MIG *MIGInstance `json:"mig,omitempty"`
	// Sharing is how the device is shared, nil for exclusive use.
	Sharing *Sharing `json:"sharing,omitempty"`
	// CDIDeviceIDs returned to the kubelet.
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// MIGInstance identifies a GPU instance and its compute instance. The
// placement is recorded before the instance is created (PrepareStarted),
// so a restart can find an instance created just before a crash; once
// created, the instance is identified by its IDs, GPU and boot.
type MIGInstance struct {
	ParentUUID  string `json:"parentUUID"`
	ParentMinor int    `json:"parentMinor"`
	Profile     string `json:"profile"`
	GIProfileID uint32 `json:"giProfileID"`
	CIProfileID uint32 `json:"ciProfileID"`
	Start       uint32 `json:"start"`
	Size        uint32 `json:"size"`
	// GIID and CIID are known once created (0 before; use Created).
	GIID    uint32 `json:"giID"`
	CIID    uint32 `json:"ciID"`
	Created bool   `json:"created"`
	// BootID is the boot the instance was created (or found) in: MIG
	// instances do not survive a reboot, and IDs are reused after it.
	BootID string `json:"bootID,omitempty"`
	// Static is true for an instance that existed before the claim (an
	// administrator's static MIG device): it is used but never destroyed.
	Static bool `json:"static,omitempty"`
}

// Sharing records how a device is shared.
type Sharing struct {
	Strategy string `json:"strategy"` // "MPS" or "TimeSlicing"
	// MPS client limits of this claim.
	ActiveThreadPercentage int32 `json:"activeThreadPercentage,omitempty"`
	PinnedMemoryLimitBytes int64 `json:"pinnedMemoryLimitBytes,omitempty"`
	// MPSDevice is the UUID the MPS daemon serves (GPU or MIG device).
	MPSDevice string `json:"mpsDevice,omitempty"`
	// TimeSliceInterval is 0..3 for time-slicing.
	TimeSliceInterval int `json:"timeSliceInterval,omitempty"`
	// DeviceIndex is the device's ordinal among the devices of the claim's
	// MPS daemon (Claim.MPS.Devices), v3.
	DeviceIndex int `json:"deviceIndex,omitempty"`
	// ExclusiveProcess: the plugin set the whole GPU's compute mode to
	// EXCLUSIVE_PROCESS (only the claim's MPS server may hold a context);
	// unprepare sets it back to DEFAULT. v3.
	ExclusiveProcess bool `json:"exclusiveProcess,omitempty"`
}

type envelope struct {
	Version string `json:"version"`
	// ReadableAs, written by a newer format whose data an older reader may
	// read ignoring the fields it does not know, names that older version.
	ReadableAs string          `json:"readableAs,omitempty"`
	BootID     string          `json:"bootID"`
	Checksum   string          `json:"checksum"`
	Data       json.RawMessage `json:"data"`
}

// Checkpoint is a loaded checkpoint.
type Checkpoint struct {
	BootID string
	Data   Data
	// ReadVersion is the version of the file (VersionV1 for a converted
	// wave-1 checkpoint, a newer one for a downgrade).
	ReadVersion string
}

// ErrCorrupt marks a checkpoint that cannot be trusted.
var ErrCorrupt = errors.New("checkpoint is corrupt")

// ErrNewerVersion marks a checkpoint of a newer format that this version
// cannot read: a downgrade. The file is not corrupt and must be kept.
var ErrNewerVersion = errors.New("checkpoint was written by a newer tessera-node")

// NewData returns empty state.
func NewData() Data {
	return Data{Claims: map[types.UID]*Claim{}}
}

// Read loads the checkpoint at path. A missing file returns (nil, nil). A
// file that does not parse, has another version or a wrong checksum
// returns an error wrapping ErrCorrupt.
func Read(path string) (*Checkpoint, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	return Decode(raw)
}

// Decode parses and verifies checkpoint bytes of any version this package
// reads, converting older ones to the current Data.
func Decode(raw []byte) (*Checkpoint, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if got := checksum(env.Data); got != env.Checksum {
		return nil, fmt.Errorf("%w: checksum %s does not match content (%s)", ErrCorrupt, env.Checksum, got)
	}
	cp := &Checkpoint{BootID: env.BootID, ReadVersion: env.Version}
	var err error
	switch {
	case env.Version == VersionV3:
		cp.Data, err = decodeCurrent(env.Data, true)
	case env.Version == VersionV2:
		cp.Data, err = decodeV2(env.Data)
	case env.Version == VersionV1:
		cp.Data, err = decodeV1(env.Data, env.BootID)
	case newer(env.Version) && (env.ReadableAs == VersionV3 || env.ReadableAs == VersionV2):
		// A newer format that keeps the meaning of one this version knows:
		// read what v3 knows, ignoring the rest.
		cp.Data, err = decodeCurrent(env.Data, false)
	case newer(env.Version):
		return nil, fmt.Errorf("%w: version %q (this tessera-node reads %s, %s and %s); refusing to start so that the claims it records stay prepared: run the newer tessera-node again, or drain the node before downgrading", ErrNewerVersion, env.Version, VersionV1, VersionV2, VersionV3)
	default:
		return nil, fmt.Errorf("%w: unknown version %q", ErrCorrupt, env.Version)
	}
	if err == nil {
		err = cp.Data.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s data: %w", ErrCorrupt, env.Version, err)
	}
	return cp, nil
}

// Encode serializes the state with the envelope.
func Encode(bootID string, data *Data) ([]byte, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint data: %w", err)
	}
	return wrap(bootID, raw)
}

// Write stores the state atomically at path.
func Write(path, bootID string, data *Data) error {
	b, err := Encode(bootID, data)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, b, 0o600)
}

// MoveAside renames a corrupt checkpoint so that it is kept for inspection
// but no longer read. It returns the new name.
func MoveAside(path string, now time.Time) (string, error) {
	dst := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, dst); err != nil {
		return "", fmt.Errorf("move corrupt checkpoint aside: %w", err)
	}
	return dst, syncDir(filepath.Dir(path))
}

// castagnoli is CRC-32C, hardware-accelerated on amd64 and arm64: it
// detects torn or altered files (the threat here) at a fraction of the
// cost of a cryptographic hash over hundreds of KiB per write.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) string {
	return fmt.Sprintf("crc32c:%08x", crc32.Checksum(b, castagnoli))
}

// WriteFileAtomic writes data to a temporary file next to path, fsyncs it,
// renames it to path and fsyncs the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// BootID reads the kernel's boot ID, which changes at every boot: MIG
// instances, MPS daemons and /var/run do not survive a reboot, so neither
// does a checkpoint written before it.
func BootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot ID: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Validate checks what the plugin relies on when it acts on a loaded
// state: every claim is there (a JSON null is not a claim), is recorded
// under its own UID, has a known state, and every device has a known kind,
// and a MIG device its instance record. Decode refuses a file whose state
// does not validate, as corrupt.
func (d *Data) Validate() error {
	var errs []error
	for uid, c := range d.Claims {
		if c == nil {
			errs = append(errs, fmt.Errorf("claim %q: no record", uid))
			continue
		}
		if c.UID != uid {
			errs = append(errs, fmt.Errorf("claim %q: recorded with uid %q", uid, c.UID))
		}
		if c.State != PrepareStarted && c.State != PrepareCompleted {
			errs = append(errs, fmt.Errorf("claim %q: unknown state %q", uid, c.State))
		}
		for i, dev := range c.Devices {
			switch {
			case dev.Kind != KindGPU && dev.Kind != KindMIG && dev.Kind != KindShared:
				errs = append(errs, fmt.Errorf("claim %q: device %d: unknown kind %q", uid, i, dev.Kind))
			case dev.Kind == KindMIG && dev.MIG == nil:
				errs = append(errs, fmt.Errorf("claim %q: device %d: MIG device without its instance record", uid, i))
			}
		}
	}
	return errors.Join(errs...)
}
