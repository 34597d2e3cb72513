package shadowreport

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestWriteTableAndJSON(t *testing.T) {
	reports, now := sample()
	s := Summarize(reports, now)
	var out bytes.Buffer
	if err := WriteTable(&out, s); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	var half string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, " half ") {
			half = strings.Join(strings.Fields(l), " ")
		}
	}
	if want := "a half - 8/12 - 80.0s (max 8) Waiting/Unschedulable 0 - deadlocked"; half != want {
		t.Errorf("half gang line = %q, want %q\n%s", half, want, text)
	}
	for _, want := range []string{
		"3 gangs (3 ready): placed by both 1, only by the scheduler in use 0, only by tessera 1, by neither 1",
		"ready → fully bound (scheduler in use): n=1 p50 4.0s",
		"partly placed: 2 gangs, 83.0 s in all; deadlocks: 1; quota violations: 0",
		"mapping errors: UnknownWorkload 1",
		"mapping: UnknownWorkload: no definition",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if err := WriteJSON(&out, s); err != nil {
		t.Fatal(err)
	}
	var back Summary
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Gangs) != 3 || back.Totals.Deadlocks != 1 || back.Gangs[1].ActualBound != 8 || back.Totals.MappingErrors["UnknownWorkload"] != 1 {
		t.Errorf("JSON round trip = %+v", back)
	}
}
