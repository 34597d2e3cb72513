package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"

	"github.com/tessera-gpu/tessera/cmd/internal/kubeconfig"
	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/controlplane/overview/web"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
	"github.com/tessera-gpu/tessera/internal/secureserve"
)

// kubeFlags are --kubeconfig and --context, resolved as every tessera binary
// does (cmd/internal/kubeconfig: as kubectl does).
type kubeFlags struct {
	kubeconfig string
	context    string
}

func (k *kubeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.kubeconfig, "kubeconfig", "", "path to a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringVar(&k.context, "context", "", "kubeconfig context to use")
}

func (k *kubeFlags) config() (*rest.Config, error) {
	return kubeconfig.Load(kubeconfig.Options{Path: k.kubeconfig, Context: k.context, UserAgent: userAgent})
}

// userAgent names the CLI in the API server's audit log and metrics.
const userAgent = "tessera"

func newTopCommand() *cobra.Command {
	var (
		kube     kubeFlags
		once     bool
		interval time.Duration
		serving  = secureserve.NewOptions("tessera-overview", 0)
		remote   bool
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of GPUs per node, queue usage against quota, and gangs with why they wait",
		Long: `top refreshes every second: per node a bar of its GPUs (whole, MIG slices and
shares in use), per queue usage against quota and limit, gangs pending (with the
scheduler's reason) and running, and totals. When standard output is not a
terminal, or with --once, it prints one plain-text frame and exits.

With --web ADDRESS it serves the same overview as a web page that refreshes
itself (one self-contained page, no external assets), /overview.json for
scripts, and /metrics: the overview as Prometheus metrics
(tessera_cluster_*, which the chart's Grafana dashboard and alerts use).
--web is plain HTTP without authentication, read with your own credentials,
so it listens on a loopback address only (localhost:8080) unless
--web-allow-remote says otherwise.

With --secure-port PORT it serves them over HTTPS the way the kube-scheduler
serves its endpoints: a self-signed certificate unless --tls-cert-file is
given, every request's bearer token checked by the API server (TokenReview)
and its access by RBAC (SubjectAccessReview: get on the non-resource URLs /,
/overview.json, /metrics); /healthz, /readyz and /livez are open. The chart
runs it so as the tessera-overview Deployment.`,
		Example: "  tessera top\n  tessera top --once\n  tessera top --web localhost:8080    # then open http://localhost:8080/\n  tessera top --secure-port 8443      # HTTPS, delegated authentication and authorization",
		RunE: func(cmd *cobra.Command, _ []string) error {
			web := serving.InsecureAddress != "" || serving.SecureServing.BindPort != 0
			if web {
				if err := validateServing(serving, remote); err != nil {
					return err
				}
			}
			cfg, err := kube.config()
			if err != nil {
				return err
			}
			if web {
				serving.DefaultKubeconfig(kube.kubeconfig)
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return serveWeb(ctx, cfg, serving, interval, cmd.OutOrStdout())
			}
			out := cmd.OutOrStdout()
			fd := -1
			if f, ok := out.(*os.File); ok {
				fd = int(f.Fd())
			}
			tty := fd >= 0 && term.IsTerminal(fd)
			if once || !tty {
				c, err := overview.Fetch(cmd.Context(), cfg, time.Now())
				if err != nil {
					return err
				}
				overview.Render(out, c, overview.Style{})
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ticker := time.NewTicker(interval)
			defer ticker.Stop()
			for {
				width, _, _ := term.GetSize(fd)
				var frame bytes.Buffer
				c, err := overview.Fetch(ctx, cfg, time.Now())
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					fmt.Fprintf(&frame, "tessera top: %v\n", err)
				} else {
					overview.Render(&frame, c, overview.Style{Color: true, Width: width})
				}
				// Home the cursor, draw, and clear what the last frame left below.
				fmt.Fprint(out, "\x1b[H\x1b[2J")
				_, _ = out.Write(frame.Bytes())
				select {
				case <-ctx.Done():
					return nil
				case <-ticker.C:
				}
			}
		},
	}
	kube.register(cmd)
	cmd.Flags().BoolVar(&once, "once", false, "print one frame as plain text and exit")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	serving.AddFlags(cmd.Flags(), "web", "web view (the page, /overview.json, /metrics and /healthz; e.g. localhost:8080)")
	cmd.Flags().BoolVar(&remote, "web-allow-remote", false, "let --web listen on an address other than loopback (plain HTTP without authentication, reachable from the network: only for a trusted network)")
	return cmd
}

// validateServing checks the serving flags; plain HTTP is served on a
// loopback address unless allowed otherwise: the page shows what the user's
// own credentials (or the pod's service account) can read, to anyone who can
// connect.
func validateServing(o *secureserve.Options, remote bool) error {
	if errs := o.Validate(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	if o.InsecureAddress == "" || remote {
		return nil
	}
	host, _, err := net.SplitHostPort(o.InsecureAddress)
	if err != nil {
		return fmt.Errorf("--web %q: %w", o.InsecureAddress, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--web %s would serve the overview over plain HTTP without authentication to the network: "+
		"use a loopback address (localhost:8080, 127.0.0.1:8080), --secure-port for HTTPS with delegated authentication and authorization, "+
		"or --web-allow-remote on a trusted network", o.InsecureAddress)
}

// serveWeb runs `tessera top --web` / `--secure-port`: informer caches of
// what the overview reads, the page, /overview.json, /metrics (the cluster
// metrics) and the health paths, until ctx ends (internal/secureserve: HTTPS
// behind delegated authentication and authorization, plain HTTP on --web).
func serveWeb(ctx context.Context, cfg *rest.Config, serving *secureserve.Options, refresh time.Duration, out io.Writer) error {
	watcher, err := overview.NewWatcher(cfg)
	if err != nil {
		return err
	}
	ctx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	watcher.Start(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := watcher.WaitForSync(syncCtx); err != nil {
		return fmt.Errorf("reading the cluster: %w", err)
	}
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(overview.NewCollector(watcher))
	mux := http.NewServeMux()
	mux.Handle("/", web.Handler(watcher, web.Options{Refresh: refresh}))
	mux.Handle("/metrics", metricsconv.Handler(reg))
	// The informers have synced: healthy and ready while the process runs
	// (the always-allowed paths of the HTTPS endpoint).
	for _, path := range []string{"/healthz", "/readyz", "/livez"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	}
	srv, err := serving.Serve(ctx, mux)
	if err != nil {
		return err
	}
	defer srv.Stop()
	var where []string
	if srv.InsecureAddr != nil {
		where = append(where, browseURL("http", srv.InsecureAddr))
	}
	if srv.SecureAddr != nil {
		where = append(where, browseURL("https", srv.SecureAddr)+" (a bearer token allowed to get it)")
	}
	fmt.Fprintf(out, "tessera top: the overview at %s (also /overview.json and /metrics); Ctrl-C stops\n", strings.Join(where, " and "))
	<-ctx.Done()
	return nil
}

// browseURL is the address to open: an unspecified host (":8080") is
// reachable as localhost.
func browseURL(scheme string, a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return scheme + "://" + a.String() + "/"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/"
}

func newGetCommand() *cobra.Command {
	var (
		kube   kubeFlags
		output string
	)
	cmd := &cobra.Command{
		Use:       "get queues|gangs|gpus",
		Short:     "Print queues, gangs or GPUs for scripts (-o json) or people (table)",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"queues", "gangs", "gpus"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: must be table or json", output)
			}
			what := args[0]
			if what != "queues" && what != "gangs" && what != "gpus" {
				return fmt.Errorf("unknown resource %q: want queues, gangs or gpus", what)
			}
			cfg, err := kube.config()
			if err != nil {
				return err
			}
			c, err := overview.Fetch(cmd.Context(), cfg, time.Now())
			if err != nil {
				return err
			}
			return printGet(cmd.OutOrStdout(), what, output, c)
		},
	}
	kube.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// gpuRow is one GPU in `tessera get gpus`.
type gpuRow struct {
	Node string `json:"node"`
	overview.GPU
}

func printGet(w io.Writer, what, output string, c overview.Cluster) error {
	var data any
	switch what {
	case "queues":
		data = nonNil(c.Queues)
	case "gangs":
		data = nonNil(c.Gangs)
	case "gpus":
		rows := []gpuRow{}
		for _, n := range c.Nodes {
			for _, g := range n.GPUs {
				rows = append(rows, gpuRow{Node: n.Name, GPU: g})
			}
		}
		data = rows
	}
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(data)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch rows := data.(type) {
	case []overview.Queue:
		fmt.Fprintln(tw, "NAME\tPARENT\tALLOCATED\tREQUESTED\tQUOTA\tLIMIT\tWEIGHT")
		for _, q := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%g\t%g\t%s\t%s\t%d\n", q.Name, dash(q.Parent), q.Allocated, q.Requested, optFloat(q.Quota), optFloat(q.Limit), q.Weight)
		}
	case []overview.Gang:
		fmt.Fprintln(tw, "NAMESPACE\tNAME\tQUEUE\tPHASE\tMIN\tBOUND\tRUNNING\tWAITING\tPOSITION\tREASON")
		for _, g := range rows {
			pos := "-"
			if g.Position != nil {
				pos = fmt.Sprintf("%d/%d", g.Position.InQueue, g.Position.Overall) // in its queue / overall
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d/%d\t%d\t%s\t%s\t%s\n", g.Namespace, g.Name, dash(g.Queue), g.Phase, g.MinMember, g.Scheduled, g.Members, g.Running, g.Waiting, pos, g.Reason)
		}
	case []gpuRow:
		fmt.Fprintln(tw, "NODE\tGPU\tPRODUCT\tMODE\tUSED\tDETAIL\tHEALTHY\tCLAIMS")
		for _, g := range rows {
			fmt.Fprintf(tw, "%s\tgpu-%d\t%s\t%s\t%.2f\t%s\t%t\t%d\n", g.Node, g.Minor, g.Product, g.Mode, g.Used, dash(g.Detail), !g.Tainted, len(g.Claims))
		}
	}
	return tw.Flush()
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func optFloat(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%g", *v)
}
