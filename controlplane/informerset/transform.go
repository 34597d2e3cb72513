package informerset

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"
)

// The ResourceSlice informer holds every device of the cluster: on 5,000 nodes of eight
// dynamic-MIG GPUs that is 600,000 devices, most of the scheduler's heap
// (docs/benchmarks.md). A slice decoded from the API server has every string and every
// small value allocated on its own, although most are the same across devices and nodes:
// attribute names, device names (gpu-0-mig-1g-10gb-0 on every node), product and driver
// versions, capacity maps of a MIG profile, the counters a placement consumes.
//
// SliceTransform makes the informer's copy share them, so that the cache holds each distinct
// value once; nothing a reader can see changes (TestSliceTransformKeepsEverything compares
// every field before and after): the same devices with the same attributes, capacities and
// counters, in the same order. What is dropped is managedFields only, which no reader of the
// set reads (the snapshot, the allocator, the filters, the slice tracker and the shadow read
// spec, name, UID and resourceVersion).
//
// Sharing is safe because informer objects are read-only for every reader (client-go's
// contract; the tracker deep-copies a slice before it adds taints, the snapshot copies the
// slice struct before it restricts its devices). Interning:
//   - strings (attribute names, device and counter-set names, driver, pool, node);
//   - the pointers of attribute values (*string, *int64, *bool);
//   - whole capacity maps, counter maps and counter consumptions.
//   - whole attribute maps: the devices of one MIG profile on one GPU carry the same
//     attributes (slices.MaxDynamicMIGAttributes), so a GPU's 25 dynamic MIG devices hold 7.
// Each through a table keyed by content. The tables hold what they intern, so each is bounded
// (maxInterned entries, then emptied): on a real cluster they hold a few hundred values per
// GPU model, MIG profile and placement, plus node names and GPU UUIDs (about 50,000 at 5,000
// nodes); a table emptied only loses sharing with values seen before, never correctness.

// maxInterned bounds each content-keyed table of a SliceTransform.
const maxInterned = 1 << 16

// maxInternedAttributes bounds the table of attribute maps, whose keys are long (about
// 500 bytes for a MIG device). Equal maps are those of one GPU, published together in one
// slice, so a small table shares as much as a large one.
const maxInternedAttributes = 1 << 12

// SliceTransform is a cache.TransformFunc for ResourceSlice informers (any other object is
// returned as it is). It is safe for concurrent use and idempotent.
type SliceTransform struct {
	mu        sync.Mutex
	names     table[string]
	strs      table[*string]
	ints      table[*int64]
	bools     [2]*bool
	attrs     table[map[resourceapi.QualifiedName]resourceapi.DeviceAttribute]
	capacity  table[map[resourceapi.QualifiedName]resourceapi.DeviceCapacity]
	counters  table[map[string]resourceapi.Counter]
	consumers table[[]resourceapi.DeviceCounterConsumption]
	key       strings.Builder
}

// table is a bounded content-keyed intern table.
type table[T any] map[string]T

func (t *table[T]) get(key string, v T) T { return t.getMax(key, v, maxInterned) }

// getMax is get with a table of at most limit entries.
func (t *table[T]) getMax(key string, v T, limit int) T {
	if old, ok := (*t)[key]; ok {
		return old
	}
	if *t == nil || len(*t) >= limit {
		*t = table[T]{}
	}
	(*t)[key] = v
	return v
}

// NewSliceTransform returns a transform with empty tables.
func NewSliceTransform() *SliceTransform {
	t := &SliceTransform{}
	t.bools = [2]*bool{new(bool), new(bool)}
	*t.bools[1] = true
	return t
}

// Func is the transform for cache.SharedIndexInformer.SetTransform.
func (t *SliceTransform) Func() cache.TransformFunc {
	return func(obj any) (any, error) {
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			t.Slice(s)
		}
		return obj, nil
	}
}

// Slice transforms s in place.
func (t *SliceTransform) Slice(s *resourceapi.ResourceSlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.ManagedFields = nil
	s.Spec.Driver = t.intern(s.Spec.Driver)
	s.Spec.Pool.Name = t.intern(s.Spec.Pool.Name)
	s.Spec.NodeName = t.str(s.Spec.NodeName)
	for i := range s.Spec.SharedCounters {
		cs := &s.Spec.SharedCounters[i]
		cs.Name = t.intern(cs.Name)
		cs.Counters = t.counterMap(cs.Counters)
	}
	for i := range s.Spec.Devices {
		t.device(&s.Spec.Devices[i])
	}
}

// intern returns the table's copy of s. (Package unique does not serve: its table lets a
// value go once no Handle is left, and the objects keep the string, not the Handle.)
func (t *SliceTransform) intern(s string) string { return t.names.get(s, s) }

func (t *SliceTransform) device(d *resourceapi.Device) {
	d.Name = t.intern(d.Name)
	d.NodeName = t.str(d.NodeName)
	if d.Attributes != nil {
		if shared, ok := t.attrs[t.attributesKey(d.Attributes)]; ok {
			d.Attributes = shared
		} else {
			key := t.key.String()
			attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
			for k, a := range d.Attributes {
				a.StringValue = t.str(a.StringValue)
				a.VersionValue = t.str(a.VersionValue)
				a.IntValue = t.int(a.IntValue)
				a.BoolValue = t.bool(a.BoolValue)
				attrs[resourceapi.QualifiedName(t.intern(string(k)))] = a
			}
			d.Attributes = t.attrs.getMax(key, attrs, maxInternedAttributes)
		}
	}
	if d.Capacity != nil {
		d.Capacity = t.capacity.get(t.capacityKey(d.Capacity), d.Capacity)
	}
	if d.ConsumesCounters != nil {
		for i := range d.ConsumesCounters {
			c := &d.ConsumesCounters[i]
			c.CounterSet = t.intern(c.CounterSet)
			c.Counters = t.counterMap(c.Counters)
		}
		t.key.Reset()
		for _, c := range d.ConsumesCounters {
			t.name(c.CounterSet)
			t.key.WriteByte('{')
			t.counterKey(c.Counters)
			t.key.WriteByte('}')
		}
		// A nil and an empty list differ for a reader that serializes; keep them apart.
		t.key.WriteString(strconv.Itoa(len(d.ConsumesCounters)))
		d.ConsumesCounters = t.consumers.get(t.key.String(), d.ConsumesCounters)
	}
}

func (t *SliceTransform) str(p *string) *string {
	if p == nil {
		return nil
	}
	return t.strs.get(*p, p)
}

func (t *SliceTransform) int(p *int64) *int64 {
	if p == nil {
		return nil
	}
	return t.ints.get(strconv.FormatInt(*p, 10), p)
}

func (t *SliceTransform) bool(p *bool) *bool {
	if p == nil {
		return nil
	}
	if *p {
		return t.bools[1]
	}
	return t.bools[0]
}

func (t *SliceTransform) counterMap(m map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	if m == nil {
		return nil
	}
	t.key.Reset()
	t.counterKey(m)
	return t.counters.get(t.key.String(), m)
}

// counterKey writes m's content (names sorted) to t.key.
func (t *SliceTransform) counterKey(m map[string]resourceapi.Counter) {
	for _, k := range sortedKeys(m) {
		c := m[k]
		t.name(k)
		t.quantity(&c.Value)
		t.key.WriteByte(';')
	}
	if len(m) == 0 {
		t.key.WriteByte('0') // an empty map is not nil
	}
}

// attributesKey writes m's content (names sorted, each value with its kind, lists with
// their length) to t.key and returns it. The map itself is the largest part of a device
// (slices.MaxDynamicMIGAttributes); the devices of one MIG profile on one GPU have equal
// maps, and share one.
func (t *SliceTransform) attributesKey(m map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) string {
	t.key.Reset()
	for _, k := range sortedKeys(m) {
		a := m[k]
		t.name(string(k))
		if a.IntValue != nil {
			t.key.WriteString("i" + strconv.FormatInt(*a.IntValue, 10) + ";")
		}
		if a.BoolValue != nil {
			t.key.WriteString("b" + strconv.FormatBool(*a.BoolValue) + ";")
		}
		if a.StringValue != nil {
			t.key.WriteByte('s')
			t.name(*a.StringValue)
		}
		if a.VersionValue != nil {
			t.key.WriteByte('v')
			t.name(*a.VersionValue)
		}
		// A nil and an empty list differ for a reader that serializes; keep them apart.
		if a.IntValues != nil {
			t.key.WriteString("I" + strconv.Itoa(len(a.IntValues)))
			for _, v := range a.IntValues {
				t.key.WriteString("," + strconv.FormatInt(v, 10))
			}
		}
		if a.BoolValues != nil {
			t.key.WriteString("B" + strconv.Itoa(len(a.BoolValues)))
			for _, v := range a.BoolValues {
				t.key.WriteString("," + strconv.FormatBool(v))
			}
		}
		if a.StringValues != nil {
			t.key.WriteString("S" + strconv.Itoa(len(a.StringValues)))
			for _, v := range a.StringValues {
				t.name(v)
			}
		}
		if a.VersionValues != nil {
			t.key.WriteString("V" + strconv.Itoa(len(a.VersionValues)))
			for _, v := range a.VersionValues {
				t.name(v)
			}
		}
		t.key.WriteByte('|')
	}
	if len(m) == 0 {
		t.key.WriteByte('0') // an empty map is not nil
	}
	return t.key.String()
}

func (t *SliceTransform) capacityKey(m map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) string {
	t.key.Reset()
	for _, k := range sortedKeys(m) {
		c := m[k]
		t.name(string(k))
		t.quantity(&c.Value)
		if p := c.RequestPolicy; p != nil {
			t.key.WriteString("{d")
			t.optQuantity(p.Default)
			t.key.WriteString("v")
			if p.ValidValues != nil {
				t.key.WriteString(strconv.Itoa(len(p.ValidValues)))
			}
			for i := range p.ValidValues {
				t.key.WriteByte(',')
				t.quantity(&p.ValidValues[i])
			}
			if r := p.ValidRange; r != nil {
				t.key.WriteString("r")
				t.optQuantity(r.Min)
				t.optQuantity(r.Max)
				t.optQuantity(r.Step)
			}
			t.key.WriteByte('}')
		}
		t.key.WriteByte(';')
	}
	if len(m) == 0 {
		t.key.WriteByte('0')
	}
	return t.key.String()
}

// name writes a length-prefixed name, so that no name can be taken for the next field.
func (t *SliceTransform) name(n string) {
	t.key.WriteString(strconv.Itoa(len(n)))
	t.key.WriteByte(':')
	t.key.WriteString(n)
}

// quantity writes q as its String(): two quantities with the same string are the same value
// in the same format, and serialize the same. String caches its result in the quantity, so
// it is called on a copy: the object stays as it was decoded.
func (t *SliceTransform) quantity(q *resource.Quantity) {
	c := *q
	t.key.WriteString(c.String())
}

func (t *SliceTransform) optQuantity(q *resource.Quantity) {
	if q == nil {
		t.key.WriteString("-")
		return
	}
	t.key.WriteByte('(')
	t.quantity(q)
	t.key.WriteByte(')')
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
