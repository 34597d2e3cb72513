package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics"

	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/controlplane/overview/web"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
)

// webServer is the sandbox's HTTP endpoint: the web view of `tessera top
// --web` at / and, at /metrics, every metric a cluster running tessera
// exports — the scheduler's and node agents' (the legacy registry), each
// node's DRA plugin's (labelled with the node, as one per pod would be told
// apart by its target labels) and the cluster metrics.
type webServer struct {
	srv    *http.Server
	url    string
	done   chan error
	cancel context.CancelFunc
}

func (s *Sandbox) startWeb(ctx context.Context, addr string) error {
	watcher, err := overview.NewWatcher(s.config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	watcher.Start(ctx)
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	defer cancelSync()
	if err := watcher.WaitForSync(syncCtx); err != nil {
		cancel()
		return err
	}
	cluster := metrics.NewKubeRegistry()
	cluster.CustomMustRegister(overview.NewCollector(watcher))
	gatherers := []prometheus.Gatherer{cluster}
	for _, n := range s.nodes {
		gatherers = append(gatherers, metricsconv.WithLabels(n.metrics, map[string]string{"node": n.name}))
	}
	mux := http.NewServeMux()
	mux.Handle("/", web.Handler(watcher, web.Options{}))
	mux.Handle("/metrics", metricsconv.Handler(gatherers...))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		cancel()
		return fmt.Errorf("--web %s: %w", addr, err)
	}
	ws := &webServer{
		srv:    &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		url:    "http://" + ln.Addr().String() + "/",
		done:   make(chan error, 1),
		cancel: cancel,
	}
	go func() { ws.done <- ws.srv.Serve(ln) }()
	s.web = ws
	return nil
}

func (ws *webServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := ws.srv.Shutdown(ctx)
	ws.cancel()
	if serveErr := <-ws.done; !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = serveErr
	}
	return err
}

// URL is the base URL of the sandbox's web view; its metrics are at
// URL+"metrics".
func (s *Sandbox) URL() string {
	if s.web == nil {
		return ""
	}
	return s.web.url
}
