package catalog

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

// builtinFS holds tessera's own definitions, written in the Workload Map format.
//
//go:embed definitions/*.yaml
var builtinFS embed.FS

// BuiltinDefinitions parses the embedded definitions.
func BuiltinDefinitions() ([]*Definition, error) {
	names, err := fs.Glob(builtinFS, "definitions/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var defs []*Definition
	for _, n := range names {
		data, err := builtinFS.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("reading built-in %s: %w", n, err)
		}
		ds, err := ParseDefinitions(data, path.Base(n), SourceBuiltin)
		if err != nil {
			return nil, fmt.Errorf("built-in definitions: %w", err)
		}
		defs = append(defs, ds...)
	}
	return defs, nil
}
