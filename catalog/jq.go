package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"

	"github.com/itchyny/gojq"
)

// expr is one jq expression of a definition, compiled once.
type expr struct {
	src   string
	field string
	code  *gojq.Code
}

func compileExpr(src, field string) (*expr, error) {
	q, err := gojq.Parse(src)
	if err != nil {
		return nil, &Error{Field: field, Expression: src, Err: fmt.Errorf("jq parse: %w", err)}
	}
	// No environment: a definition loaded from the cluster must not read the
	// scheduler's environment through env or $ENV.
	code, err := gojq.Compile(q, gojq.WithEnvironLoader(func() []string { return nil }))
	if err != nil {
		return nil, &Error{Field: field, Expression: src, Err: fmt.Errorf("jq compile: %w", err)}
	}
	return &expr{src: src, field: field, code: code}, nil
}

func compileOptional(src *string, field string) (*expr, error) {
	if src == nil || *src == "" {
		return nil, nil
	}
	return compileExpr(*src, field)
}

// errNullIteration is what jq reports for `.missing[]`. The format treats a missing
// field as null rather than an error; iterating a missing list is treated the same
// way (no values), so that definitions written for other consumers, which tolerate
// it, map objects that leave optional lists out.
const errNullIteration = "cannot iterate over: null"

// all returns every value the expression yields on v (which must be normalized).
func (e *expr) all(ctx context.Context, v any) (out []any, err error) {
	defer func() {
		// gojq panics on values of types it does not know; input is normalized, so
		// this is a defect, but a bad workload must never crash the scheduler.
		if r := recover(); r != nil {
			out, err = nil, e.wrap(fmt.Errorf("jq evaluation panicked: %v", r))
		}
	}()
	iter := e.code.RunWithContext(ctx, v)
	for {
		x, ok := iter.Next()
		if !ok {
			return out, nil
		}
		if xerr, isErr := x.(error); isErr {
			var halt *gojq.HaltError
			if errors.As(xerr, &halt) && halt.Value() == nil {
				return out, nil
			}
			if xerr.Error() == errNullIteration {
				return out, nil
			}
			return nil, e.wrap(xerr)
		}
		out = append(out, x)
		if len(out) > maxValues {
			return nil, e.wrap(fmt.Errorf("yields more than %d values", maxValues))
		}
	}
}

// maxValues bounds what one expression may yield, so that a hostile definition or
// object (`range(1e9)`) cannot exhaust memory.
const maxValues = 10000

// first returns the first value (nil when none).
func (e *expr) first(ctx context.Context, v any) (any, error) {
	if e == nil {
		return nil, nil
	}
	vals, err := e.all(ctx, v)
	if err != nil || len(vals) == 0 {
		return nil, err
	}
	return vals[0], nil
}

func (e *expr) wrap(err error) error {
	return &Error{Field: e.field, Expression: e.src, Err: err}
}

// normalize converts a decoded object (unstructured content uses int64) into the
// value types gojq accepts. It copies only the maps and slices on the way to a
// value it must convert, so results may share structure with the input: neither
// is ever modified.
func normalize(v any) any {
	out, _ := norm(v)
	return out
}

func norm(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		var out map[string]any
		for k, e := range x {
			ne, changed := norm(e)
			drop := k == "managedFields" // server-side apply bookkeeping: large, never read
			if !changed && !drop {
				continue
			}
			if out == nil {
				out = make(map[string]any, len(x))
				for k2, e2 := range x {
					out[k2] = e2
				}
			}
			if drop {
				delete(out, k)
			} else {
				out[k] = ne
			}
		}
		if out != nil {
			return out, true
		}
		return x, false
	case []any:
		var out []any
		for i, e := range x {
			ne, changed := norm(e)
			if !changed {
				continue
			}
			if out == nil {
				out = make([]any, len(x))
				copy(out, x)
			}
			out[i] = ne
		}
		if out != nil {
			return out, true
		}
		return x, false
	case nil, bool, string, float64, int:
		return x, false
	case int64:
		return int(x), true
	case int32:
		return int(x), true
	case uint64:
		if x > math.MaxInt64 {
			return float64(x), true
		}
		return int(x), true
	case float32:
		return float64(x), true
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return int(i), true
		}
		f, _ := x.Float64()
		return f, true
	default:
		// Anything else (a typed struct) goes through JSON.
		b, err := json.Marshal(x)
		if err != nil {
			return nil, true
		}
		var out any
		if json.Unmarshal(b, &out) != nil {
			return nil, true
		}
		return normalize(out), true
	}
}

// labelRefRE finds `labels["key"]`, `labels.key` and the same for annotations in a
// pod-side expression; gang splitting compares the keys that selectors and
// groupByKeyPaths read.
var labelRefRE = regexp.MustCompile(`(labels|annotations)(?:\[\s*"([^"]+)"\s*\]|\.([A-Za-z_][A-Za-z0-9_]*))`)

func referencedKeys(src string) []string {
	var keys []string
	for _, m := range labelRefRE.FindAllStringSubmatch(src, -1) {
		k := m[2]
		if k == "" {
			k = m[3]
		}
		keys = append(keys, m[1]+"/"+k)
	}
	return keys
}
