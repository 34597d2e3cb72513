package simkubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// draPlugin is one DRA driver registered through the registration socket, as
// the kubelet's plugin watcher would see it.
type draPlugin struct {
	driver string
	socket string // its registration socket
	conn   *grpc.ClientConn
	client drapb.DRAPluginClient
}

// pluginRegistry discovers DRA plugins in a kubelet plugins_registry directory
// and keeps a gRPC connection to each one's DRA socket.
type pluginRegistry struct {
	dir string

	// scanMu serializes scans: two workers that miss a plugin at once must
	// not both register it (the second would close the first's connection
	// under its in-flight call).
	scanMu sync.Mutex

	mu      sync.Mutex
	plugins map[string]*draPlugin // by driver name
	seen    map[string]bool       // registration sockets already handled
	scanned time.Time             // modification time of the directory at the last scan
}

// changed reports whether sockets were added to or removed from the
// directory since the last scan (its modification time moved), as the
// kubelet's plugin watcher would have seen.
func (r *pluginRegistry) changed() bool {
	fi, err := os.Stat(r.dir)
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !fi.ModTime().Equal(r.scanned)
}

func newPluginRegistry(dir string) *pluginRegistry {
	return &pluginRegistry{dir: dir, plugins: map[string]*draPlugin{}, seen: map[string]bool{}}
}

// scan registers every socket in the registry directory not seen before: it
// calls GetInfo, connects to the advertised DRA endpoint, and reports the
// registration status back, as the kubelet does. A newer registration of a
// driver (a rolling update) replaces the older one; a driver whose socket is
// gone is forgotten.
func (r *pluginRegistry) scan(ctx context.Context) error {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	if fi, err := os.Stat(r.dir); err == nil {
		r.mu.Lock()
		r.scanned = fi.ModTime()
		r.mu.Unlock()
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("read plugin registry %s: %w", r.dir, err)
	}
	present := map[string]bool{}
	for _, e := range entries {
		present[filepath.Join(r.dir, e.Name())] = true
	}
	r.mu.Lock()
	for socket := range r.seen {
		if !present[socket] {
			delete(r.seen, socket)
		}
	}
	for driver, p := range r.plugins {
		if !present[p.socket] {
			_ = p.conn.Close()
			delete(r.plugins, driver)
		}
	}
	r.mu.Unlock()
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(r.dir, e.Name())
		r.mu.Lock()
		seen := r.seen[path]
		r.mu.Unlock()
		if seen {
			continue
		}
		if err := r.register(ctx, path); err != nil {
			return err
		}
	}
	return nil
}

func (r *pluginRegistry) register(ctx context.Context, socket string) error {
	regConn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to registration socket %s: %w", socket, err)
	}
	defer regConn.Close()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo on %s: %w", socket, err)
	}
	if info.Type != registerapi.DRAPlugin {
		r.markSeen(socket)
		return nil
	}
	supported := false
	for _, v := range info.SupportedVersions {
		if v == drapb.DRAPluginService {
			supported = true
		}
	}
	if !supported {
		_, _ = reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "no supported DRA service version (want " + drapb.DRAPluginService + ")"})
		r.markSeen(socket)
		return fmt.Errorf("plugin %s offers %v, not %s", info.Name, info.SupportedVersions, drapb.DRAPluginService)
	}
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to DRA socket %s of %s: %w", info.Endpoint, info.Name, err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		_ = conn.Close()
		return fmt.Errorf("NotifyRegistrationStatus to %s: %w", info.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.plugins[info.Name]; old != nil {
		// A newer instance of the driver (rolling update) replaces the old one.
		_ = old.conn.Close()
	}
	r.plugins[info.Name] = &draPlugin{driver: info.Name, socket: socket, conn: conn, client: drapb.NewDRAPluginClient(conn)}
	r.seen[socket] = true
	return nil
}

func (r *pluginRegistry) markSeen(socket string) {
	r.mu.Lock()
	r.seen[socket] = true
	r.mu.Unlock()
}

func (r *pluginRegistry) get(driver string) *draPlugin {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.plugins[driver]
}

func (r *pluginRegistry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, p := range r.plugins {
		_ = p.conn.Close()
		delete(r.plugins, name)
	}
}
