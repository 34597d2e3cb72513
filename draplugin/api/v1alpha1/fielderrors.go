package v1alpha1

import (
	"encoding/json"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Field paths of quantities. resource.Quantity's own JSON decoding fails
// with an error that names no field ("quantities must match the regular
// expression …"), so when decoding fails, badQuantity looks for the
// quantity that failed and names it. A map field ends in "*": each of its
// values is a quantity.
var (
	tesseraQuantities = [][]string{{"sharing", "mps", "pinnedDeviceMemoryLimit"}}
	nvidiaQuantities  = [][]string{
		{"sharing", "mpsConfig", "defaultPinnedDeviceMemoryLimit"},
		{"sharing", "mpsConfig", "defaultPerDevicePinnedMemoryLimit", "*"},
	}
)

// badQuantity returns a field error for the first value at one of paths in
// the JSON object data that is not a quantity, nil when there is none.
func badQuantity(data []byte, paths [][]string) *field.Error {
	var doc map[string]any
	if json.Unmarshal(data, &doc) != nil {
		return nil
	}
	for _, path := range paths {
		if err := walkQuantity(doc, path, nil); err != nil {
			return err
		}
	}
	return nil
}

func walkQuantity(v any, rest []string, at *field.Path) *field.Error {
	if len(rest) == 0 {
		var s string
		switch q := v.(type) {
		case string:
			s = q
		case json.Number:
			s = q.String()
		case float64:
			return nil // encoding/json's number: Quantity reads it
		default:
			return field.Invalid(at, v, "must be a quantity such as 10Gi")
		}
		if _, err := resource.ParseQuantity(s); err != nil {
			return field.Invalid(at, s, "must be a quantity such as 10Gi (digits and a unit suffix, nothing else)")
		}
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil // not an object: the decoder's own error names it
	}
	child := func(k string) *field.Path {
		if at == nil {
			return field.NewPath(k)
		}
		return at.Child(k)
	}
	if rest[0] == "*" {
		for k, val := range m {
			if err := walkQuantity(val, rest[1:], at.Key(k)); err != nil {
				return err
			}
		}
		return nil
	}
	for k, val := range m {
		// encoding/json matches field names without regard to case.
		if strings.EqualFold(k, rest[0]) {
			if err := walkQuantity(val, rest[1:], child(rest[0])); err != nil {
				return err
			}
		}
	}
	return nil
}

// nvidiaPaths renames the fields of tessera's types in errs to the fields
// of NVIDIA's configs they were converted from, so that an error about an
// NVIDIA config names the field its author wrote.
var nvidiaPaths = []struct{ tessera, nvidia string }{
	{"sharing.mps.activeThreadPercentage", "sharing.mpsConfig.defaultActiveThreadPercentage"},
	{"sharing.mps.pinnedDeviceMemoryLimit", "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"},
	{"sharing.mps", "sharing.mpsConfig"},
	{"sharing.timeSlicing.interval", "sharing.timeSlicingConfig.interval"},
	{"sharing.timeSlicing", "sharing.timeSlicingConfig"},
}

func toNVIDIAPaths(errs field.ErrorList) field.ErrorList {
	for _, e := range errs {
		for _, p := range nvidiaPaths {
			if e.Field == p.tessera || strings.HasPrefix(e.Field, p.tessera+".") {
				e.Field = p.nvidia + strings.TrimPrefix(e.Field, p.tessera)
				break
			}
		}
	}
	return errs
}
