// Package kubeconfig is how every tessera binary finds its API server, the
// way kubectl does: the --kubeconfig file, else $KUBECONFIG, else
// ~/.kube/config, else the pod's service account (in-cluster).
package kubeconfig

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options name the file and context; both may be empty.
type Options struct {
	// Path is the --kubeconfig flag.
	Path string
	// Context is the --context flag: a context of the file other than its
	// current one.
	Context string
	// UserAgent, when set, replaces client-go's default user agent, so that
	// the API server's audit log and metrics name the binary.
	UserAgent string
}

func (o Options) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Path
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.Context})
}

// Load returns the client configuration.
func Load(o Options) (*rest.Config, error) {
	cfg, err := o.clientConfig().ClientConfig()
	if err != nil {
		switch {
		case o.Path != "":
			return nil, fmt.Errorf("--kubeconfig %q: %w", o.Path, err)
		case clientcmd.IsEmptyConfig(err) || errors.Is(err, rest.ErrNotInCluster):
			return nil, fmt.Errorf("no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not running in a cluster: %w", err)
		default:
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
	}
	if o.UserAgent != "" {
		cfg.UserAgent = o.UserAgent
	}
	return cfg, nil
}

// Namespace returns the namespace of the chosen context ("default" when it
// names none).
func Namespace(o Options) (string, error) {
	ns, _, err := o.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("kubeconfig namespace: %w", err)
	}
	return ns, nil
}
