// Command render-manifests keeps the generated parts of deployments/ in step
// with their sources: it copies the CRDs and DeviceClasses into the Helm chart
// and renders the chart with its default values into deployments/manifests/.
// With -check it changes nothing and fails when anything is out of date (CI).
//
//	go run ./hack/render-manifests          # update
//	go run ./hack/render-manifests -check   # verify
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/tessera-gpu/tessera/deployments"
)

func main() {
	check := flag.Bool("check", false, "change nothing; exit 1 when the chart's copies or deployments/manifests are out of date")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, "render-manifests:", err)
		os.Exit(1)
	}
}

func run(check bool) error {
	dir := deployments.Dir()
	if check {
		diffs, err := deployments.DiffSources(dir)
		if err != nil {
			return err
		}
		stale, err := staleManifests(dir)
		if err != nil {
			return err
		}
		diffs = append(diffs, stale...)
		if len(diffs) > 0 {
			for _, d := range diffs {
				fmt.Fprintln(os.Stderr, "out of date:", d)
			}
			return errors.New("run `go run ./hack/render-manifests` and commit the result")
		}
		return nil
	}
	changed, err := deployments.SyncSources(dir)
	if err != nil {
		return err
	}
	for _, c := range changed {
		fmt.Println("synced", c)
	}
	files, err := render()
	if err != nil {
		return err
	}
	out := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, name := range sortedKeys(files) {
		p := filepath.Join(out, name)
		old, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if bytes.Equal(old, files[name]) {
			continue
		}
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p)
	}
	return nil
}

func render() (map[string][]byte, error) {
	r, err := deployments.Render(deployments.Options{})
	if err != nil {
		return nil, err
	}
	return deployments.PlainManifests(r, deployments.DefaultReleaseName, deployments.DefaultNamespace), nil
}

// staleManifests compares deployments/manifests/ with a fresh render.
func staleManifests(dir string) ([]string, error) {
	files, err := render()
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, name := range sortedKeys(files) {
		got, err := os.ReadFile(filepath.Join(dir, "manifests", name))
		if err != nil || !bytes.Equal(got, files[name]) {
			stale = append(stale, filepath.Join("deployments", "manifests", name))
		}
	}
	return stale, nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
