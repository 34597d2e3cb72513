package bench

import (
	"reflect"
	"testing"
)

func TestWholeSeconds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ticks []int
		got   int
		want  []float64
	}{
		{"nothing bound", []int{0, 0, 0}, 0, nil},
		{"cold start left out, the last partial second too", []int{0, 0, 10, 30, 45}, 50, []float64{10, 20, 15}},
		{"a stall's empty seconds after the last binding left out", []int{0, 5, 20, 20, 20, 20}, 20, []float64{5, 15}},
		{"an empty second in the middle counts", []int{0, 5, 5, 9}, 12, []float64{5, 0, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wholeSeconds(tc.ticks, tc.got); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("wholeSeconds(%v, %d) = %v, want %v", tc.ticks, tc.got, got, tc.want)
			}
		})
	}
}

func TestSpreadAndPercentile(t *testing.T) {
	if s := spreadOf([]float64{3, 1, 2}); s != (spread{2, 1, 3}) {
		t.Errorf("spreadOf odd = %v", s)
	}
	if s := spreadOf([]float64{4, 1, 2, 3}); s != (spread{2.5, 1, 4}) {
		t.Errorf("spreadOf even = %v", s)
	}
	v := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0.5: 5, 0.9: 9, 0.99: 10, 0: 1} {
		if got := percentile(v, q); got != want {
			t.Errorf("percentile(%v) = %v, want %v", q, got, want)
		}
	}
	if percentile(nil, 0.5) != 0 || mean(nil) != 0 {
		t.Error("no samples must give 0")
	}
}
