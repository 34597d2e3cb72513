// Package devicename encodes and parses the DRA device names that tessera
// publishes, so that the kubelet plugin can map an allocated device back to a
// GPU and, for MIG devices, to the profile and placement to create.
//
// Names (all DNS labels, as the ResourceSlice API requires):
//
//	gpu-<minor>                          a whole GPU
//	gpu-<minor>-shared                   a GPU shared through consumable capacity
//	gpu-<minor>-mig-<profile>-<start>    a MIG device of <profile> at memory slice <start>
//
// A MIG profile name such as "1g.10gb" or "1g.10gb+me" contains characters
// that a DNS label forbids, so the profile is encoded: every run of profile
// separators becomes a run of hyphens whose length says which separator it
// was: "." → "-", "+" → "--", "-" (negated attribute) → "---", "," → "----".
// Profile tokens are lower-case alphanumerics, so the encoding is reversible:
// "1g.10gb" → "1g-10gb", "1g.10gb+me" → "1g-10gb--me",
// "1g.10gb+me.all" → "1g-10gb--me-all", "1c.2g.20gb" → "1c-2g-20gb".
package devicename

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Kind says what a device name denotes.
type Kind int

const (
	// KindGPU is a whole GPU, allocated exclusively.
	KindGPU Kind = iota + 1
	// KindMIG is a MIG device (a GPU instance with one full compute instance).
	KindMIG
	// KindShared is a GPU shared by several claims through consumable capacity.
	KindShared
)

func (k Kind) String() string {
	switch k {
	case KindGPU:
		return "gpu"
	case KindMIG:
		return "mig"
	case KindShared:
		return "shared"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Name is a parsed device name.
type Name struct {
	Kind  Kind
	Minor int
	// Profile is the MIG profile as NVML/go-nvlib spell it ("1g.10gb"); MIG only.
	Profile string
	// Start is the first memory slice of the GPU instance placement; MIG only.
	// The placement size follows from the profile (see discovery.MigProfile).
	Start int
}

// String returns the encoded device name.
func (n Name) String() string {
	switch n.Kind {
	case KindMIG:
		return MIG(n.Minor, n.Profile, n.Start)
	case KindShared:
		return Shared(n.Minor)
	default:
		return GPU(n.Minor)
	}
}

// GPU is the name of the whole GPU with this minor number.
func GPU(minor int) string { return "gpu-" + strconv.Itoa(minor) }

// Shared is the name of the shared (fractional) device of a GPU.
func Shared(minor int) string { return GPU(minor) + "-shared" }

// MIG is the name of the MIG device of profile at placement start on a GPU.
func MIG(minor int, profile string, start int) string {
	return GPU(minor) + "-mig-" + EncodeProfile(profile) + "-" + strconv.Itoa(start)
}

var separators = map[byte]string{'.': "-", '+': "--", '-': "---", ',': "----"}
var hyphenRuns = map[int]byte{1: '.', 2: '+', 3: '-', 4: ','}

// EncodeProfile turns a MIG profile name into its DNS-label form.
func EncodeProfile(profile string) string {
	var b strings.Builder
	for i := 0; i < len(profile); i++ {
		c := profile[i]
		if s, ok := separators[c]; ok {
			b.WriteString(s)
			continue
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// DecodeProfile reverses EncodeProfile.
func DecodeProfile(encoded string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(encoded); {
		if encoded[i] != '-' {
			c := encoded[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
				return "", fmt.Errorf("profile %q: unexpected character %q", encoded, c)
			}
			b.WriteByte(c)
			i++
			continue
		}
		j := i
		for j < len(encoded) && encoded[j] == '-' {
			j++
		}
		sep, ok := hyphenRuns[j-i]
		if !ok || i == 0 || j == len(encoded) {
			return "", fmt.Errorf("profile %q: bad separator at offset %d", encoded, i)
		}
		b.WriteByte(sep)
		i = j
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("empty profile")
	}
	return b.String(), nil
}

// Parse decodes a device name published by tessera.
func Parse(name string) (Name, error) {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return Name{}, fmt.Errorf("device name %q: %s", name, strings.Join(errs, "; "))
	}
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return Name{}, fmt.Errorf("device name %q: does not start with \"gpu-\"", name)
	}
	minorStr, suffix, _ := strings.Cut(rest, "-")
	minor, err := parseNumber(minorStr)
	if err != nil {
		return Name{}, fmt.Errorf("device name %q: minor number: %w", name, err)
	}
	switch {
	case suffix == "" && !strings.HasSuffix(rest, "-"):
		return Name{Kind: KindGPU, Minor: minor}, nil
	case suffix == "shared":
		return Name{Kind: KindShared, Minor: minor}, nil
	case strings.HasPrefix(suffix, "mig-"):
		body := strings.TrimPrefix(suffix, "mig-")
		cut := strings.LastIndexByte(body, '-')
		// The start is separated by exactly one hyphen: a longer run would
		// belong to the profile.
		if cut <= 0 || body[cut-1] == '-' {
			return Name{}, fmt.Errorf("device name %q: want gpu-<minor>-mig-<profile>-<start>", name)
		}
		start, err := parseNumber(body[cut+1:])
		if err != nil {
			return Name{}, fmt.Errorf("device name %q: placement start: %w", name, err)
		}
		profile, err := DecodeProfile(body[:cut])
		if err != nil {
			return Name{}, fmt.Errorf("device name %q: %w", name, err)
		}
		return Name{Kind: KindMIG, Minor: minor, Profile: profile, Start: start}, nil
	default:
		return Name{}, fmt.Errorf("device name %q: unknown suffix %q (want none, \"shared\" or \"mig-<profile>-<start>\")", name, suffix)
	}
}

func parseNumber(s string) (int, error) {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%q is not a canonical decimal number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative number", s)
	}
	return n, nil
}
