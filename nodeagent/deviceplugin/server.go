package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// server serves one extended resource on its own unix socket; the kubelet
// wants one endpoint per resource name.
type server struct {
	pluginapi.UnimplementedDevicePluginServer

	p      *Plugin
	res    *resource
	socket string

	// Set by start, cleared by stop; only the Run goroutine touches them.
	grpc      *grpc.Server
	serveDone chan error
}

var _ pluginapi.DevicePluginServer = (*server)(nil)

// socketName is the file name of a resource's socket in the plugin dir,
// e.g. tessera-tessera.dev_mig-1g.10gb.sock.
func socketName(resourceName string) string {
	return "tessera-" + strings.ReplaceAll(resourceName, "/", "_") + ".sock"
}

// start listens on the socket (replacing a stale one left by a crash) and
// serves in the background.
func (s *server) start(ctx context.Context) error {
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", s.socket, err)
	}
	lis, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listening on %s for resource %s: %w", s.socket, s.res.name, err)
	}
	// WaitForHandlers makes Stop wait for running handlers (ListAndWatch
	// streams), so that no goroutine outlives the server.
	s.grpc = grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterDevicePluginServer(s.grpc, s)
	s.serveDone = make(chan error, 1)
	go func(g *grpc.Server, done chan<- error) {
		done <- g.Serve(lis)
	}(s.grpc, s.serveDone)
	klog.FromContext(ctx).V(2).Info("Serving device plugin", "resource", s.res.name, "socket", s.socket)
	return nil
}

// stop ends every RPC, waits for the handlers and removes the socket.
func (s *server) stop(ctx context.Context) {
	if s.grpc == nil {
		return
	}
	s.grpc.Stop()
	if err := <-s.serveDone; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		klog.FromContext(ctx).Error(err, "Device plugin server failed", "resource", s.res.name)
	}
	s.grpc, s.serveDone = nil, nil
	// The listener unlinks its socket on close; this catches the case where
	// it could not.
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		klog.FromContext(ctx).Error(err, "Removing device plugin socket", "socket", s.socket)
	}
}

// register announces the resource to the kubelet; the kubelet then dials
// the socket back, which is why start must have run first.
func (s *server) register(ctx context.Context, kubeletSocket string) error {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to kubelet at %s: %w", kubeletSocket, err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.res.name,
		Options:      s.options(),
	})
	if err != nil {
		return fmt.Errorf("registering %s with kubelet at %s: %w", s.res.name, kubeletSocket, err)
	}
	return nil
}

func (s *server) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions tells the kubelet to ask for preferred allocations
// and not to call PreStartContainer (there is nothing to do before start).
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.options(), nil
}

// ListAndWatch sends the resource's devices, then sends them again each time
// the health of one of them changes, until the kubelet hangs up or the
// server stops.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	logger := klog.FromContext(s.p.ctx).WithValues("resource", s.res.name)
	var last []string
	for {
		devs, changed := s.p.listDevices(s.res)
		health := make([]string, len(devs))
		for i, d := range devs {
			health[i] = d.Health
		}
		// Health changes of GPUs outside this resource wake every stream;
		// only a change here is worth a message.
		if last == nil || !slices.Equal(last, health) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return fmt.Errorf("sending devices of %s: %w", s.res.name, err)
			}
			logger.V(4).Info("Sent device list", "devices", len(devs))
			last = health
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// PreStartContainer is not requested (PreStartRequired is false).
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
