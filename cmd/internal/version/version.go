// Package version holds the build version of the tessera binaries. The values are
// set at link time by the Makefile (-ldflags -X); a binary built with plain
// `go build` still reports something honest ("dev" and the module's VCS info),
// and one built by `go install ...@version` the module version.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/tessera-gpu/tessera/cmd/internal/version.gitVersion=v0.1.0".
var (
	gitVersion = "dev"
	gitCommit  = ""
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the version of this binary.
func Get() Info {
	version, commit := gitVersion, gitCommit
	if bi, ok := debug.ReadBuildInfo(); ok {
		// `go install .../cmd/tessera@v1.2.3` (or @commit) records the
		// module's version; a build in a checkout records "(devel)".
		if version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if commit == "" && s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	return Info{
		Version:   version,
		Commit:    commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String renders the version for --version output.
func (i Info) String() string {
	s := i.Version
	if i.Commit != "" {
		s += " (" + i.Commit + ")"
	}
	return fmt.Sprintf("%s %s %s", s, i.GoVersion, i.Platform)
}
