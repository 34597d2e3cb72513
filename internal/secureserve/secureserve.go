// Package secureserve serves a component's /metrics and health endpoints the
// way the kube-scheduler serves its own (cmd/kube-scheduler/app/options and
// server.go of k8s.io/kubernetes v1.37.2): HTTPS from k8s.io/apiserver's
// SecureServingOptions (a self-signed certificate, in memory or in --cert-dir,
// when --tls-cert-file is not given), with delegated authentication
// (TokenReview, and client certificates from the extension-apiserver-
// authentication ConfigMap) and delegated authorization (SubjectAccessReview,
// `get` on the non-resource URL), except --authorization-always-allow-paths
// (/healthz, /readyz, /livez) which anyone may read. Plain HTTP, without
// authentication, is served only on an address given explicitly.
//
// It is the one package of tessera that uses k8s.io/apiserver's serving,
// authentication and authorization (controlplane/filters reads only its
// feature gates).
package secureserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapifilters "k8s.io/apiserver/pkg/endpoints/filters"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	apiserveroptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"
)

// shutdownTimeout is how long in-flight requests get when the server stops
// (the kube-scheduler's).
const shutdownTimeout = 5 * time.Second

// Options are a component's serving flags.
type Options struct {
	SecureServing  *apiserveroptions.SecureServingOptions
	Authentication *apiserveroptions.DelegatingAuthenticationOptions
	Authorization  *apiserveroptions.DelegatingAuthorizationOptions
	// InsecureAddress is host:port of the plain-HTTP endpoint (no TLS, no
	// authentication); empty serves none.
	InsecureAddress string
	// insecureFlag names InsecureAddress's flag in errors.
	insecureFlag string
}

// NewOptions returns the kube-scheduler's defaults for a component: HTTPS on
// 0.0.0.0:securePort with an in-memory self-signed certificate named pair
// (pair.crt/pair.key in --cert-dir when that is set), delegated authentication
// and authorization that tolerate running outside a cluster (a warning, and
// every request but the always-allowed paths refused), and no plain HTTP.
func NewOptions(pair string, securePort int) *Options {
	o := &Options{
		SecureServing:  apiserveroptions.NewSecureServingOptions(),
		Authentication: apiserveroptions.NewDelegatingAuthenticationOptions(),
		Authorization:  apiserveroptions.NewDelegatingAuthorizationOptions(),
	}
	o.Authentication.TolerateInClusterLookupFailure = true
	o.Authentication.RemoteKubeConfigFileOptional = true
	o.Authorization.RemoteKubeConfigFileOptional = true
	o.SecureServing.ServerCert.CertDirectory = ""
	o.SecureServing.ServerCert.PairName = pair
	o.SecureServing.BindPort = securePort
	return o
}

// AddFlags adds the kube-scheduler's secure serving, authentication and
// authorization flags, and insecureFlag for the plain-HTTP address.
func (o *Options) AddFlags(fs *pflag.FlagSet, insecureFlag, endpoints string) {
	o.insecureFlag = insecureFlag
	o.SecureServing.AddFlags(fs)
	o.Authentication.AddFlags(fs)
	o.Authorization.AddFlags(fs)
	fs.StringVar(&o.InsecureAddress, insecureFlag, o.InsecureAddress, "Address (host:port) of a plain-HTTP "+endpoints+
		" endpoint without TLS, authentication or authorization, beside the HTTPS one of --secure-port (0 turns that off); only for a trusted network. Empty serves none.")
}

// Validate says what is wrong with the flags.
func (o *Options) Validate() []error {
	errs := o.SecureServing.Validate()
	errs = append(errs, o.Authentication.Validate()...)
	errs = append(errs, o.Authorization.Validate()...)
	if o.InsecureAddress != "" {
		_, port, err := net.SplitHostPort(o.InsecureAddress)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %w", o.insecureFlagName(), o.InsecureAddress, err))
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			errs = append(errs, fmt.Errorf("--%s %q: port %q is not a number 0..65535", o.insecureFlagName(), o.InsecureAddress, port))
		}
	}
	return errs
}

func (o *Options) insecureFlagName() string {
	if o.insecureFlag == "" {
		return "insecure-address"
	}
	return o.insecureFlag
}

// DefaultKubeconfig makes the component's own kubeconfig (its --kubeconfig,
// else a single-file $KUBECONFIG) the one of delegated authentication and
// authorization when their flags name none; in a pod with neither, both use
// the in-cluster service account as the kube-scheduler does.
func (o *Options) DefaultKubeconfig(path string) {
	if path == "" {
		if list := filepath.SplitList(os.Getenv("KUBECONFIG")); len(list) == 1 {
			path = list[0]
		}
	}
	if o.Authentication.RemoteKubeConfigFile == "" {
		o.Authentication.RemoteKubeConfigFile = path
	}
	if o.Authorization.RemoteKubeConfigFile == "" {
		o.Authorization.RemoteKubeConfigFile = path
	}
}

// Server is what Serve started.
type Server struct {
	// SecureAddr and InsecureAddr are where the endpoints listen (nil: not served).
	SecureAddr, InsecureAddr net.Addr
	stopSecure               chan struct{}
	secureStopped            <-chan struct{}
	insecure                 *http.Server
	insecureDone             chan struct{}
}

// Serve starts serving handler over HTTPS behind authentication and
// authorization (unless --secure-port is 0) and over plain HTTP (when the
// insecure address is set). It returns once both listen; Stop ends them.
func (o *Options) Serve(ctx context.Context, handler http.Handler) (*Server, error) {
	logger := klog.FromContext(ctx)
	s := &Server{}
	if o.SecureServing.BindPort != 0 || o.SecureServing.Listener != nil {
		if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
			return nil, fmt.Errorf("self-signed serving certificate: %w", err)
		}
		var serving *server.SecureServingInfo
		if err := o.SecureServing.ApplyTo(&serving); err != nil {
			return nil, fmt.Errorf("secure serving: %w", err)
		}
		var authn server.AuthenticationInfo
		if err := o.Authentication.ApplyTo(&authn, serving, nil); err != nil {
			_ = serving.Listener.Close()
			return nil, fmt.Errorf("delegated authentication: %w", err)
		}
		var authz server.AuthorizationInfo
		if err := o.Authorization.ApplyTo(&authz); err != nil {
			_ = serving.Listener.Close()
			return nil, fmt.Errorf("delegated authorization: %w", err)
		}
		s.SecureAddr = serving.Listener.Addr()
		s.stopSecure = make(chan struct{})
		stopped, _, err := serving.Serve(chain(handler, authn, authz.Authorizer), shutdownTimeout, s.stopSecure)
		if err != nil {
			close(s.stopSecure)
			return nil, fmt.Errorf("serve HTTPS on %s: %w", s.SecureAddr, err)
		}
		s.secureStopped = stopped
		logger.Info("Serving HTTPS with delegated authentication and authorization", "address", s.SecureAddr.String(), "alwaysAllowPaths", o.Authorization.AlwaysAllowPaths)
	}
	if o.InsecureAddress != "" {
		l, err := net.Listen("tcp", o.InsecureAddress)
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("--%s %s: %w", o.insecureFlagName(), o.InsecureAddress, err)
		}
		s.InsecureAddr = l.Addr()
		s.insecure = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		s.insecureDone = make(chan struct{})
		go func() {
			defer close(s.insecureDone)
			if err := s.insecure.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Plain-HTTP endpoint stopped")
			}
		}()
		logger.Info("Serving plain HTTP without authentication", "address", s.InsecureAddr.String(), "flag", "--"+o.insecureFlagName())
	}
	return s, nil
}

// Stop shuts both endpoints down (in-flight requests get a few seconds) and
// waits for them.
func (s *Server) Stop() {
	if s.stopSecure != nil {
		close(s.stopSecure)
		if s.secureStopped != nil {
			<-s.secureStopped
		}
		s.stopSecure = nil
	}
	if s.insecure != nil {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = s.insecure.Shutdown(ctx)
		<-s.insecureDone
		s.insecure = nil
	}
}

// chain is the kube-scheduler's buildHandlerChain (cmd/kube-scheduler/app/server.go):
// authentication (a request without credentials is system:anonymous, as there), then
// authorization. So a scraper without a token gets 403 for system:anonymous, as from the
// kube-scheduler, and one with a token the API server does not know gets 401.
func chain(handler http.Handler, authn server.AuthenticationInfo, authz authorizer.Authorizer) http.Handler {
	resolver := &apirequest.RequestInfoFactory{}
	unauthorized := genericapifilters.Unauthorized(scheme.Codecs)
	handler = genericapifilters.WithAuthorization(handler, authz, scheme.Codecs)
	handler = genericapifilters.WithAuthentication(handler, authn.Authenticator, unauthorized, nil, nil)
	handler = genericapifilters.WithRequestInfo(handler, resolver)
	handler = genericapifilters.WithCacheControl(handler)
	handler = genericfilters.WithHTTPLogging(handler)
	handler = genericfilters.WithPanicRecovery(handler, resolver)
	return handler
}
