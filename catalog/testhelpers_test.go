package catalog

import (
	"os"
	"path/filepath"
	"testing"
)

const workloadsDir = "../test/testdata/workloads"
const upstreamDefsDir = "../test/testdata/workloadmap-definitions"

// readManifests parses a testdata manifest file.
func readManifests(t testing.TB, rel string) []Document {
	t.Helper()
	path := filepath.Join(workloadsDir, rel)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := ParseManifests(data, path)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func newBuiltinCatalog(t testing.TB) *Catalog {
	t.Helper()
	c, err := New(nil)
	if err != nil {
		t.Fatalf("built-in catalog: %v", err)
	}
	return c
}
