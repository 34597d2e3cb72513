package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCheckOnModels runs the whole check against the mock machines (their
// own driver installations): every GPU matches its model, the specs
// validate, and a container given a GPU's spec sees that GPU.
func TestCheckOnModels(t *testing.T) {
	for _, machine := range []string{"dgxa100", "dgxh100", "dgxh200", "dgxb200"} {
		t.Run(machine, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(context.Background(), []string{"--backend=mock:" + machine + "?gpus=2"}, &out); code != 0 {
				t.Fatalf("exit %d:\n%s", code, out.String())
			}
			for _, want := range []string{"matches the model", "dynamicMIG: ", "gpu-1: validates", "RESULT: OK", "/dev/nvidia1(c 195:1)"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			if strings.Contains(out.String(), "the model says it sees [] ") {
				t.Errorf("a container given a GPU sees nothing:\n%s", out.String())
			}
		})
	}
}

// TestCheckFailsWithoutTheDriver: a driver root without the driver fails
// the check with the reason.
func TestCheckFailsWithoutTheDriver(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--backend=mock:dgxh100?gpus=1", "--driver-root=" + t.TempDir()}, &out); code != 1 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "NVIDIA driver libraries not found") {
		t.Fatalf("output:\n%s", out.String())
	}
}
