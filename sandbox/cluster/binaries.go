package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// EnvBinDir overrides where the control-plane binaries are looked up.
const EnvBinDir = "TESSERA_K8S_BIN"

// modulePath is the tessera module; the repository root is the directory whose
// go.mod declares it.
const modulePath = "github.com/tessera-gpu/tessera"

// RepoRoot returns the root of the tessera checkout that contains the working
// directory (tests run in their package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && firstLineIs(data, "module "+modulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the tessera repository (no go.mod for " + modulePath + " above the working directory)")
		}
		dir = parent
	}
}

func firstLineIs(data []byte, want string) bool {
	for len(data) > 0 {
		i := 0
		for i < len(data) && data[i] != '\n' {
			i++
		}
		line := string(data[:i])
		if len(data) > i {
			data = data[i+1:]
		} else {
			data = nil
		}
		if line == "" || (len(line) > 1 && line[:2] == "//") {
			continue
		}
		return line == want
	}
	return false
}

// BinDir returns the directory that holds etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, and checks that they are there.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "k8s")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("control-plane binary %s missing in %s (build them with `make k8s-bin` or hack/build-k8s.sh): %w", b, dir, err)
		}
	}
	return dir, nil
}
