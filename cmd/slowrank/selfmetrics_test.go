package main

import (
	"strings"
	"testing"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/localapi"
	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/selfmetrics"
)

// TestSelfMetricKeysDeclared: the aggregator's keys are declared in
// selfmetrics.Table (the sinks' are checked in export).
func TestSelfMetricKeysDeclared(t *testing.T) {
	agg, err := aggregate.New(aggregate.Config{Detector: detector.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := aggregate.NewServer(aggregate.ServerConfig{Listen: "127.0.0.1:0"}, agg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Shutdown(t.Context()); err != nil {
			t.Error(err)
		}
	}()
	for k := range aggregateCounters(agg, srv) {
		if _, s, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(s.Key, "*") {
			t.Errorf("counter %q is not declared in selfmetrics.Table", k)
		}
	}
}

// TestStatusServerKeysDeclared: the status endpoint's counters, which the
// agent's self-metrics carry (observeAgent), are declared.
func TestStatusServerKeysDeclared(t *testing.T) {
	srv, err := localapi.NewServer[agent.ControlRequest, agent.ControlState](nil, localapi.ServerConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	}()
	for k := range srv.Counters() {
		if _, s, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(s.Key, "*") {
			t.Errorf("counter %q is not declared in selfmetrics.Table", k)
		}
	}
}
