package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
)

// newDiscoverCommand prints what tessera-node would publish on this machine,
// without an API server and without changing any GPU: the operator's way to
// check a partition config against real hardware before rolling it out.
func newDiscoverCommand() *cobra.Command {
	var backend, configPath, nodeLabels string
	var noPartitionable, noConsumable bool
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "Print the GPUs of this machine and the ResourceSlices tessera-node would publish (changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			features := slices.AllFeatures
			features.PartitionableDevices = !noPartitionable
			features.ConsumableCapacity = !noConsumable
			return discover(cmd.Context(), cmd.OutOrStdout(), backend, configPath, nodeLabels, features)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&backend, "backend", nvmlbackend.Real, "NVML backend, as for tessera-node.")
	fs.StringVar(&configPath, "config", "", "Partition config file; empty offers every GPU whole.")
	fs.StringVar(&nodeLabels, "node-labels", "", "Labels of the node, to select the config entry (k=v,k2=v2).")
	fs.BoolVar(&noPartitionable, "without-partitionable-devices", false, "Show what a cluster without DRAPartitionableDevices would get.")
	fs.BoolVar(&noConsumable, "without-consumable-capacity", false, "Show what a cluster without DRAConsumableCapacity would get.")
	return cmd
}

type discoverOutput struct {
	DriverVersion     string               `json:"driverVersion"`
	CUDADriverVersion string               `json:"cudaDriverVersion"`
	Entry             string               `json:"configEntry"`
	GPUs              []discoverGPU        `json:"gpus"`
	Degraded          []string             `json:"degraded,omitempty"`
	Unavailable       []string             `json:"unavailable,omitempty"`
	Counts            slices.Counts        `json:"counts"`
	Slices            []discoverSliceShape `json:"slices"`
}

type discoverGPU struct {
	Index        int      `json:"index"`
	UUID         string   `json:"uuid"`
	ProductName  string   `json:"productName"`
	PCIeRoot     string   `json:"pcieRoot,omitempty"`
	Mode         string   `json:"mode"`
	Rule         string   `json:"rule"`
	MigCapable   bool     `json:"migCapable"`
	MigEnabled   bool     `json:"migEnabled"`
	MigProfiles  []string `json:"migProfiles,omitempty"`
	MigInstances []string `json:"migInstances,omitempty"`
}

type discoverSliceShape struct {
	CounterSets []string `json:"counterSets,omitempty"`
	Devices     []string `json:"devices,omitempty"`
}

func discover(ctx context.Context, out io.Writer, backend, configPath, nodeLabels string, features slices.Features) error {
	cfg := &partition.Config{}
	if configPath != "" {
		var err error
		if cfg, err = partition.Load(configPath); err != nil {
			return err
		}
	}
	set, err := labels.ConvertSelectorToLabelsMap(nodeLabels)
	if err != nil {
		return fmt.Errorf("--node-labels: %w", err)
	}
	lib, err := nvmlbackend.Open(backend)
	if err != nil {
		return err
	}
	defer lib.Shutdown()
	roots, err := nvmlbackend.RootsOf(lib)
	if err != nil {
		return err
	}
	node, err := discovery.DiscoverWith(ctx, lib, discovery.Options{SysRoot: roots.Sys})
	if err != nil {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	plan, err := partition.Resolve(cfg, set, node)
	if err != nil {
		return err
	}
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: features})
	o := discoverOutput{DriverVersion: node.DriverVersion, CUDADriverVersion: node.CUDADriverVersion, Entry: plan.Entry, Degraded: res.Degraded, Counts: res.Counts}
	for _, u := range node.Unavailable {
		o.Unavailable = append(o.Unavailable, fmt.Sprintf("GPU %d: %v", u.Index, u.Err))
	}
	for i, g := range node.GPUs {
		dg := discoverGPU{Index: g.Index, UUID: g.UUID, ProductName: g.ProductName, PCIeRoot: g.PCIeRoot, Mode: string(plan.GPUs[i].Mode), Rule: plan.GPUs[i].Field, MigCapable: g.MigCapable, MigEnabled: g.MigEnabled, MigProfiles: g.ProfileNames()}
		for _, in := range g.MigInstances {
			dg.MigInstances = append(dg.MigInstances, fmt.Sprintf("%s@%d %s", in.Profile, in.Placement.Start, in.UUID))
		}
		o.GPUs = append(o.GPUs, dg)
	}
	for _, s := range res.Pool.Slices {
		var shape discoverSliceShape
		for _, cs := range s.SharedCounters {
			shape.CounterSets = append(shape.CounterSets, cs.Name)
		}
		for _, d := range s.Devices {
			shape.Devices = append(shape.Devices, d.Name)
		}
		o.Slices = append(o.Slices, shape)
	}
	data, err := yaml.Marshal(o)
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}
