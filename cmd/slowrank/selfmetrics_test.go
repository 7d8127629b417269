package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/export"
	"github.com/slowrank/slowrank/selfmetrics"
)

// TestSelfMetricKeysDeclared: the aggregator's and the JSONL sinks' keys
// are declared in selfmetrics.Table.
func TestSelfMetricKeysDeclared(t *testing.T) {
	agg, err := aggregate.New(aggregate.Config{Detector: detector.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := aggregate.NewServer(aggregate.ServerConfig{Listen: "127.0.0.1:0"}, agg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(t.Context())
	w, err := export.NewJSONLWriter(filepath.Join(t.TempDir(), "f.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, m := range []map[string]int64{aggregateCounters(agg, srv), (&jsonlSink{facts: w, verdicts: w}).Counters()} {
		for k := range m {
			if _, s, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(s.Key, "*") {
				t.Errorf("counter %q is not declared in selfmetrics.Table", k)
			}
		}
	}
}
