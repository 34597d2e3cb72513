// Package framework gives tests a real Kubernetes control plane: the runner in
// sandbox/cluster (etcd, kube-apiserver, kube-controller-manager built from the
// Go module proxy), one per test binary (Shared) or per test (StartForTest),
// with helpers that take a testing.TB.
package framework

import (
	"context"
	"errors"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/sandbox/cluster"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

// ControlPlane is a running control plane (see cluster.ControlPlane), with
// the test helpers Client and CreateNamespace.
type ControlPlane struct {
	*cluster.ControlPlane
}

// Options tune a control plane; the zero value is what most tests want.
type Options = cluster.Options

// EnvBinDir overrides where the control-plane binaries are looked up.
const EnvBinDir = cluster.EnvBinDir

// Defaults of every control plane (see package cluster).
var (
	DefaultControllers = cluster.DefaultControllers
	FeatureGates       = cluster.FeatureGates
	RuntimeConfig      = cluster.RuntimeConfig
)

// Start launches a control plane; the caller stops it.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	cp, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &ControlPlane{cp}, nil
}

// Stop terminates the control plane; safe on a nil or stopped one.
func (cp *ControlPlane) Stop() {
	if cp == nil {
		return
	}
	cp.ControlPlane.Stop()
}

// BinDir returns the directory that holds the Kubernetes binaries the tests
// run (etcd, kube-apiserver, kube-controller-manager and kube-scheduler) and
// checks that they are there.
func BinDir() (string, error) {
	return cluster.BinDir(context.Background(), k8sbin.Etcd, k8sbin.APIServer, k8sbin.ControllerManager, k8sbin.Scheduler)
}

// WriteKubeconfig writes cfg (host, CA, bearer token) as a kubeconfig file.
func WriteKubeconfig(cfg *rest.Config, path string) error { return cluster.WriteKubeconfig(cfg, path) }

// WaitCRDEstablished waits until the API server serves the CRD's resource.
func WaitCRDEstablished(ctx context.Context, client apiextensionsclient.Interface, name string) error {
	return cluster.WaitCRDEstablished(ctx, client, name)
}

var errNoRun = errors.New("framework.Shared needs framework.Run in the package's TestMain")
