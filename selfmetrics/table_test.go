package selfmetrics

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

var (
	nameRE = regexp.MustCompile(`^slowrank(\.[a-z][a-z0-9_]*)+$`)
	keyRE  = regexp.MustCompile(`^[a-z][a-z0-9_]*\*?$`)
	unitRE = regexp.MustCompile(`^(s|ms|By|1|\{[a-z_]+\})$`)
)

func TestTable(t *testing.T) {
	names, keys, prom := map[string]bool{}, map[string]bool{}, map[string]string{}
	comps := []string{Agent, Library, Outputs, Export, Forward, Aggregate, Process, Webhook}
	for _, m := range Table {
		if !nameRE.MatchString(m.Name) {
			t.Errorf("%s: not a dotted lowercase slowrank.* name", m.Name)
		}
		for _, bad := range []string{"_total", ".total", "_seconds", "_bytes", "_ns", "_ms", "_us"} {
			if strings.HasSuffix(m.Name, bad) {
				t.Errorf("%s: the unit or _total belongs in Unit and Kind, not in the name", m.Name)
			}
		}
		if names[m.Name] {
			t.Errorf("%s declared twice", m.Name)
		}
		names[m.Name] = true
		if p := PromName(m); prom[p] != "" {
			t.Errorf("%s and %s both become %s in Prometheus", prom[p], m.Name, p)
		} else {
			prom[p] = m.Name
		}
		if !unitRE.MatchString(m.Unit) {
			t.Errorf("%s: unit %q is not one of s, ms, By, 1 or {annotation}", m.Name, m.Unit)
		}
		if m.Desc == "" || !strings.HasSuffix(m.Desc, ".") {
			t.Errorf("%s: description %q should be a sentence", m.Name, m.Desc)
		}
		if m.Kind != Counter && m.Kind != Gauge {
			t.Errorf("%s: kind %v", m.Name, m.Kind)
		}
		if len(m.Series) == 0 {
			t.Errorf("%s has no series", m.Name)
		}
		var attrKeys []string
		for i, s := range m.Series {
			if !keyRE.MatchString(s.Key) {
				t.Errorf("%s: key %q", m.Name, s.Key)
			}
			if keys[s.Key] {
				t.Errorf("key %s declared twice", s.Key)
			}
			keys[s.Key] = true
			if !slices.Contains(comps, s.component(&m)) {
				t.Errorf("%s/%s: component %q", m.Name, s.Key, s.component(&m))
			}
			if len(s.Attrs)%2 != 0 {
				t.Errorf("%s/%s: attributes are name/value pairs", m.Name, s.Key)
			}
			_, pre := s.prefix()
			if pre != (s.Suffix != "") {
				t.Errorf("%s/%s: a prefix key needs Suffix and only it has one", m.Name, s.Key)
			}
			var ak []string
			for j := 0; j+1 < len(s.Attrs); j += 2 {
				ak = append(ak, s.Attrs[j])
			}
			if s.Suffix != "" {
				ak = append(ak, s.Suffix)
			}
			slices.Sort(ak)
			if i == 0 {
				attrKeys = ak
			} else if !slices.Equal(ak, attrKeys) && !(len(ak) == 0 || len(attrKeys) == 0) {
				t.Errorf("%s: series %s has attributes %v, the first one %v", m.Name, s.Key, ak, attrKeys)
			}
		}
	}
}

func TestLookup(t *testing.T) {
	for _, tt := range []struct {
		key, metric, suffix string
	}{
		{"ringbuf_lost", RecordsDropped, ""},
		{"probe_ncclAllReduce", "slowrank.agent.probe.events", "ncclAllReduce"},
		{"overhead_spent_total", "slowrank.agent.overhead.spent", "total"},
		{"detector_phase_threshold_host", "slowrank.agent.detector.threshold", "host"},
		{"detector_threshold", "slowrank.agent.detector.threshold", ""},
	} {
		e, rest, ok := idx.lookup(tt.key)
		if !ok || e.m.Name != tt.metric || rest != tt.suffix {
			t.Errorf("lookup(%s) = %v %q %v, want %s %q", tt.key, e.m, rest, ok, tt.metric, tt.suffix)
		}
	}
	if _, _, ok := Lookup("probe_"); ok {
		t.Error("a bare prefix matched")
	}
	if _, _, ok := Lookup("no_such_counter"); ok {
		t.Error("undeclared key found")
	}
}

// TestPrometheusNames registers the table on a MeterProvider read by the
// OpenTelemetry Prometheus exporter (what the agent's /metrics serves) and
// checks that each metric appears under PromName, with the zero-filled
// counters, the scale and the undeclared fallback.
func TestPrometheusNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	src := Source{Components: []string{Agent, Library, Outputs, Export, Forward, Aggregate, Process, Webhook}, Observe: func(obs func(string, float64, ...string)) {
		for _, m := range Table {
			if m.Kind != Gauge {
				continue
			}
			for _, s := range m.Series {
				if p, ok := s.prefix(); ok {
					obs(p+"x", 2)
				} else {
					obs(s.Key, 2)
				}
			}
		}
		obs("probe_ncclAllReduce", 7)
		obs("cupti_lib_on_ns", 3e9)
		obs("not_in_the_table", 5)
	}}
	if _, err := Register(mp.Meter("test"), src); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.Metric {
			var lv []string
			for _, l := range m.Label {
				lv = append(lv, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got[f.GetName()+"{"+strings.Join(lv, ",")+"}"] = v
			got[f.GetName()] = v
		}
	}
	for _, m := range Table {
		if _, ok := got[PromName(m)]; !ok {
			t.Errorf("%s: %s missing from the Prometheus exposition", m.Name, PromName(m))
		}
	}
	for k, want := range map[string]float64{
		"slowrank_records_dropped_total{reason=ringbuf_full}":    0, // zero-filled
		"slowrank_attach_errors_total{}":                         0,
		"slowrank_agent_probe_events_total{probe=ncclAllReduce}": 7,
		"slowrank_cupti_collection_time_seconds_total{}":         3,
		"slowrank_component_events_total{name=not_in_the_table}": 5,
		"slowrank_agent_duty_share_ratio{}":                      2,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (%v), want %v", k, v, ok, want)
		}
	}
}

// TestTwoSourcesOneKey: the last report wins (no double counting).
func TestTwoSourcesOneKey(t *testing.T) {
	a := Counters(nil, func() map[string]int64 { return map[string]int64{"otel_spans_exported": 4} })
	b := Counters([]string{Export}, func() map[string]int64 { return map[string]int64{"otel_spans_exported": 5} })
	vals := collect([]Source{a, b})
	n := 0
	for k, v := range vals {
		if Table[k.inst].Name == "slowrank.export.spans" {
			n++
			if v.v != 5 {
				t.Errorf("value %v, want 5", v.v)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d series of slowrank.export.spans, want 1", n)
	}
}
