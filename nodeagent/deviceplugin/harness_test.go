package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// waitTimeout bounds every wait of these tests; they pass in milliseconds.
const waitTimeout = 20 * time.Second

// fakeKubelet is the kubelet's registration service on a real unix socket,
// as the kubelet's device manager serves it: it records each Register call
// and, like the kubelet, dials the plugin back and opens ListAndWatch.
type fakeKubelet struct {
	t      *testing.T
	dir    string
	socket string

	mu     sync.Mutex
	srv    *grpc.Server
	served chan struct{}

	registrations chan *pluginapi.RegisterRequest
}

// shortTempDir keeps socket paths under the 108 bytes of sun_path.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{t: t, dir: dir, socket: filepath.Join(dir, DefaultKubeletSocket), registrations: make(chan *pluginapi.RegisterRequest, 64)}
	k.start()
	t.Cleanup(k.stop)
	return k
}

type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	k *fakeKubelet
}

// Register does what the kubelet's registration server does
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1): check the version, then,
// before answering, dial the plugin's endpoint and ask for its options, so
// that a plugin that registers before it serves fails to register.
func (r registrationServer) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if !slices.Contains(pluginapi.SupportedVersions[:], req.Version) {
		return nil, errors.New("unsupported version " + req.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, fmt.Errorf("connecting to device plugin %s: %w", req.Endpoint, err)
	}
	if !proto.Equal(opts, req.Options) {
		return nil, fmt.Errorf("plugin options %v differ from the registration's %v", opts, req.Options)
	}
	r.k.registrations <- req
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) start() {
	k.t.Helper()
	lis, err := net.Listen("unix", k.socket)
	if err != nil {
		k.t.Fatalf("fake kubelet: %v", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, registrationServer{k: k})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	k.mu.Lock()
	k.srv, k.served = srv, served
	k.mu.Unlock()
}

func (k *fakeKubelet) stop() {
	k.mu.Lock()
	srv, served := k.srv, k.served
	k.srv = nil
	k.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-served
	_ = os.Remove(k.socket)
}

// restart does what a restarting kubelet does: its old socket goes away,
// the device manager empties the plugin dir (the plugins' sockets too) and
// then creates kubelet.sock anew.
func (k *fakeKubelet) restart() {
	k.t.Helper()
	k.stop()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil {
			k.t.Fatal(err)
		}
	}
	k.start()
}

// nextRegistration waits for the next Register call.
func (k *fakeKubelet) nextRegistration() *pluginapi.RegisterRequest {
	k.t.Helper()
	select {
	case r := <-k.registrations:
		return r
	case <-time.After(waitTimeout):
		k.t.Fatal("plugin did not register with the fake kubelet")
		return nil
	}
}

// registrationsByResource waits for n Register calls.
func (k *fakeKubelet) registrationsByResource(n int) map[string]*pluginapi.RegisterRequest {
	k.t.Helper()
	out := map[string]*pluginapi.RegisterRequest{}
	for len(out) < n {
		r := k.nextRegistration()
		out[r.ResourceName] = r
	}
	return out
}

// dial connects to a plugin endpoint named in a registration, the way the
// kubelet does.
func (k *fakeKubelet) dial(endpoint string) pluginapi.DevicePluginClient {
	k.t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// watch opens ListAndWatch on an endpoint and returns the device lists it
// receives.
func (k *fakeKubelet) watch(ctx context.Context, endpoint string) <-chan []*pluginapi.Device {
	k.t.Helper()
	stream, err := k.dial(endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		k.t.Fatalf("ListAndWatch on %s: %v", endpoint, err)
	}
	out := make(chan []*pluginapi.Device, 16)
	go func() {
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			out <- resp.Devices
		}
	}()
	return out
}

func nextList(t *testing.T, lists <-chan []*pluginapi.Device) []*pluginapi.Device {
	t.Helper()
	select {
	case l, ok := <-lists:
		if !ok {
			t.Fatal("ListAndWatch stream ended")
		}
		return l
	case <-time.After(waitTimeout):
		t.Fatal("no device list from ListAndWatch")
		return nil
	}
}

// runPlugin runs p until the test ends and checks that Run then returns
// nil and leaves no socket behind.
func runPlugin(t *testing.T, p *Plugin) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Error("Run did not return after its context ended")
		}
		for _, name := range p.ResourceNames() {
			if _, err := os.Stat(filepath.Join(p.cfg.PluginDir, socketName(name))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket of %s left behind (stat: %v)", name, err)
			}
		}
	})
}

// waitHealth reads device lists until one has exactly the wanted health
// per device ID; a health change may take one list or, when the kubelet's
// stream opened before a replayed event was applied, two.
func waitHealth(t *testing.T, lists <-chan []*pluginapi.Device, want map[string]string) {
	t.Helper()
	var last []*pluginapi.Device
	deadline := time.After(waitTimeout)
	for {
		select {
		case l, ok := <-lists:
			if !ok {
				t.Fatal("ListAndWatch stream ended")
			}
			last = l
			got := map[string]string{}
			for _, d := range l {
				got[d.ID] = d.Health
			}
			if maps.Equal(got, want) {
				return
			}
		case <-deadline:
			t.Fatalf("device health never became %v; last list %v", want, last)
		}
	}
}

// waitMetrics waits until the plugin's metrics named in names match the
// expected text exposition; counters may be bumped just after the RPC that
// the test saw return.
func waitMetrics(t *testing.T, p *Plugin, expected string, names ...string) {
	t.Helper()
	var err error
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		if err = testutil.GatherAndCompare(p.Registry(), strings.NewReader(expected), names...); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("metrics: %v", err)
}
