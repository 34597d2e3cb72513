package deviceplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	tesseracdi "github.com/tessera-gpu/tessera/draplugin/cdi"
)

const (
	// visibleDevicesEnv is read by the NVIDIA container runtime hook, which
	// injects the driver and the MIG capabilities of the devices it names.
	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
	// cdiAnnotationPlugin prefixes the CDI annotation key (cdi.k8s.io/<it>_<id>).
	cdiAnnotationPlugin = "tessera-device-plugin"
)

// Allocate tells the kubelet how to give each container its devices, in the
// forms the config's deviceListStrategy names. Replicas of one GPU collapse
// to that GPU.
func (s *server) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	logger := klog.FromContext(s.p.ctx).WithValues("resource", s.res.name)
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		cresp, err := s.p.allocate(s.res, cr.GetDevicesIds())
		if err != nil {
			s.p.metrics.allocationErrors.WithLabelValues(s.res.name).Inc()
			logger.Error(err, "Allocate refused", "devices", cr.GetDevicesIds())
			return nil, status.Errorf(codes.InvalidArgument, "allocate %s: %v", s.res.name, err)
		}
		s.p.metrics.allocations.WithLabelValues(s.res.name).Inc()
		logger.V(2).Info("Allocated", "devices", cr.GetDevicesIds())
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

func (p *Plugin) allocate(r *resource, deviceIDs []string) (*pluginapi.ContainerAllocateResponse, error) {
	if len(deviceIDs) == 0 {
		return nil, fmt.Errorf("no devices requested")
	}
	if ts := p.cfg.TimeSlicing; r.replicated && ts.FailRequestsGreaterThanOne && len(deviceIDs) > 1 {
		return nil, fmt.Errorf("%d replicas requested, but timeSlicing.failRequestsGreaterThanOne allows one per container: "+
			"a time-sliced GPU gives no more compute to a container holding several of its replicas", len(deviceIDs))
	}
	var units []*unit
	seen := map[*unit]bool{}
	for _, id := range deviceIDs {
		a, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		if !seen[a.unit] {
			seen[a.unit] = true
			units = append(units, a.unit)
		}
	}
	unitIDs := make([]string, len(units))
	for i, u := range units {
		unitIDs[i] = u.id
	}

	resp := &pluginapi.ContainerAllocateResponse{}
	for _, strategy := range p.cfg.DeviceListStrategy {
		switch strategy {
		case DeviceListEnvVar:
			specs, err := p.deviceSpecs(units)
			if err != nil {
				return nil, err
			}
			resp.Envs = map[string]string{visibleDevicesEnv: strings.Join(unitIDs, ",")}
			resp.Devices = specs
		case DeviceListCDIAnnotations:
			ann, err := cdi.UpdateAnnotations(nil, cdiAnnotationPlugin, annotationID(deviceIDs), p.cdiNames(unitIDs))
			if err != nil {
				return nil, fmt.Errorf("building CDI annotation (config field cdiKind %q): %w", p.cfg.CDIKind, err)
			}
			resp.Annotations = ann
		case DeviceListCDICRI:
			for _, name := range p.cdiNames(unitIDs) {
				resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: name})
			}
		}
	}
	return resp, nil
}

// cdiNames are the fully qualified CDI names <kind>=<uuid>.
func (p *Plugin) cdiNames(unitIDs []string) []string {
	out := make([]string, len(unitIDs))
	for i, id := range unitIDs {
		out[i] = p.cfg.CDIKind + "=" + id
	}
	return out
}

// annotationID makes the per-container part of the CDI annotation key: it
// must be unique among a container's annotations and stay within the 63
// characters of a key name, so a hash of the requested IDs.
func annotationID(deviceIDs []string) string {
	sorted := append([]string(nil), deviceIDs...)
	sort.Strings(sorted)
	sum := sha256.Sum256([]byte(strings.Join(sorted, ",")))
	return hex.EncodeToString(sum[:8])
}

// deviceSpecs lists the control nodes, the device nodes of the units'
// GPUs and, for MIG devices, the capability nodes of their GPU and compute
// instances, which is what a container runtime without the NVIDIA hook
// needs to reach the devices.
func (p *Plugin) deviceSpecs(units []*unit) ([]*pluginapi.DeviceSpec, error) {
	var specs []*pluginapi.DeviceSpec
	seen := map[string]bool{}
	add := func(path string) {
		if !seen[path] {
			seen[path] = true
			specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: path, HostPath: path, Permissions: "rw"})
		}
	}
	for _, path := range tesseracdi.ControlNodes {
		add(path)
	}
	for _, u := range units {
		add(tesseracdi.GPUNode(u.gpu.Minor))
		if u.mig != nil {
			caps, err := p.migCaps.Nodes(u.gpu.Minor, uint32(u.mig.GIID), uint32(u.mig.CIID))
			if err != nil {
				return nil, fmt.Errorf("capability device nodes of MIG device %s: %w", u.id, err)
			}
			for _, path := range caps {
				add(path)
			}
		}
	}
	return specs, nil
}
