package selfmetrics

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Kind is the instrument type of a Metric.
type Kind int

const (
	// Counter is a monotonic sum (an observable counter): the Prometheus
	// name gets _total.
	Counter Kind = iota
	// Gauge is a value that goes up and down (an observable gauge).
	Gauge
)

func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Metric is one instrument.
type Metric struct {
	// Name is the OpenTelemetry name: dotted, lowercase, without unit or
	// _total (the Prometheus exporters add them; PromName says what they
	// make of it).
	Name string
	Kind Kind
	// Unit is UCUM: "s", "By", "1" (a ratio), or an annotation such as
	// "{record}" that Prometheus leaves out of the name.
	Unit string
	Desc string
	// Component reports the series unless a series names its own.
	Component string
	Series    []Series
}

// Series maps a component's key onto the metric.
type Series struct {
	// Key is the component's name of the value (the agent's status
	// counters key). A Key ending in "*" matches every key with that
	// prefix; the rest becomes the value of attribute Suffix.
	Key    string
	Suffix string
	// Attrs are fixed attributes, name/value pairs.
	Attrs []string
	// Scale multiplies the reported value (1e-9: ns to s); 0 means 1.
	Scale float64
	// Component overrides the metric's.
	Component string
}

func (s Series) prefix() (string, bool) { return strings.CutSuffix(s.Key, "*") }

func (s Series) component(m *Metric) string {
	if s.Component != "" {
		return s.Component
	}
	return m.Component
}

// Source reports values by key.
type Source struct {
	// Components are the components this source speaks for: their declared
	// counter series are observed from 0 when the source does not report
	// them.
	Components []string
	// Observe calls obs once per value: a key of the table, the value in
	// the component's own unit (Series.Scale converts it) and extra
	// attributes as name/value pairs.
	Observe func(obs func(key string, v float64, attrs ...string))
}

// Counters is a Source of a map of counters (the agent's status counters).
func Counters(components []string, f func() map[string]int64) Source {
	return Source{Components: components, Observe: func(obs func(string, float64, ...string)) {
		for k, v := range f() {
			obs(k, float64(v))
		}
	}}
}

type entry struct {
	m   *Metric
	s   *Series
	idx int // metric index in Table
}

type index struct {
	exact    map[string]entry
	prefixes []entry // longest first
}

var idx = buildIndex(Table)

func buildIndex(t []Metric) *index {
	ix := &index{exact: map[string]entry{}}
	for i := range t {
		m := &t[i]
		for j := range m.Series {
			e := entry{m: m, s: &m.Series[j], idx: i}
			if _, ok := e.s.prefix(); ok {
				ix.prefixes = append(ix.prefixes, e)
			} else {
				ix.exact[e.s.Key] = e
			}
		}
	}
	sort.SliceStable(ix.prefixes, func(a, b int) bool { return len(ix.prefixes[a].s.Key) > len(ix.prefixes[b].s.Key) })
	return ix
}

func (ix *index) lookup(key string) (entry, string, bool) {
	if e, ok := ix.exact[key]; ok {
		return e, "", true
	}
	for _, e := range ix.prefixes {
		p, _ := e.s.prefix()
		if rest, ok := strings.CutPrefix(key, p); ok && rest != "" {
			return e, rest, true
		}
	}
	return entry{}, "", false
}

// Lookup returns the metric and series that key is reported under.
func Lookup(key string) (Metric, Series, bool) {
	e, _, ok := idx.lookup(key)
	if !ok {
		return Metric{}, Series{}, false
	}
	return *e.m, *e.s, true
}

// Find returns the metric of that name.
func Find(name string) (Metric, bool) {
	for _, m := range Table {
		if m.Name == name {
			return m, true
		}
	}
	return Metric{}, false
}

type obsKey struct {
	inst int // index in Table; len(Table) for Undeclared
	set  attribute.Distinct
}

type obsVal struct {
	set attribute.Set
	v   float64
}

// Register creates every instrument of Table (and Undeclared) on m and one
// callback that observes srcs. Unregister the returned registration (or
// shut the MeterProvider down) to stop.
func Register(m metric.Meter, srcs ...Source) (metric.Registration, error) {
	insts := make([]metric.Float64Observable, len(Table)+1)
	for i := range Table {
		t := &Table[i]
		var err error
		switch t.Kind {
		case Counter:
			insts[i], err = m.Float64ObservableCounter(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Desc))
		case Gauge:
			insts[i], err = m.Float64ObservableGauge(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Desc))
		default:
			err = fmt.Errorf("unknown kind %v", t.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", t.Name, err)
		}
	}
	und, err := m.Float64ObservableCounter(Undeclared, metric.WithUnit("{event}"),
		metric.WithDescription("Counters of slowrank components that the self-metrics table does not declare, by name (a bug: tests fail on it)."))
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", Undeclared, err)
	}
	insts[len(Table)] = und
	obs := make([]metric.Observable, len(insts))
	for i, in := range insts {
		obs[i] = in
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		vals := collect(srcs)
		for k, v := range vals {
			o.ObserveFloat64(insts[k.inst], v.v, metric.WithAttributeSet(v.set))
		}
		return nil
	}, obs...)
}

// collect gathers one observation per series (the last one reported wins,
// so that two sources reporting the same key do not add up).
func collect(srcs []Source) map[obsKey]obsVal {
	vals := map[obsKey]obsVal{}
	put := func(inst int, kvs []attribute.KeyValue, v float64) {
		set := attribute.NewSet(kvs...)
		vals[obsKey{inst, set.Equivalent()}] = obsVal{set, v}
	}
	for _, src := range srcs {
		seen := map[string]bool{}
		src.Observe(func(key string, v float64, attrs ...string) {
			e, rest, ok := idx.lookup(key)
			if !ok {
				put(len(Table), []attribute.KeyValue{attribute.String("name", key)}, v)
				return
			}
			seen[key] = true
			kvs := make([]attribute.KeyValue, 0, len(e.s.Attrs)/2+len(attrs)/2+1)
			kvs = appendPairs(kvs, e.s.Attrs)
			if rest != "" {
				kvs = append(kvs, attribute.String(e.s.Suffix, rest))
			}
			kvs = appendPairs(kvs, attrs)
			if e.s.Scale != 0 {
				v *= e.s.Scale
			}
			put(e.idx, kvs, v)
		})
		for _, comp := range src.Components {
			for i := range Table {
				t := &Table[i]
				if t.Kind != Counter {
					continue
				}
				for j := range t.Series {
					sr := &t.Series[j]
					if _, pre := sr.prefix(); pre || seen[sr.Key] || sr.component(t) != comp {
						continue
					}
					set := attribute.NewSet(appendPairs(nil, sr.Attrs)...)
					if _, ok := vals[obsKey{i, set.Equivalent()}]; !ok {
						vals[obsKey{i, set.Equivalent()}] = obsVal{set, 0}
					}
				}
			}
		}
	}
	return vals
}

func appendPairs(kvs []attribute.KeyValue, pairs []string) []attribute.KeyValue {
	for i := 0; i+1 < len(pairs); i += 2 {
		kvs = append(kvs, attribute.String(pairs[i], pairs[i+1]))
	}
	return kvs
}

// PromName is the name the Prometheus exporters (the Collector's and the
// agent's /metrics) give the metric: dots to underscores, the unit's word
// (seconds, bytes, ratio for a gauge of unit 1), _total for a counter.
func PromName(m Metric) string {
	n := strings.ReplaceAll(m.Name, ".", "_")
	switch m.Unit {
	case "s":
		n += "_seconds"
	case "ms":
		n += "_milliseconds"
	case "By":
		n += "_bytes"
	case "1":
		if m.Kind == Gauge {
			n += "_ratio"
		}
	}
	if m.Kind == Counter {
		n += "_total"
	}
	return n
}
