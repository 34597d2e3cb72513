package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReportShadowRejectsBadOutput(t *testing.T) {
	cmd := newRootCommand()
	cmd.SetArgs([]string{"report", "shadow", "-o", "xml", "--kubeconfig", "/nonexistent"})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `--output "xml"`) {
		t.Errorf("tessera report shadow -o xml: error %v, want one naming --output", err)
	}
}
