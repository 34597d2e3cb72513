package devicename

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name Name
		want string
	}{
		{Name{Kind: KindGPU, Minor: 0}, "gpu-0"},
		{Name{Kind: KindGPU, Minor: 17}, "gpu-17"},
		{Name{Kind: KindShared, Minor: 3}, "gpu-3-shared"},
		{Name{Kind: KindMIG, Minor: 2, Profile: "1g.10gb", Start: 6}, "gpu-2-mig-1g-10gb-6"},
		{Name{Kind: KindMIG, Minor: 0, Profile: "1g.10gb+me", Start: 0}, "gpu-0-mig-1g-10gb--me-0"},
		{Name{Kind: KindMIG, Minor: 0, Profile: "1g.23gb+me.all", Start: 1}, "gpu-0-mig-1g-23gb--me-all-1"},
		{Name{Kind: KindMIG, Minor: 1, Profile: "1g.10gb-me", Start: 3}, "gpu-1-mig-1g-10gb---me-3"},
		{Name{Kind: KindMIG, Minor: 1, Profile: "1c.2g.20gb+me,gfx", Start: 4}, "gpu-1-mig-1c-2g-20gb--me----gfx-4"},
		{Name{Kind: KindMIG, Minor: 7, Profile: "7g.80gb", Start: 0}, "gpu-7-mig-7g-80gb-0"},
	}
	for _, c := range cases {
		got := c.name.String()
		if got != c.want {
			t.Errorf("%+v: encoded %q, want %q", c.name, got, c.want)
		}
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("%q is not a DNS label: %v", got, errs)
		}
		parsed, err := Parse(got)
		if err != nil {
			t.Errorf("Parse(%q): %v", got, err)
			continue
		}
		if parsed != c.name {
			t.Errorf("Parse(%q) = %+v, want %+v", got, parsed, c.name)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, bad := range []string{
		"", "gpu", "gpu-", "gpu-x", "gpu-01", "gpu-0-", "gpu-0-foo", "cpu-0",
		"gpu-0-mig-", "gpu-0-mig-1g-10gb", "gpu-0-mig-1g-10gb-x", "gpu-0-mig-1g-10gb--0",
		"gpu-0-mig-1g-----10gb-0", "GPU-0", "gpu-0-mig--1g-0",
	} {
		if n, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", bad, n)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("gpu-0-mig-1g-10gb--me-3")
	f.Add("gpu-12-shared")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if again := n.String(); again != s {
			t.Fatalf("Parse(%q) = %+v which encodes to %q", s, n, again)
		}
	})
}
