package lint

import (
	"strings"

	"github.com/itchyny/gojq"
)

// A path is the sequence of object keys an expression reads: a field name, "[]"
// for an element of an array (or a value of a map), "*" for any key of a map.
type path []string

func (p path) String() string {
	var b strings.Builder
	for _, s := range p {
		switch s {
		case "[]":
			b.WriteString("[]")
		case "*":
			b.WriteString("[*]")
		default:
			if isIdent(s) {
				b.WriteString("." + s)
			} else {
				b.WriteString(`["` + s + `"]`)
			}
		}
	}
	if b.Len() == 0 {
		return "."
	}
	return b.String()
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9' {
			continue
		}
		return false
	}
	return true
}

// val is what the walker knows about a value: the paths it may come from.
// An empty set means "not a path of the object" (a literal, a computed value).
type val []path

// walker follows a jq query symbolically, recording every object path it reads.
// It is conservative: where it cannot tell what a value is, it stops tracking it
// rather than guessing, so it reports no path that the query does not read.
type walker struct {
	used  map[string]path
	funcs map[string]*gojq.FuncDef
	depth int
}

// readPaths returns the object paths a jq expression reads.
func readPaths(src string) ([]path, error) {
	q, err := gojq.Parse(src)
	if err != nil {
		return nil, err
	}
	w := &walker{used: map[string]path{}, funcs: map[string]*gojq.FuncDef{}}
	w.query(q, val{path{}}, map[string]val{})
	out := make([]path, 0, len(w.used))
	for _, p := range w.used {
		out = append(out, p)
	}
	return out, nil
}

func (w *walker) record(v val) {
	for _, p := range v {
		if len(p) > 0 && !strings.HasPrefix(p[len(p)-1], "{") {
			w.used[p.String()] = p
		}
	}
}

func extend(v val, seg string) val {
	out := make(val, 0, len(v))
	for _, p := range v {
		n := make(path, len(p), len(p)+1)
		copy(n, p)
		// .value of a to_entries element is the map's value: any key.
		if len(n) > 0 && n[len(n)-1] == "{entry}" {
			if seg == "value" {
				n[len(n)-1] = "*"
				out = append(out, n)
			}
			continue
		}
		if len(n) > 0 && n[len(n)-1] == "{entries}" {
			if seg == "[]" {
				n[len(n)-1] = "{entry}"
				out = append(out, n)
			}
			continue
		}
		out = append(out, append(n, seg))
	}
	return out
}

func (w *walker) query(q *gojq.Query, in val, env map[string]val) val {
	if q == nil {
		return nil
	}
	w.depth++
	defer func() { w.depth-- }()
	if w.depth > 200 {
		return nil
	}
	if len(q.FuncDefs) > 0 {
		for _, fd := range q.FuncDefs {
			w.funcs[fd.Name] = fd
		}
	}
	if len(q.Patterns) > 0 {
		// TERM as $x | BODY: BODY runs on the same input, with $x bound.
		var bound val
		if q.Term != nil {
			bound = w.term(q.Term, in, env)
		} else {
			bound = w.query(q.Left, in, env)
		}
		env2 := make(map[string]val, len(env)+1)
		for k, v := range env {
			env2[k] = v
		}
		for _, p := range q.Patterns {
			if p.Name != "" {
				env2[p.Name] = bound
			}
		}
		return w.query(q.Right, in, env2)
	}
	if q.Term != nil {
		return w.term(q.Term, in, env)
	}
	switch q.Op {
	case gojq.OpPipe:
		return w.query(q.Right, w.query(q.Left, in, env), env)
	case gojq.OpComma, gojq.OpAlt:
		return append(w.query(q.Left, in, env), w.query(q.Right, in, env)...)
	default:
		w.query(q.Left, in, env)
		w.query(q.Right, in, env)
		return nil
	}
}

func (w *walker) term(t *gojq.Term, in val, env map[string]val) val {
	var v val
	switch t.Type {
	case gojq.TermTypeIdentity:
		v = in
	case gojq.TermTypeIndex:
		v = w.index(in, t.Index, env)
	case gojq.TermTypeFunc:
		v = w.fn(t.Func, in, env)
	case gojq.TermTypeQuery:
		v = w.query(t.Query, in, env)
	case gojq.TermTypeObject:
		for _, kv := range t.Object.KeyVals {
			w.query(kv.KeyQuery, in, env)
			w.query(kv.Val, in, env)
			if kv.Val == nil && kv.Key != "" && !strings.HasPrefix(kv.Key, "$") {
				// {foo} is {foo: .foo}.
				w.record(extend(in, kv.Key))
			}
		}
	case gojq.TermTypeArray:
		w.query(t.Array.Query, in, env)
	case gojq.TermTypeIf:
		w.query(t.If.Cond, in, env)
		v = append(v, w.query(t.If.Then, in, env)...)
		for _, e := range t.If.Elif {
			w.query(e.Cond, in, env)
			v = append(v, w.query(e.Then, in, env)...)
		}
		if t.If.Else != nil {
			v = append(v, w.query(t.If.Else, in, env)...)
		} else {
			v = append(v, in...)
		}
	case gojq.TermTypeTry:
		v = w.query(t.Try.Body, in, env)
		w.query(t.Try.Catch, nil, env)
	case gojq.TermTypeReduce:
		w.query(t.Reduce.Query, in, env)
	case gojq.TermTypeForeach:
		w.query(t.Foreach.Query, in, env)
	case gojq.TermTypeUnary:
		w.term(t.Unary.Term, in, env)
	case gojq.TermTypeString, gojq.TermTypeFormat:
		if t.Str != nil {
			for _, sq := range t.Str.Queries {
				w.query(sq, in, env)
			}
		}
	}
	for _, s := range t.SuffixList {
		switch {
		case s.Index != nil:
			v = w.index(v, s.Index, env)
		case s.Iter:
			v = extend(v, "[]")
			w.record(v)
		}
	}
	return v
}

func (w *walker) index(in val, idx *gojq.Index, env map[string]val) val {
	var out val
	switch {
	case idx.Name != "":
		out = extend(in, idx.Name)
	case idx.Str != nil && len(idx.Str.Queries) == 0:
		out = extend(in, idx.Str.Str)
	case idx.IsSlice:
		w.query(idx.Start, nil, env)
		w.query(idx.End, nil, env)
		out = in
	case idx.Start != nil:
		// .[n] on an array; a computed key on a map.
		k := idx.Start.Term
		switch {
		case k != nil && k.Type == gojq.TermTypeNumber && len(k.SuffixList) == 0:
			out = extend(in, "[]")
		case k != nil && k.Type == gojq.TermTypeString && k.Str != nil && len(k.Str.Queries) == 0 && len(k.SuffixList) == 0:
			out = extend(in, k.Str.Str)
		default:
			w.query(idx.Start, nil, env)
			out = extend(in, "*")
		}
	}
	w.record(out)
	return out
}

func (w *walker) fn(f *gojq.Func, in val, env map[string]val) val {
	if strings.HasPrefix(f.Name, "$") {
		return env[f.Name]
	}
	if fd, ok := w.funcs[f.Name]; ok && len(fd.Args) == len(f.Args) {
		for _, a := range f.Args {
			w.query(a, in, env)
		}
		if w.depth > 50 {
			return nil
		}
		return w.query(fd.Body, in, env)
	}
	switch f.Name {
	case "select", "recurse_down":
		for _, a := range f.Args {
			w.query(a, in, env)
		}
		return in
	case "to_entries":
		return extend(in, "{entries}")
	case "first", "last":
		if len(f.Args) == 0 {
			v := extend(in, "[]")
			w.record(v)
			return v
		}
		return w.query(f.Args[0], in, env)
	case "map", "map_values", "any", "all", "sort_by", "group_by", "unique_by", "min_by", "max_by":
		elems := extend(in, "[]")
		for _, a := range f.Args {
			w.query(a, elems, env)
		}
		return nil
	case "empty", "not", "length", "keys", "type", "tostring", "tonumber", "ascii_downcase", "ascii_upcase", "add", "min", "max":
		return nil
	}
	for _, a := range f.Args {
		w.query(a, in, env)
	}
	return nil
}
