package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

// EnvBinDir overrides where the control-plane binaries are looked up.
const EnvBinDir = k8sbin.EnvDir

// BinDir returns the directory of the pinned release's binaries
// ($TESSERA_K8S_BIN, else the build cache of k8sbin, which bin/k8s in a
// checkout links to) and checks that the named ones (default: etcd,
// kube-apiserver, kube-controller-manager) are there. It builds nothing:
// `make k8s-bin` (hack/build-k8s.sh) and `tessera sandbox up` do.
func BinDir(ctx context.Context, need ...k8sbin.Binary) (string, error) {
	dir, err := k8sbin.Dir(ctx, k8sbin.Options{})
	if err != nil {
		return "", err
	}
	if len(need) == 0 {
		need = k8sbin.ControlPlane
	}
	return dir, checkBinaries(dir, need)
}

func checkBinaries(dir string, need []k8sbin.Binary) error {
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(dir, b.Name)); err != nil {
			return fmt.Errorf("the Kubernetes binary %s is missing in %s (build them with `make k8s-bin` or hack/build-k8s.sh; `tessera sandbox up` builds what it needs): %w", b.Name, dir, err)
		}
	}
	return nil
}
