package chaos

import (
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// TestProxyAppliedWrites: in the applied window every write reaches the API
// server; those it applied are answered 500 or cut (no answer) as counted,
// those it refused pass unchanged, reads are not touched. Runs without
// CHAOS_DURATION (a fake API server, no cluster).
func TestProxyAppliedWrites(t *testing.T) {
	var writes, reads atomic.Int64
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			reads.Add(1)
			_, _ = io.WriteString(w, `{"kind":"Pod"}`)
			return
		}
		// As the API server, read the whole body (the object) before answering.
		_, _ = io.Copy(io.Discard, r.Body)
		writes.Add(1)
		if strings.HasSuffix(r.URL.Path, "/refused") {
			status(w, http.StatusConflict, "Conflict", "refused")
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"kind":"Pod"}`)
	}))
	api.EnableHTTP2 = true
	api.StartTLS()
	defer api.Close()

	// The proxy serves with the API server's certificate, as in the run.
	dir := t.TempDir()
	cert := api.TLS.Certificates[0]
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "apiserver.crt"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "apiserver.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := startProxy(&rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM}}, dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	// HTTP/2, as client-go talks to the API server: a cut is a reset stream.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: api.Client().Transport.(*http.Transport).TLSClientConfig, ForceAttemptHTTP2: true}}
	do := func(method, path string) (int, error) {
		var body io.Reader
		if method != http.MethodGet {
			body = strings.NewReader(`{}`) // a read has no body, as client-go sends none
		}
		req, _ := http.NewRequest(method, "https://"+p.addr+path, body)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.ProtoMajor != 2 {
			t.Fatalf("the proxy answered over %s, want HTTP/2", resp.Proto)
		}
		return resp.StatusCode, nil
	}

	p.applied.Store(true)
	const n = 200
	var got500, cut, ok, refusedPassed int
	for i := range n {
		path := "/api/v1/namespaces/x/pods"
		if i%10 == 0 {
			path += "/refused"
		}
		code, err := do(http.MethodPost, path)
		switch {
		case err != nil:
			cut++
		case code == http.StatusInternalServerError:
			got500++
		case code == http.StatusCreated:
			ok++
		case code == http.StatusConflict && strings.HasSuffix(path, "/refused"):
			refusedPassed++
		default:
			t.Errorf("write %d: %d", i, code)
		}
		if code, err := do(http.MethodGet, "/api/v1/namespaces/x/pods/p"); err != nil || code != http.StatusOK {
			t.Errorf("read in the applied window: %d, %v", code, err)
		}
	}
	if writes.Load() != n || reads.Load() != n {
		t.Errorf("the API server saw %d writes and %d reads, want %d each: every write is forwarded", writes.Load(), reads.Load(), n)
	}
	if got500 != int(p.applied500.Load()) || cut != int(p.appliedCut.Load()) {
		t.Errorf("clients saw %d × 500 and %d cut, the proxy counted %d and %d", got500, cut, p.applied500.Load(), p.appliedCut.Load())
	}
	if got500 == 0 || cut == 0 || ok == 0 {
		t.Errorf("500: %d, cut: %d, answered: %d — want some of each at 30 %% of %d writes", got500, cut, ok, n)
	}
	if refusedPassed != n/10 {
		t.Errorf("%d of %d refused writes were answered as refused", refusedPassed, n/10)
	}

	// Window closed: nothing injected.
	p.applied.Store(false)
	before := p.applied500.Load() + p.appliedCut.Load()
	for range 20 {
		if code, err := do(http.MethodPost, "/api/v1/namespaces/x/pods"); err != nil || code != http.StatusCreated {
			t.Errorf("write outside the window: %d, %v", code, err)
		}
	}
	if p.applied500.Load()+p.appliedCut.Load() != before {
		t.Error("writes injected outside the window")
	}
}
