// Package metricsconv is the one convention for tessera's Prometheus metrics:
// how they are named, how a binary serves them, and how several registries
// of one process are served together.
//
// Names are tessera_<component>_<what>[_<unit>], built with
// k8s.io/component-base/metrics (Namespace "tessera", Subsystem the
// component), counters ending in _total and durations in _seconds. A
// component's process-wide metrics go into component-base's legacy registry
// (with the Go runtime and client-go metrics); metrics of which one process
// may hold several instances (the kubelet plugins; the sandbox runs one per
// simulated node) go into a registry of their own that the binary passes in
// or reads back. Every binary serves all of them through Handler.
package metricsconv

import (
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/ptr"
)

// Namespace starts every tessera metric name.
const Namespace = "tessera"

// The components, each the Subsystem of its metrics.
const (
	// Scheduler: tessera-scheduler (controlplane/scheduler).
	Scheduler = "scheduler"
	// Node: tessera-node's agent (nodeagent/agent).
	Node = "node"
	// DRAPlugin: tessera-node's kubelet DRA plugin (draplugin).
	DRAPlugin = "draplugin"
	// DevicePlugin: tessera-node's classic device plugin (nodeagent/deviceplugin).
	DevicePlugin = "deviceplugin"
	// Cluster: the cluster's state as `tessera top` shows it
	// (controlplane/overview), served by `tessera top --web`.
	Cluster = "cluster"
)

// Components are the subsystems in use.
var Components = []string{Scheduler, Node, DRAPlugin, DevicePlugin, Cluster}

var nameRE = regexp.MustCompile(`^tessera_(` + strings.Join(Components, "|") + `)_[a-z][a-z0-9_]*[a-z0-9]$`)

// CheckName says what is wrong with a tessera metric's name and type, or nil.
func CheckName(name string, kind dto.MetricType) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s: want tessera_<%s>_<what>", name, strings.Join(Components, "|"))
	}
	switch {
	case kind == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total"):
		return fmt.Errorf("%s: a counter's name ends in _total", name)
	case kind != dto.MetricType_COUNTER && strings.HasSuffix(name, "_total"):
		return fmt.Errorf("%s: only counters end in _total", name)
	case strings.Contains(name, "duration") && !strings.HasSuffix(name, "_seconds"):
		return fmt.Errorf("%s: durations are in seconds (_seconds)", name)
	}
	return nil
}

// Handler serves /metrics: the legacy registry and the extra gatherers,
// continuing past a gatherer's error (the rest are still served).
func Handler(extra ...prometheus.Gatherer) http.Handler {
	gatherers := append(prometheus.Gatherers{legacyregistry.DefaultGatherer}, extra...)
	return promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// WithLabels adds constant labels to every metric a gatherer gathers, so
// that registries of several instances of a component (one DRA plugin per
// simulated node) can be served side by side.
func WithLabels(g prometheus.Gatherer, labels map[string]string) prometheus.Gatherer {
	names := make([]string, 0, len(labels))
	for n := range labels {
		names = append(names, n)
	}
	sort.Strings(names)
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := g.Gather()
		for _, f := range families {
			for _, m := range f.Metric {
				for _, n := range names {
					m.Label = append(m.Label, &dto.LabelPair{Name: ptr.To(n), Value: ptr.To(labels[n])})
				}
				sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
			}
		}
		return families, err
	})
}
