// Package browser drives Debian's chromium headless for tests of the web
// view: load a page, let its scripts run for a while of virtual time, and
// return the DOM or a screenshot. Each run has a new empty profile, no
// network but the page's own, and leaves no process behind.
package browser

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// EnvChromium names the chromium binary; default /usr/bin/chromium
// (Debian's package `chromium`, which .ci/run installs).
const EnvChromium = "TESSERA_CHROMIUM"

// Path returns the chromium binary or an error that says how to get one.
func Path() (string, error) {
	p := os.Getenv(EnvChromium)
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the browser tests need Debian's chromium (apt-get install chromium) or %s: %w", EnvChromium, err)
	}
	return p, nil
}

// Options of one page load.
type Options struct {
	// Budget is the virtual time the page's scripts get after loading
	// (timers fire, fetches complete) before the DOM is taken.
	Budget time.Duration
	// Width and Height of the window (default 1400×1000).
	Width, Height int
}

func (o Options) args(profile string) []string {
	w, h := o.Width, o.Height
	if w == 0 {
		w, h = 1400, 1000
	}
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile,
		"--window-size=" + strconv.Itoa(w) + "," + strconv.Itoa(h),
		"--hide-scrollbars",
	}
	if o.Budget > 0 {
		args = append(args, "--virtual-time-budget="+strconv.FormatInt(o.Budget.Milliseconds(), 10))
	}
	return args
}

// DumpDOM loads url and returns the serialised DOM.
func DumpDOM(ctx context.Context, url string, o Options) (string, error) {
	out, err := run(ctx, append([]string{"--dump-dom"}, url), o)
	return string(out), err
}

// Screenshot loads url and writes a PNG of the window to path.
func Screenshot(ctx context.Context, url, path string, o Options) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if _, err := run(ctx, []string{"--screenshot=" + abs, url}, o); err != nil {
		return err
	}
	if fi, err := os.Stat(abs); err != nil || fi.Size() == 0 {
		return fmt.Errorf("chromium wrote no screenshot to %s: %v", abs, err)
	}
	return nil
}

func run(ctx context.Context, extra []string, o Options) ([]byte, error) {
	bin, err := Path()
	if err != nil {
		return nil, err
	}
	profile, err := os.MkdirTemp("", "tessera-chromium-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(profile)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.Command(bin, append(o.args(profile), extra...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Its own process group, killed as a whole: chromium's zygote and
	// renderer processes must not outlive the test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "HOME="+profile)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start chromium: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		<-done
		return nil, fmt.Errorf("chromium: %w; stderr:\n%s", err, tail(stderr.String()))
	}
	if err != nil {
		return nil, fmt.Errorf("chromium: %w; stderr:\n%s", err, tail(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}
