// Command promql parses PromQL expressions with Prometheus's own parser and
// prints, for each, the metric names its selectors name. The dashboard and
// alert test (test/e2e) runs it: a typo in an expression fails to parse, and
// every name must be one a running sandbox exports. It is a module of its own
// so that github.com/prometheus/prometheus stays out of tessera's
// dependencies.
//
// Input (stdin): a JSON array of expressions. Output (stdout): a JSON array
// of {"expr", "metrics", "error"} in the same order.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "read expressions:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	out := make([]result, 0, len(exprs))
	for _, e := range exprs {
		r := result{Expr: e, Metrics: []string{}}
		node, err := p.ParseExpr(e)
		if err != nil {
			r.Error = err.Error()
			out = append(out, r)
			continue
		}
		seen := map[string]bool{}
		parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name == "" {
				r.Error = "a selector without a metric name: " + vs.String()
			} else if !seen[name] {
				seen[name] = true
				r.Metrics = append(r.Metrics, name)
			}
			return nil
		})
		sort.Strings(r.Metrics)
		out = append(out, r)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
