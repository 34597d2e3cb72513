package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
	"github.com/tessera-gpu/tessera/cmd/internal/kubeconfig"
)

// catalogFlags are the flags every map and catalog subcommand accepts.
type catalogFlags struct {
	definitions []string
	kubeconfig  string
	context     string
}

func (f *catalogFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.definitions, "definitions", nil, "a Workload Map definition file or directory; repeatable; overrides the built-in definition of the same kind")
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringVar(&f.context, "context", "", "kubeconfig context")
}

// userDefinitions reads the --definitions files.
func (f *catalogFlags) userDefinitions() ([]*catalog.Definition, error) {
	return catalog.LoadDefinitionFiles(f.definitions...)
}

// offlineCatalog is the catalog of built-ins and --definitions files.
func (f *catalogFlags) offlineCatalog() (*catalog.Catalog, error) {
	defs, err := f.userDefinitions()
	if err != nil {
		return nil, err
	}
	return catalog.New(defs)
}

func (f *catalogFlags) restConfig() (*rest.Config, error) {
	return kubeconfig.Load(kubeconfig.Options{Path: f.kubeconfig, Context: f.context, UserAgent: userAgent})
}

// clusterCatalog adds the cluster's WorkloadDefinition objects to the files'
// definitions: files override the cluster, which overrides the built-ins.
func (f *catalogFlags) clusterCatalog(ctx context.Context, dc dynamic.Interface) (*catalog.Catalog, error) {
	fileDefs, err := f.userDefinitions()
	if err != nil {
		return nil, err
	}
	clusterDefs, err := clusterDefinitions(ctx, dc)
	if err != nil {
		return nil, err
	}
	fromFile := map[schema.GroupVersionKind]bool{}
	for _, d := range fileDefs {
		fromFile[d.RootGVK()] = true
	}
	defs := fileDefs
	for _, d := range clusterDefs {
		if !fromFile[d.RootGVK()] {
			defs = append(defs, d)
		}
	}
	return catalog.New(defs)
}

// clusterDefinitions lists WorkloadDefinition objects; none when the CRD is absent.
func clusterDefinitions(ctx context.Context, dc dynamic.Interface) ([]*catalog.Definition, error) {
	list, err := dc.Resource(v1alpha1.WorkloadDefinitionsResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing WorkloadDefinitions: %w", err)
	}
	var defs []*catalog.Definition
	for i := range list.Items {
		d, err := catalog.DefinitionFromObject(&list.Items[i])
		if err != nil {
			return nil, err
		}
		defs = append(defs, d)
	}
	return defs, nil
}

type mapOptions struct {
	catalogFlags
	files         []string
	output        string
	namespace     string
	showTemplates bool
	gpuMemory     string
}

func newMapCommand() *cobra.Command {
	o := &mapOptions{}
	cmd := &cobra.Command{
		Use:   "map (-f FILE|DIR|- ... | KIND/NAME)",
		Short: "Show the components, replicas, GPUs, gangs and status of workloads, read through the catalog",
		Long: `map reads workload objects from files (-f, multi-document YAML or JSON; a directory
is read recursively; - is standard input) or one live object (KIND/NAME, with -n), and
prints, per workload, its components with role, replicas (min-max), GPUs per pod and
gang, and the totals. Objects that are not workloads are skipped with a note on stderr.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.output != "table" && o.output != "json" && o.output != "yaml" {
				return fmt.Errorf("-o %q: want table, json or yaml", o.output)
			}
			switch {
			case len(args) == 1 && len(o.files) > 0:
				return errors.New("give either -f or KIND/NAME, not both")
			case len(args) == 1:
				return o.runLive(cmd.Context(), args[0], cmd.OutOrStdout(), cmd.ErrOrStderr())
			case len(o.files) > 0:
				return o.runFiles(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return errors.New("nothing to map: give -f FILE or KIND/NAME")
		},
	}
	o.register(cmd)
	cmd.Flags().StringArrayVarP(&o.files, "filename", "f", nil, "manifest file or directory, or - for standard input; repeatable")
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "", "namespace of KIND/NAME (default: the kubeconfig's)")
	cmd.Flags().BoolVar(&o.showTemplates, "show-templates", false, "include each component's pod template in json and yaml output")
	cmd.Flags().StringVar(&o.gpuMemory, "gpu-memory", "", "memory of one GPU (e.g. 80Gi), to count shares of a GPU's memory (shared-GPU claims, KAI gpu-memory) in GPU units with -f; a live object uses the cluster's smallest GPU")
	return cmd
}

func (o *mapOptions) runFiles(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	cat, err := o.offlineCatalog()
	if err != nil {
		return err
	}
	var docs []catalog.Document
	for _, f := range o.files {
		ds, err := readManifestArg(f, stdin)
		if err != nil {
			return err
		}
		docs = append(docs, ds...)
	}
	objs := make([]*unstructured.Unstructured, len(docs))
	for i, d := range docs {
		objs[i] = d.Object
	}
	claims, err := catalog.NewStaticClaims(objs)
	if err != nil {
		return err
	}
	if o.gpuMemory != "" {
		q, err := resource.ParseQuantity(o.gpuMemory)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("--gpu-memory %q: want a positive quantity such as 80Gi", o.gpuMemory)
		}
		claims.SetGPUMemory(&q)
	}
	workloads := []*catalog.Workload{}
	failed := 0
	for _, d := range docs {
		w, err := cat.MapWithClaims(ctx, d.Object, claims)
		if catalog.IsUnknownKind(err) {
			fmt.Fprintf(stderr, "skipping %s %s (%s, document %d): not a workload (no definition for this kind)\n",
				catalog.GVKString(d.Object.GroupVersionKind()), d.Object.GetName(), d.File, d.Index)
			continue
		}
		if err != nil {
			failed++
			fmt.Fprintf(stderr, "error: %s: document %d: %v\n", d.File, d.Index, err)
			continue
		}
		workloads = append(workloads, w)
	}
	if err := o.print(stdout, workloads); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d object(s) could not be mapped", failed)
	}
	return nil
}

// readManifestArg reads a -f argument: a file, a directory or "-".
func readManifestArg(arg string, stdin io.Reader) ([]catalog.Document, error) {
	if arg == "-" {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return catalog.ParseManifests(data, "<stdin>")
	}
	files, err := catalog.ExpandPath(arg)
	if err != nil {
		return nil, err
	}
	var docs []catalog.Document
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		ds, err := catalog.ParseManifests(data, f)
		if err != nil {
			return nil, err
		}
		docs = append(docs, ds...)
	}
	return docs, nil
}

func (o *mapOptions) runLive(ctx context.Context, arg string, stdout, stderr io.Writer) error {
	kind, name, ok := strings.Cut(arg, "/")
	if !ok || kind == "" || name == "" {
		return fmt.Errorf("%q: want KIND/NAME", arg)
	}
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	ns := o.namespace
	if ns == "" {
		ns, _ = kubeconfig.Namespace(kubeconfig.Options{Path: o.kubeconfig, Context: o.context})
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)), disc, nil)
	gr := schema.ParseGroupResource(strings.ToLower(kind))
	gvk, err := mapper.KindFor(gr.WithVersion(""))
	if err != nil {
		return fmt.Errorf("kind %q: %w", kind, err)
	}
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("kind %q: %w", kind, err)
	}
	var ri dynamic.ResourceInterface = dc.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dc.Resource(m.Resource).Namespace(ns)
	}
	obj, err := ri.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting %s %s: %w", catalog.GVKString(gvk), name, err)
	}
	cat, err := o.clusterCatalog(ctx, dc)
	if err != nil {
		return err
	}
	w, err := cat.MapWithClaims(ctx, obj, &apiClaims{ctx: ctx, client: dc})
	if err != nil {
		return err
	}
	return o.print(stdout, []*catalog.Workload{w})
}

func (o *mapOptions) print(out io.Writer, ws []*catalog.Workload) error {
	if !o.showTemplates {
		for _, w := range ws {
			for i := range w.Components {
				w.Components[i].PodTemplate = nil
			}
		}
	}
	switch o.output {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(ws)
	case "yaml":
		b, err := yaml.Marshal(ws)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	for i, w := range ws {
		if i > 0 {
			fmt.Fprintln(out)
		}
		printWorkloadTable(out, w)
	}
	return nil
}

func printWorkloadTable(out io.Writer, w *catalog.Workload) {
	name := w.Name
	if name == "" && w.GenerateName != "" {
		// The API server completes the name on creation.
		name = w.GenerateName + "<generated>"
	}
	if w.Namespace != "" {
		name = w.Namespace + "/" + name
	}
	def := w.Definition.Name + " (" + w.Definition.Source
	if w.Definition.File != "" {
		def += " " + w.Definition.File
	}
	def += ")"
	fmt.Fprintf(out, "%s %s  status=%s  definition=%s\n", w.Kind, name, w.Status, def)
	gangOf := map[string][]catalog.Gang{}
	for _, g := range w.Gangs {
		for _, c := range g.Components {
			gangOf[c] = append(gangOf[c], g)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tROLE\tREPLICAS\tGPUS/POD\tGANG\tMIN-MEMBER")
	for _, c := range w.Components {
		reps := fmt.Sprint(c.Replicas)
		if c.MinReplicas != c.Replicas || c.MaxReplicas != c.Replicas {
			reps = fmt.Sprintf("%d (%d-%d)", c.Replicas, c.MinReplicas, c.MaxReplicas)
		}
		gpus := fmt.Sprint(c.GPUsPerPod)
		if c.GPUUnitsPerPod != c.GPUsPerPod {
			gpus = fmt.Sprintf("%v (%s units)", c.GPUsPerPod, units(c.GPUUnitsPerPod))
		}
		if len(c.UnresolvedClaims) > 0 {
			gpus += " +?"
		}
		if !c.PodBearing {
			gpus = "-"
			reps += " groups"
		}
		gang, min := "-", "-"
		if gs := gangOf[c.Name]; len(gs) > 0 {
			var names, mins []string
			for _, g := range gs {
				n := g.Name
				if g.Count > 1 {
					n = fmt.Sprintf("%s x%d", g.Name, g.Count)
				}
				names = append(names, n)
				mins = append(mins, fmt.Sprint(g.MinMember))
			}
			gang, min = strings.Join(names, ","), strings.Join(mins, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.Role, reps, gpus, gang, min)
	}
	_ = tw.Flush()
	var gangs []string
	for _, g := range w.Gangs {
		s := fmt.Sprintf("%s x%d (minMember %d)", g.Name, g.Count, g.MinMember)
		if g.Stages > 1 {
			s = fmt.Sprintf("%s x%d (minMember %d, stage %d of %d)", g.Name, g.Count, g.MinMember, g.Stage+1, g.Stages)
		}
		gangs = append(gangs, s)
	}
	sort.Strings(gangs)
	gs := "none (pods are scheduled one by one)"
	if len(gangs) > 0 {
		gs = strings.Join(gangs, ", ")
	}
	total := fmt.Sprintf("TOTAL  pods=%s  gpus=%s", scaled(float64(w.Pods), float64(w.MinPods), float64(w.MaxPods)), scaled(w.GPUs, w.MinGPUs, w.MaxGPUs))
	if w.GPUUnits != w.GPUs || w.MinGPUUnits != w.MinGPUs || w.MaxGPUUnits != w.MaxGPUs {
		total += "  gpu-units=" + scaled(w.GPUUnits, w.MinGPUUnits, w.MaxGPUUnits)
	}
	fmt.Fprintf(out, "%s  gangs: %s\n", total, gs)
	var unresolved []string
	for _, c := range w.Components {
		for _, u := range c.UnresolvedClaims {
			unresolved = append(unresolved, c.Name+": "+u)
		}
	}
	if len(unresolved) > 0 {
		fmt.Fprintf(out, "NOT COUNTED (+?)  %s\n", strings.Join(unresolved, ", "))
	}
}

// scaled renders a total at full scale with its minimum and maximum when they
// differ: "3 (min 1, max 5)".
func scaled(full, min, max float64) string {
	if min == full && max == full {
		return units(full)
	}
	return fmt.Sprintf("%s (min %s, max %s)", units(full), units(min), units(max))
}

// units renders a GPU count: whole numbers as such, fractions with at most three
// decimals.
func units(v float64) string {
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

// apiClaims resolves the claims and claim templates a live workload names by
// reading them from the API server (one object, so no informer is worth it),
// and the memory of the cluster's smallest GPU from its ResourceSlices.
type apiClaims struct {
	ctx    context.Context
	client dynamic.Interface

	memOnce sync.Once
	mem     *resource.Quantity
}

// GPUMemory implements catalog.GPUMemoryLookup.
func (a *apiClaims) GPUMemory() (*resource.Quantity, bool) {
	a.memOnce.Do(func() {
		list, err := a.client.Resource(resourcev1.SchemeGroupVersion.WithResource("resourceslices")).List(a.ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		var slices []*resourcev1.ResourceSlice
		for i := range list.Items {
			var s resourcev1.ResourceSlice
			if runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &s) == nil {
				slices = append(slices, &s)
			}
		}
		a.mem, _ = catalog.SmallestGPUMemory(slices)
	})
	return a.mem, a.mem != nil
}

func (a *apiClaims) get(resource, namespace, name string, into any) bool {
	gvr := resourcev1.SchemeGroupVersion.WithResource(resource)
	u, err := a.client.Resource(gvr).Namespace(namespace).Get(a.ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into) == nil
}

func (a *apiClaims) ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool) {
	var t resourcev1.ResourceClaimTemplate
	return &t, a.get("resourceclaimtemplates", namespace, name, &t)
}

func (a *apiClaims) ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool) {
	var c resourcev1.ResourceClaim
	return &c, a.get("resourceclaims", namespace, name, &c)
}
