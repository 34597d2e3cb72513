package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
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
		webAddr  string
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
The chart runs it as the tessera-overview Deployment.`,
		Example: "  tessera top\n  tessera top --once\n  tessera top --web :8080    # then open http://localhost:8080/",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := kube.config()
			if err != nil {
				return err
			}
			if webAddr != "" {
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return serveWeb(ctx, cfg, webAddr, interval, cmd.OutOrStdout())
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
	cmd.Flags().StringVar(&webAddr, "web", "", "serve the overview as a web page (and /metrics) at this address, e.g. :8080")
	return cmd
}

// serveWeb runs `tessera top --web`: informer caches of what the overview
// reads, the page, /overview.json, /metrics (the cluster metrics) and
// /healthz, until ctx ends.
func serveWeb(ctx context.Context, cfg *rest.Config, addr string, refresh time.Duration, out io.Writer) error {
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
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--web %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(ln) }()
	fmt.Fprintf(out, "tessera top: the overview at %s (also /overview.json and /metrics); Ctrl-C stops\n", browseURL(ln.Addr()))
	select {
	case <-ctx.Done():
	case err := <-errs:
		return fmt.Errorf("--web: %w", err)
	}
	shutdown, cancelShutdown := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancelShutdown()
	return srv.Shutdown(shutdown)
}

// browseURL is the address to open: an unspecified host (":8080") is
// reachable as localhost.
func browseURL(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return "http://" + a.String() + "/"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
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
