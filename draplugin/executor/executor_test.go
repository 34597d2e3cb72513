package executor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOSRun(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := "#!/bin/sh\necho \"args=$* env=$FOO\" >> " + log + "\ncat >> " + log + "\necho out\n"
	if err := os.WriteFile(filepath.Join(dir, "fake-tool"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	fail := "#!/bin/sh\necho broken >&2\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "fail-tool"), []byte(fail), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))

	out, err := OS{}.Run(context.Background(), Command{Name: "fake-tool", Args: []string{"-i", "x"}, Env: []string{"FOO=bar"}, Stdin: "quit\n"})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "out\n" {
		t.Errorf("stdout = %q", out)
	}
	got, _ := os.ReadFile(log)
	if want := "args=-i x env=bar\nquit\n"; string(got) != want {
		t.Errorf("recorded %q, want %q", got, want)
	}

	_, err = OS{}.Run(context.Background(), Command{Name: "fail-tool"})
	if err == nil || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("err = %v, want exit status and stderr", err)
	}
	_, err = OS{}.Run(context.Background(), Command{Name: "no-such-tool-here"})
	if err == nil || !strings.Contains(err.Error(), "no-such-tool-here") {
		t.Errorf("err = %v", err)
	}
}
