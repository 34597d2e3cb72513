package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/lint"
)

func newCatalogCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "Inspect the Workload Map definitions tessera reads workloads with",
	}
	cmd.AddCommand(newCatalogListCommand(), newCatalogLintCommand(), newCatalogCoverageCommand())
	return cmd
}

func newCatalogListCommand() *cobra.Command {
	var f catalogFlags
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the definitions in force (built-in, overridden by --definitions)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cat, err := f.offlineCatalog()
			if err != nil {
				return err
			}
			infos := cat.Definitions()
			out := cmd.OutOrStdout()
			if output == "json" {
				type row struct {
					APIVersion string                `json:"apiVersion"`
					Kind       string                `json:"kind"`
					Definition catalog.DefinitionRef `json:"definition"`
					Overrides  string                `json:"overrides,omitempty"`
				}
				rows := []row{}
				for _, i := range infos {
					rows = append(rows, row{i.GVK.GroupVersion().String(), i.GVK.Kind, i.Definition, i.Overrides})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "APIVERSION\tKIND\tDEFINITION\tSOURCE\tOVERRIDES")
			for _, i := range infos {
				src := i.Definition.Source
				if i.Definition.File != "" {
					src = i.Definition.File
				}
				over := "-"
				if i.Overrides != "" {
					over = i.Overrides
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", i.GVK.GroupVersion().String(), i.GVK.Kind, i.Definition.Name, src, over)
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newCatalogLintCommand() *cobra.Command {
	var f catalogFlags
	var crdFiles []string
	cmd := &cobra.Command{
		Use:   "lint --crd CRD.yaml [DEFINITION...]",
		Short: "Check every path a definition reads against the OpenAPI schema of the kind's CRD",
		Long: `lint checks the definitions given (files or directories, and --definitions), or, when
none is given, the definitions in force for the CRD's kind, against the CRD's schema:
each object path that an expression reads and that the schema lacks is printed with
the definition, the field and the expression. It exits non-zero when it finds any,
so it can gate an operator upgrade.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(crdFiles) == 0 {
				return errors.New("--crd is required")
			}
			var crds []*apiextensionsv1.CustomResourceDefinition
			for _, file := range crdFiles {
				cs, err := readCRDs(file)
				if err != nil {
					return err
				}
				crds = append(crds, cs...)
			}
			defs, err := catalog.LoadDefinitionFiles(append(append([]string{}, f.definitions...), args...)...)
			if err != nil {
				return err
			}
			if len(defs) == 0 {
				cat, err := catalog.New(nil)
				if err != nil {
					return err
				}
				for _, crd := range crds {
					for _, v := range crd.Spec.Versions {
						if d, ok := cat.Definition(lint.GVKOf(crd, v.Name)); ok {
							defs = append(defs, d)
						}
					}
				}
				if len(defs) == 0 {
					return errors.New("no definition reads the kinds of the given CRDs")
				}
			}
			return runLint(cmd.OutOrStdout(), crds, defs)
		},
	}
	f.register(cmd)
	cmd.Flags().StringArrayVar(&crdFiles, "crd", nil, "CustomResourceDefinition YAML file; repeatable")
	return cmd
}

func runLint(out io.Writer, crds []*apiextensionsv1.CustomResourceDefinition, defs []*catalog.Definition) error {
	findings, checked := 0, 0
	for _, d := range defs {
		gvk := d.RootGVK()
		var crd *apiextensionsv1.CustomResourceDefinition
		for _, c := range crds {
			if c.Spec.Group == gvk.Group && c.Spec.Names.Kind == gvk.Kind {
				crd = c
			}
		}
		if crd == nil {
			fmt.Fprintf(out, "%s: reads %s; no CRD given for it, not checked\n", d.Name, catalog.GVKString(gvk))
			continue
		}
		fs, err := lint.Definition(d, crd)
		if err != nil {
			return err
		}
		checked++
		for _, f := range fs {
			fmt.Fprintln(out, f.String())
		}
		findings += len(fs)
	}
	if findings > 0 {
		return fmt.Errorf("%d path(s) missing from the CRD schema", findings)
	}
	fmt.Fprintf(out, "%d definition(s) checked, every path is in the schema\n", checked)
	return nil
}

func readCRDs(file string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	docs, err := catalog.SplitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for i, doc := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		if tm.Kind != "CustomResourceDefinition" {
			continue
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(doc, &crd); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		out = append(out, &crd)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no CustomResourceDefinition in the file", file)
	}
	return out, nil
}

func newCatalogCoverageCommand() *cobra.Command {
	var f catalogFlags
	cmd := &cobra.Command{
		Use:   "coverage",
		Short: "List the cluster's CRDs with a definition, without one, and overridden",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCoverage(cmd.Context(), &f, cmd.OutOrStdout())
		},
	}
	f.register(cmd)
	return cmd
}

func runCoverage(ctx context.Context, f *catalogFlags, out io.Writer) error {
	cfg, err := f.restConfig()
	if err != nil {
		return err
	}
	ac, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cat, err := f.clusterCatalog(ctx, dc)
	if err != nil {
		return err
	}
	crds, err := ac.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing CRDs: %w", err)
	}
	over := map[schema.GroupVersionKind]string{}
	for _, i := range cat.Definitions() {
		if i.Overrides != "" {
			over[i.GVK] = i.Overrides
		}
	}
	type row struct{ gv, kind, state, def string }
	var rows []row
	for _, crd := range crds.Items {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gvk := lint.GVKOf(&crd, v.Name)
			r := row{gv: gvk.GroupVersion().String(), kind: gvk.Kind, state: "no definition", def: "-"}
			if d, ok := cat.Definition(gvk); ok {
				r.state, r.def = "covered ("+d.Source+")", d.Name
				if o := over[gvk]; o != "" {
					r.state = "overridden (" + d.Source + " replaces built-in " + o + ")"
				}
			}
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].state[0] != rows[j].state[0] {
			return rows[i].state < rows[j].state
		}
		return rows[i].gv+rows[i].kind < rows[j].gv+rows[j].kind
	})
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APIVERSION\tKIND\tCOVERAGE\tDEFINITION")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.gv, r.kind, r.state, r.def)
	}
	return tw.Flush()
}
