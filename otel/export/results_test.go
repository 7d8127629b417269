package export

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gopkg.in/yaml.v3"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/selfmetrics"
)

// TestMetricsDocIsCurrent fails when docs/metrics.md is not what the
// declarations produce: run go generate ./otel/export/ (make docs).
func TestMetricsDocIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "metrics.md")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go generate ./otel/export/ writes it)", err)
	}
	if string(got) != MetricsDoc() {
		t.Errorf("%s is not what otel/export/results.go and selfmetrics/table.go declare: run go generate ./otel/export/ (make docs) and commit it", path)
	}
}

// gatherProm exports one window with a straggler verdict through the
// OpenTelemetry Prometheus exporter (the agent's /metrics uses the same)
// and returns the registry that gathers them.
func gatherProm(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), Config{Job: testJob, HostName: "testhost", Env: testEnv(nil),
		Traces: KindNone, Metrics: KindNone, MetricReaders: []sdkmetric.Reader{pe},
		NowMono: func() int64 { return 1 << 40 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	e.RecordTopology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1, Ranks: []detector.RankInfo{testPlaced}})
	for rank := range 3 {
		e.RecordStep(stepFact(testJob, rank, 0, 0), 0)
	}
	v := stragglerVerdict(testJob, 0, 2, detector.StateStraggler)
	v.AlertActive = true
	e.SettleWindow(testJob, 0, []detector.Verdict{v})
	return reg
}

// TestResultsAreWhatPrometheusServes: every declared result metric is
// served under the Prometheus name, type, help and labels that
// docs/metrics.md states, and every slowrank_* family served is declared
// (a result or a self-metric).
func TestResultsAreWhatPrometheusServes(t *testing.T) {
	fams, err := gatherProm(t).Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]int{}
	for i, f := range fams {
		byName[f.GetName()] = i
	}
	declared := map[string]bool{}
	for _, r := range Results {
		declared[r.PromName()] = true
		i, ok := byName[r.PromName()]
		if !ok {
			t.Errorf("%s: no family %s", r.Name, r.PromName())
			continue
		}
		f := fams[i]
		if f.GetType().String() != strings.ToUpper(r.Kind) {
			t.Errorf("%s: type %v, declared %s", r.Name, f.GetType(), r.Kind)
		}
		if f.GetHelp() != r.Desc {
			t.Errorf("%s: help %q, declared %q", r.Name, f.GetHelp(), r.Desc)
		}
		for _, m := range f.GetMetric() {
			var labels []string
			placedRank := false // the rank of testPlaced, whose topology places it
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
				placedRank = placedRank || l.GetName() == string(KeyRank) && l.GetValue() == strconv.Itoa(testPlaced.Rank)
			}
			for _, a := range r.Attrs {
				if !slices.Contains(labels, strings.ReplaceAll(a, ".", "_")) {
					t.Errorf("%s: labels %v lack the declared attribute %s", r.Name, labels, a)
				}
			}
			if placed := slices.Contains(labels, string(KeyUUID)); placedRank && placed != r.Placed {
				t.Errorf("%s: placement labels %v, declared %v", r.Name, labels, r.Placed)
			}
		}
	}
	for _, m := range selfmetrics.Table {
		declared[selfmetrics.PromName(m)] = true
	}
	declared[selfmetrics.PromName(selfmetrics.Metric{Name: selfmetrics.Undeclared, Kind: selfmetrics.Counter, Unit: "{event}"})] = true
	for name := range byName {
		if strings.HasPrefix(name, "slowrank_") && !declared[name] {
			t.Errorf("%s is served but declared nowhere (Results, selfmetrics.Table): docs/metrics.md misses it", name)
		}
	}
}

// TestResultsDeclareEveryInstrument: each Metric* name has its declaration
// (result falls back to none, which would export no unit and no help).
func TestResultsDeclareEveryInstrument(t *testing.T) {
	for _, name := range []string{MetricStepDuration, MetricPhaseDuration, MetricDeviation, MetricStraggler,
		MetricState, MetricVerdicts, MetricVerdictLatency} {
		if r := result(name); r.Desc == "" || r.Kind == "" {
			t.Errorf("%s is not declared in Results", name)
		}
	}
}

// TestStateCodes: every verdict state has its code, the codes are 0..4 in
// order, and an unknown state is -1.
func TestStateCodes(t *testing.T) {
	for i, s := range States {
		if s.Code != int64(i) || StateCode(s.Name) != s.Code || s.Meaning == "" {
			t.Errorf("state %d: %+v, StateCode %d", i, s, StateCode(s.Name))
		}
	}
	for _, s := range []string{detector.StateOK, detector.StateRecovered, detector.StateUncertain, detector.StateCandidate, detector.StateStraggler} {
		if StateCode(s) < 0 {
			t.Errorf("state %s has no code", s)
		}
	}
	if StateCode("bogus") != -1 {
		t.Error("an unknown state has a code")
	}
}

// TestAlertRulesUseTheStateCodes: an alert rule that compares
// slowrank_state with a number is named after that number's state
// (SlowrankVerdictUncertain: == 2), so renumbering a state fails here.
func TestAlertRulesUseTheStateCodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "slowrank-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	cmp := regexp.MustCompile(result(MetricState).PromName() + `\b[^=!<>]*?(==|!=|>=|<=|>|<)\s*(\d+)`)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, m := range cmp.FindAllStringSubmatch(r.Expr, -1) {
				n++
				code, _ := strconv.Atoi(m[2])
				if m[1] != "==" || code >= len(States) {
					t.Errorf("%s: %q compares %s with %s %s, not one of the codes", r.Alert, r.Expr, MetricState, m[1], m[2])
					continue
				}
				if state := States[code].Name; !strings.Contains(strings.ToLower(r.Alert), state) {
					t.Errorf("%s: %q tests code %d, which is %s", r.Alert, r.Expr, code, state)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("no rule compares %s with a code: the test checks nothing", result(MetricState).PromName())
	}
}
