package solver

import (
	"fmt"
	"sort"
	"strings"
)

// Topology keeps a gang within topology domains: nodes that share the values of node labels.
// A topology has ordered levels, broadest first (block > rack > host). A gang may require a
// level — all its pods in one domain of it — and prefer a narrower one: placed in one domain
// of it if it fits there, else on as few of its domains as possible.
type Topology struct {
	// Key and Required are the one-level form: a gang kept in one domain of Key, always
	// (Required) or if it fits (preferred). Used when RequiredKeys and PreferredKey are
	// empty.
	Key      string
	Required bool
	// Levels are the topology's node label keys, broadest first. They order the levels
	// between the required and the preferred one when a gang spans several domains. Empty:
	// the solver's TopologyKeys.
	Levels []string
	// RequiredKeys: the gang's pods all share each of these labels' values (one domain of
	// each; the upstream PodGroup may name several).
	RequiredKeys []string
	// PreferredKey: the gang should stay within one domain of this label.
	PreferredKey string
}

// constraint is a gang's topology in one form: levels broadest first, the required keys and
// the preferred key (each may be empty).
type constraint struct {
	levels    []string
	required  []string
	preferred string
}

// constraintOf turns the gang's topology (or, without one, the configured keys: the most
// specific one preferred) into one form.
func (st *search) constraintOf() constraint {
	cfgLevels := make([]string, 0, len(st.s.cfg.TopologyKeys))
	for i := len(st.s.cfg.TopologyKeys) - 1; i >= 0; i-- {
		cfgLevels = append(cfgLevels, st.s.cfg.TopologyKeys[i])
	}
	t := st.gang.Topology
	if t == nil {
		c := constraint{levels: cfgLevels}
		if len(cfgLevels) > 0 {
			c.preferred = cfgLevels[len(cfgLevels)-1]
		}
		return c
	}
	c := constraint{levels: t.Levels, required: t.RequiredKeys, preferred: t.PreferredKey}
	if len(c.levels) == 0 {
		c.levels = cfgLevels
	}
	if len(c.required) == 0 && c.preferred == "" && t.Key != "" {
		if t.Required {
			c.required = []string{t.Key}
		} else {
			c.preferred = t.Key
		}
	}
	for _, r := range c.required {
		if r == c.preferred {
			c.preferred = "" // one domain is required anyway
		}
	}
	return c
}

type plan struct {
	domain string
	nodes  []int
}

// domainStat is one domain of the required level, for the message of a gang that fits none.
type domainStat struct {
	name string
	free float64
}

// domainPlans lists the node sets to search, in order. With a required level, each of its
// domains in turn (those with enough free GPU units first, the smallest of them first: best
// fit; then the others, largest first), never the whole cluster. Within a domain (or the
// whole cluster without a required level), a preferred level is tried domain by domain (best
// fit, up to four that have room), then the whole set with its nodes grouped by the levels
// from the required one down to the preferred one, largest domain first, so that the search
// fills as few domains as possible. Nodes the gang must avoid (reserved for another gang) are
// left out.
func (st *search) domainPlans() []plan {
	c := st.constraintOf()
	all := st.sortNodes(nil)
	if len(st.gang.Avoid) > 0 {
		kept := all[:0:0]
		for _, ni := range all {
			if !st.gang.Avoid[st.snap.Nodes[ni].Name()] {
				kept = append(kept, ni)
			}
		}
		all = kept
	}
	need := 0.0
	for _, p := range st.pods {
		need += p.gpuNeed
	}
	st.requiredLevel, st.requiredDomains = "", nil
	if len(c.required) == 0 {
		return st.within(all, "", c, -1, need)
	}
	st.requiredLevel = strings.Join(c.required, ",")
	names, domains, free := st.group(all, func(ni int) (string, bool) {
		vals := make([]string, 0, len(c.required))
		for _, k := range c.required {
			v, ok := st.snap.Nodes[ni].Node.Labels[k]
			if !ok {
				return "", false
			}
			vals = append(vals, k+"="+v)
		}
		return strings.Join(vals, ","), true
	})
	bestFit(names, free, need)
	for _, n := range names {
		st.requiredDomains = append(st.requiredDomains, domainStat{name: n, free: free[n]})
	}
	// Levels narrower than the narrowest required one group the nodes inside a domain.
	from := -1
	for i, l := range c.levels {
		for _, r := range c.required {
			if l == r {
				from = max(from, i)
			}
		}
	}
	var plans []plan
	for _, d := range names {
		plans = append(plans, st.within(domains[d], d, c, from, need)...)
	}
	return plans
}

// within plans the search inside one node set (nodes already in packing order).
func (st *search) within(nodes []int, name string, c constraint, from int, need float64) []plan {
	if c.preferred == "" {
		return []plan{{domain: name, nodes: nodes}}
	}
	names, domains, free := st.group(nodes, func(ni int) (string, bool) {
		v, ok := st.snap.Nodes[ni].Node.Labels[c.preferred]
		return c.preferred + "=" + v, ok
	})
	bestFit(names, free, need)
	var plans []plan
	for i, d := range names {
		if i >= 4 || free[d] < need {
			break // a preferred level is tried in a few domains with room, then given up
		}
		plans = append(plans, plan{domain: joinDomain(name, d), nodes: domains[d]})
	}
	// The gang does not fit (or was not placed) in one preferred domain: as few as possible.
	to := -1
	for i, l := range c.levels {
		if l == c.preferred {
			to = i
		}
	}
	group := []string{c.preferred}
	if to >= 0 {
		group = c.levels[from+1 : to+1]
	}
	plans = append(plans, plan{domain: name, nodes: st.groupedOrder(nodes, group)})
	return plans
}

func joinDomain(outer, inner string) string {
	if outer == "" {
		return inner
	}
	return outer + "," + inner
}

// group splits nodes (keeping their order) by a domain function; nodes without a domain are
// left out.
func (st *search) group(nodes []int, domainOf func(int) (string, bool)) ([]string, map[string][]int, map[string]float64) {
	domains := map[string][]int{}
	free := map[string]float64{}
	var names []string
	for _, ni := range nodes {
		d, ok := domainOf(ni)
		if !ok {
			continue
		}
		if _, seen := domains[d]; !seen {
			names = append(names, d)
		}
		domains[d] = append(domains[d], ni)
		free[d] += st.snap.Nodes[ni].GPUFree()
	}
	return names, domains, free
}

// bestFit orders domains: those with room for need first, the smallest of them first; then
// the others, largest first; names break ties.
func bestFit(names []string, free map[string]float64, need float64) {
	sort.SliceStable(names, func(a, b int) bool {
		fa, fb := free[names[a]] >= need, free[names[b]] >= need
		if fa != fb {
			return fa
		}
		if free[names[a]] != free[names[b]] {
			if fa {
				return free[names[a]] < free[names[b]]
			}
			return free[names[a]] > free[names[b]]
		}
		return names[a] < names[b]
	})
}

// groupedOrder orders nodes by their domains at each of the levels (broadest first), the
// domain with the most free GPU units first at every level, then in packing order: a
// depth-first search over this order fills as few domains as it can. Nodes lacking a level's
// label come after those that have it.
func (st *search) groupedOrder(nodes []int, levels []string) []int {
	pos := make(map[int]int, len(nodes))
	for i, ni := range nodes {
		pos[ni] = i
	}
	// Free GPU units per domain, a domain named by its values down to that level.
	free := map[string]float64{}
	path := func(ni int, depth int) string {
		var b strings.Builder
		for _, l := range levels[:depth+1] {
			v, ok := st.snap.Nodes[ni].Node.Labels[l]
			if !ok {
				v = "\x00" // no label: a domain of its own, last
			}
			b.WriteString(v)
			b.WriteByte('/')
		}
		return b.String()
	}
	for _, ni := range nodes {
		for d := range levels {
			free[path(ni, d)] += st.snap.Nodes[ni].GPUFree()
		}
	}
	out := append([]int(nil), nodes...)
	sort.SliceStable(out, func(a, b int) bool {
		na, nb := out[a], out[b]
		for d := range levels {
			pa, pb := path(na, d), path(nb, d)
			if pa == pb {
				continue
			}
			la, lb := strings.Contains(pa, "\x00"), strings.Contains(pb, "\x00")
			if la != lb {
				return lb
			}
			if free[pa] != free[pb] {
				return free[pa] > free[pb]
			}
			return pa < pb
		}
		return pos[na] < pos[nb]
	})
	return out
}

// explainTopology says, for a gang that did not fit, which level held it back and the
// largest free domain of it, in numbers.
func (st *search) explainTopology(plans []plan) string {
	if st.requiredLevel != "" {
		if len(st.requiredDomains) == 0 {
			return fmt.Sprintf("; no node has the required topology label %s", st.requiredLevel)
		}
		largest := st.requiredDomains[0]
		for _, d := range st.requiredDomains[1:] {
			if d.free > largest.free || (d.free == largest.free && d.name < largest.name) {
				largest = d
			}
		}
		return fmt.Sprintf("; largest topology domain %s has %g free (required level %s, %d domains)", largest.name, largest.free, st.requiredLevel, len(st.requiredDomains))
	}
	var largest float64
	var largestName string
	for _, pl := range plans {
		if pl.domain == "" {
			continue
		}
		f := 0.0
		for _, ni := range pl.nodes {
			f += st.snap.Nodes[ni].GPUFree()
		}
		if f > largest || largestName == "" {
			largest, largestName = f, pl.domain
		}
	}
	if largestName != "" {
		return fmt.Sprintf("; largest topology domain %s has %g free", largestName, largest)
	}
	return ""
}
