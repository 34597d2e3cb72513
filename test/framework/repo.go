package framework

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is the tessera module; the repository root is the directory whose
// go.mod declares it.
const modulePath = "github.com/tessera-gpu/tessera"

// RepoRoot returns the root of the tessera checkout that contains the working
// directory (tests run in their package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declares(data, modulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the tessera repository (no go.mod for " + modulePath + " above the working directory)")
		}
		dir = parent
	}
}

// declares reports whether a go.mod's first statement is `module path`.
func declares(gomod []byte, path string) bool {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return line == "module "+path
	}
	return false
}
