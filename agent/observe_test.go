package agent

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/slowrank/slowrank/cupti"
	"github.com/slowrank/slowrank/selfmetrics"
)

// promHandler serves what observe reports through the OpenTelemetry
// Prometheus exporter, as cmd/slowrank wires /metrics.
func promHandler(t *testing.T, observe func(func(string, float64, ...string))) http.Handler {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if _, err := selfmetrics.Register(mp.Meter("test"), selfmetrics.Source{
		Components: []string{selfmetrics.Agent, selfmetrics.Library}, Observe: observe}); err != nil {
		t.Fatal(err)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// TestObserveDeclared: every key that Observe reports for a full status is
// in the self-metrics table.
func TestObserveDeclared(t *testing.T) {
	f := newFake()
	f.state.Paused = true
	f.state.Detector.PhaseThresholds = map[string]float64{"host": 0.15}
	f.state.Duty = &DutySettings{Budget: 0.003}
	n := 0
	observeStatus(func(key string, _ float64, _ ...string) {
		n++
		if _, _, ok := selfmetrics.Lookup(key); !ok {
			t.Errorf("Observe reports %q, which selfmetrics.Table does not declare", key)
		}
	}, f.Status(), &f.state)
	if n < 30 {
		t.Errorf("only %d observations", n)
	}
}

// TestCounterKeysDeclared reads the agent's sources for every counter key
// it can set (string literals given to counters.add/set, pipeline.count)
// and checks that selfmetrics.Table declares it; the dynamic keys
// (probe_NAME, cupti_lib_STAT) are checked by their generators.
func TestCounterKeysDeclared(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	keys := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "add" && sel.Sel.Name != "set" && sel.Sel.Name != "count") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			k, _ := strconv.Unquote(lit.Value)
			keys[k] = fset.Position(lit.Pos()).String()
			return true
		})
	}
	if len(keys) < 60 {
		t.Fatalf("found only %d counter keys: is the scan still right?", len(keys))
	}
	for k, pos := range keys {
		if strings.HasSuffix(k, "_") { // a prefix: probe_, cupti_lib_
			continue
		}
		if _, _, ok := selfmetrics.Lookup(k); !ok {
			t.Errorf("%s: counter %q is not declared in selfmetrics.Table", pos, k)
		}
	}
	for i := cupti.Stat(0); i < cupti.NumStats; i++ {
		if _, s, ok := selfmetrics.Lookup("cupti_lib_" + i.String()); !ok || strings.HasSuffix(s.Key, "*") {
			t.Errorf("injection library stat %s (cupti_lib_%s) is not declared in selfmetrics.Table", i, i)
		}
	}
	if _, _, ok := selfmetrics.Lookup("probe_ncclAllReduce"); !ok {
		t.Error("probe_* is not declared")
	}
}
