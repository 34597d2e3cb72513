package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// faultProxy is a reverse proxy in front of the kube-apiserver (written for
// this test). The schedulers and tessera-node processes talk to the API
// server through it; the load generator, the invariant checker and the
// kube-controller-manager do not. While a fault window is open it answers a
// share of requests itself — 429 Too Many Requests with Retry-After, 500,
// 409 Conflict (updates only) — delays others, and cuts watches after a few
// seconds, as an overloaded or restarting API server (or a load balancer in
// front of it) does. Those errors are answered before the request reaches
// the API server: nothing of the request is applied.
//
// While an "applied" window is open it does what a real API server behind a
// load balancer does when the answer is lost on the way back: a share of
// writes (create, update, patch, delete) is forwarded and applied, and the
// client gets a 500 instead of the answer, or the connection (the HTTP/2
// stream) is cut before any answer. The client cannot tell an applied write
// from one that never arrived; the counts are of writes the API server
// answered with success.
type faultProxy struct {
	srv     *http.Server
	ln      net.Listener
	addr    string
	backend *httputil.ReverseProxy

	mu  sync.Mutex
	rng *rand.Rand
	on  atomic.Bool
	// applied: the applied-but-answered-500 window is open.
	applied atomic.Bool
	// watches are the watches being served, to cut when a window opens.
	watches map[*http.Request]context.CancelFunc

	// Counts per injected kind.
	tooMany, internal, conflict, slow, droppedWatches atomic.Int64
	// Writes applied whose answer was replaced by a 500 or cut.
	applied500, appliedCut atomic.Int64
}

func startProxy(upstream *rest.Config, certDir string, seed uint64) (*faultProxy, error) {
	u, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, fmt.Errorf("proxy upstream: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(upstream.CAData)
	// The API server's own serving certificate (for 127.0.0.1): clients
	// keep the CA they have.
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "apiserver.crt"), filepath.Join(certDir, "apiserver.key"))
	if err != nil {
		return nil, fmt.Errorf("proxy certificate: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &faultProxy{ln: ln, addr: ln.Addr().String(), rng: rand.New(rand.NewPCG(seed, 0x9e3779b9)), watches: map[*http.Request]context.CancelFunc{}}
	p.backend = httputil.NewSingleHostReverseProxy(u)
	p.backend.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 100,
	}
	p.backend.FlushInterval = -1 // watches stream
	// Cut watches and a restarting API server make it log every
	// aborted copy; the run counts what it injects instead.
	p.backend.ErrorLog = log.New(io.Discard, "", 0)
	p.backend.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		// The API server is down (being restarted) or the request was cut.
		w.WriteHeader(http.StatusBadGateway)
	}
	p.srv = &http.Server{Handler: p, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = p.srv.ServeTLS(ln, "", "") }()
	return p, nil
}

// config is upstream's client configuration pointed at the proxy.
func (p *faultProxy) config(upstream *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(upstream)
	cfg.Host = "https://" + p.addr
	return cfg
}

func (p *faultProxy) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	_ = p.srv.Close()
}

// roll returns a number in [0,1) and a second one, from the proxy's seeded source.
func (p *faultProxy) roll() (float64, float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64(), p.rng.Float64()
}

// setFaults opens (true) or closes a fault window. Opening it cuts every
// watch being served.
func (p *faultProxy) setFaults(on bool) {
	p.on.Store(on)
	if !on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for r, cancel := range p.watches {
		cancel()
		delete(p.watches, r)
		p.droppedWatches.Add(1)
	}
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		p.serveWatch(w, r)
		return
	}
	if p.applied.Load() && isWrite(r.Method) {
		if x, y := p.roll(); x < 0.3 {
			p.serveApplied(w, r, y < 0.5)
			return
		}
	}
	if !p.on.Load() {
		p.backend.ServeHTTP(w, r)
		return
	}
	x, y := p.roll()
	write := r.Method == http.MethodPut || r.Method == http.MethodPatch
	switch {
	case x < 0.04:
		p.tooMany.Add(1)
		w.Header().Set("Retry-After", "1")
		status(w, http.StatusTooManyRequests, "TooManyRequests", "chaos proxy: too many requests, please try again later")
	case x < 0.07:
		p.internal.Add(1)
		status(w, http.StatusInternalServerError, "InternalError", "chaos proxy: an error on the server has prevented the request from succeeding")
	case x < 0.10 && write:
		p.conflict.Add(1)
		status(w, http.StatusConflict, "Conflict", "chaos proxy: the object has been modified; please apply your changes to the latest version and try again")
	case x < 0.20:
		p.slow.Add(1)
		select {
		case <-time.After(200*time.Millisecond + time.Duration(y*1800*float64(time.Millisecond))):
		case <-r.Context().Done():
			return
		}
		p.backend.ServeHTTP(w, r)
	default:
		p.backend.ServeHTTP(w, r)
	}
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// serveApplied forwards a write to the API server and, if the API server
// applied it (a 2xx answer), throws the answer away: the client gets a 500
// (answer500) or its stream is cut with no answer at all. A write the API
// server refused is answered as it is.
func (p *faultProxy) serveApplied(w http.ResponseWriter, r *http.Request, answer500 bool) {
	rec := httptest.NewRecorder()
	p.backend.ServeHTTP(rec, r)
	if rec.Code < 200 || rec.Code > 299 {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return
	}
	if answer500 {
		p.applied500.Add(1)
		status(w, http.StatusInternalServerError, "InternalError", "chaos proxy: the write was applied, but this answer replaces the API server's")
		return
	}
	p.appliedCut.Add(1)
	// The server resets the stream (HTTP/2) or closes the connection
	// (HTTP/1.1) without writing a response.
	panic(http.ErrAbortHandler)
}

func status(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, message, reason, code)
}

// serveWatch proxies a watch; in a fault window it is cut after 2–10 s,
// and opening a window cuts it at once: the client sees the stream end and
// must watch again from its resource version (or list again).
func (p *faultProxy) serveWatch(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if p.on.Load() {
		_, y := p.roll()
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, 2*time.Second+time.Duration(y*8*float64(time.Second)))
		defer stop()
	}
	p.mu.Lock()
	p.watches[r] = cancel
	p.mu.Unlock()
	// Deferred: a cut stream makes the reverse proxy abort the response
	// with a panic (http.ErrAbortHandler), which the server recovers.
	defer func() {
		p.mu.Lock()
		delete(p.watches, r)
		p.mu.Unlock()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Context().Err() == nil {
			p.droppedWatches.Add(1)
		}
	}()
	p.backend.ServeHTTP(w, r.WithContext(ctx))
}
