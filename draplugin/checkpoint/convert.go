package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// versionPrefix starts every checkpoint version; the number follows.
const versionPrefix = "tessera.gpu/checkpoint-v"

// newer says whether version is a checkpoint format after the current one.
func newer(version string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(version, versionPrefix))
	return strings.HasPrefix(version, versionPrefix) && err == nil && n > 3
}

// decodeCurrent reads data of the current format (strict: unknown fields
// are errors) or of a newer one declared readable as this one.
func decodeCurrent(raw []byte, strict bool) (Data, error) {
	d := NewData()
	dec := json.NewDecoder(bytes.NewReader(raw))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&d); err != nil {
		return Data{}, err
	}
	if d.Claims == nil {
		d.Claims = map[types.UID]*Claim{}
	}
	return d, nil
}

// The v2 format (frozen: never change these types). v3 only added fields,
// so converting is copying.
type (
	dataV2 struct {
		Claims map[types.UID]*claimV2 `json:"claims,omitempty"`
	}
	claimV2 struct {
		UID       types.UID  `json:"uid"`
		Namespace string     `json:"namespace"`
		Name      string     `json:"name"`
		State     ClaimState `json:"state"`
		Devices   []deviceV2 `json:"devices"`
	}
	deviceV2 struct {
		Requests     []string   `json:"requests"`
		Pool         string     `json:"pool"`
		Device       string     `json:"device"`
		ShareID      *types.UID `json:"shareID,omitempty"`
		AdminAccess  bool       `json:"adminAccess,omitempty"`
		Kind         DeviceKind `json:"kind"`
		GPUUUID      string     `json:"gpuUUID"`
		GPUMinor     int        `json:"gpuMinor"`
		MIG          *migV2     `json:"mig,omitempty"`
		Sharing      *sharingV1 `json:"sharing,omitempty"`
		CDIDeviceIDs []string   `json:"cdiDeviceIDs"`
	}
	migV2 struct {
		ParentUUID  string `json:"parentUUID"`
		ParentMinor int    `json:"parentMinor"`
		Profile     string `json:"profile"`
		GIProfileID uint32 `json:"giProfileID"`
		CIProfileID uint32 `json:"ciProfileID"`
		Start       uint32 `json:"start"`
		Size        uint32 `json:"size"`
		GIID        uint32 `json:"giID"`
		CIID        uint32 `json:"ciID"`
		Created     bool   `json:"created"`
		BootID      string `json:"bootID,omitempty"`
		Static      bool   `json:"static,omitempty"`
	}
	// sharingV1 is Sharing as v1 and v2 wrote it.
	sharingV1 struct {
		Strategy               string `json:"strategy"`
		ActiveThreadPercentage int32  `json:"activeThreadPercentage,omitempty"`
		PinnedMemoryLimitBytes int64  `json:"pinnedMemoryLimitBytes,omitempty"`
		MPSDevice              string `json:"mpsDevice,omitempty"`
		TimeSliceInterval      int    `json:"timeSliceInterval,omitempty"`
	}
)

// decodeV2 reads a v2 checkpoint strictly and converts it. Its MPS shares
// keep Sharing.MPSDevice and get no Claim.MPS: they were served by a
// daemon per device, which the plugin keeps until their last claim goes.
func decodeV2(raw []byte) (Data, error) {
	var v2 dataV2
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v2); err != nil {
		return Data{}, err
	}
	out := NewData()
	for uid, c := range v2.Claims {
		if c == nil {
			// A JSON null: no record to convert (Validate says so for v3).
			return Data{}, fmt.Errorf("claim %q: no record", uid)
		}
		nc := &Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, State: c.State}
		for _, d := range c.Devices {
			nd := Device{Requests: d.Requests, Pool: d.Pool, Device: d.Device, ShareID: d.ShareID, AdminAccess: d.AdminAccess,
				Kind: d.Kind, GPUUUID: d.GPUUUID, GPUMinor: d.GPUMinor, Sharing: d.Sharing.convert(), CDIDeviceIDs: d.CDIDeviceIDs}
			if m := d.MIG; m != nil {
				nd.MIG = &MIGInstance{ParentUUID: m.ParentUUID, ParentMinor: m.ParentMinor, Profile: m.Profile, GIProfileID: m.GIProfileID,
					CIProfileID: m.CIProfileID, Start: m.Start, Size: m.Size, GIID: m.GIID, CIID: m.CIID, Created: m.Created, BootID: m.BootID, Static: m.Static}
			}
			nc.Devices = append(nc.Devices, nd)
		}
		out.Claims[uid] = nc
	}
	return out, nil
}

func (s *sharingV1) convert() *Sharing {
	if s == nil {
		return nil
	}
	return &Sharing{Strategy: s.Strategy, ActiveThreadPercentage: s.ActiveThreadPercentage, PinnedMemoryLimitBytes: s.PinnedMemoryLimitBytes,
		MPSDevice: s.MPSDevice, TimeSliceInterval: s.TimeSliceInterval}
}

// The v1 format, as wave 1 wrote it (frozen: never change these types).
type (
	dataV1 struct {
		Claims map[types.UID]*claimV1 `json:"claims,omitempty"`
	}
	claimV1 struct {
		UID       types.UID  `json:"uid"`
		Namespace string     `json:"namespace"`
		Name      string     `json:"name"`
		State     ClaimState `json:"state"`
		Devices   []deviceV1 `json:"devices"`
	}
	deviceV1 struct {
		Requests     []string   `json:"requests"`
		Pool         string     `json:"pool"`
		Device       string     `json:"device"`
		ShareID      *types.UID `json:"shareID,omitempty"`
		AdminAccess  bool       `json:"adminAccess,omitempty"`
		Kind         DeviceKind `json:"kind"`
		GPUUUID      string     `json:"gpuUUID"`
		GPUMinor     int        `json:"gpuMinor"`
		MIG          *migV1     `json:"mig,omitempty"`
		Sharing      *sharingV1 `json:"sharing,omitempty"`
		CDIDeviceIDs []string   `json:"cdiDeviceIDs"`
	}
	migV1 struct {
		ParentUUID  string `json:"parentUUID"`
		ParentMinor int    `json:"parentMinor"`
		Profile     string `json:"profile"`
		GIProfileID uint32 `json:"giProfileID"`
		CIProfileID uint32 `json:"ciProfileID"`
		Start       uint32 `json:"start"`
		Size        uint32 `json:"size"`
		GIID        uint32 `json:"giID"`
		CIID        uint32 `json:"ciID"`
		Created     bool   `json:"created"`
		Static      bool   `json:"static,omitempty"`
	}
)

// decodeV1 reads a v1 checkpoint and converts it: a v1 MIG record has no
// boot of its own; the envelope's boot is the boot it was written in.
func decodeV1(raw []byte, bootID string) (Data, error) {
	var v1 dataV1
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v1); err != nil {
		return Data{}, err
	}
	out := NewData()
	for uid, c := range v1.Claims {
		if c == nil {
			// A JSON null: no record to convert (Validate says so for v3).
			return Data{}, fmt.Errorf("claim %q: no record", uid)
		}
		nc := &Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, State: c.State}
		for _, d := range c.Devices {
			nd := Device{Requests: d.Requests, Pool: d.Pool, Device: d.Device, ShareID: d.ShareID, AdminAccess: d.AdminAccess,
				Kind: d.Kind, GPUUUID: d.GPUUUID, GPUMinor: d.GPUMinor, Sharing: d.Sharing.convert(), CDIDeviceIDs: d.CDIDeviceIDs}
			if m := d.MIG; m != nil {
				nd.MIG = &MIGInstance{ParentUUID: m.ParentUUID, ParentMinor: m.ParentMinor, Profile: m.Profile, GIProfileID: m.GIProfileID,
					CIProfileID: m.CIProfileID, Start: m.Start, Size: m.Size, GIID: m.GIID, CIID: m.CIID, Created: m.Created, Static: m.Static}
				if m.Created || m.Static {
					nd.MIG.BootID = bootID
				}
			}
			nc.Devices = append(nc.Devices, nd)
		}
		out.Claims[uid] = nc
	}
	return out, nil
}
