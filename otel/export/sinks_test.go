package export

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/selfmetrics"
)

// jsonlKinds returns the "kind" of every line of the file at path.
func jsonlKinds(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var v struct{ Kind string }
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		kinds = append(kinds, v.Kind)
	}
	return kinds
}

func TestJSONLSink(t *testing.T) {
	dir := t.TempDir()
	facts, err := NewJSONLWriter(filepath.Join(dir, "facts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	verdicts, err := NewJSONLWriter(filepath.Join(dir, "verdicts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s := &JSONLSink{Facts: facts, Verdicts: verdicts}
	s.Topology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1})
	s.Step(stepFact(testJob, 0, 1, 0), 0)
	s.Settled(detector.SettledWindow{Job: testJob}, []detector.Verdict{
		stragglerVerdict(testJob, 0, 1, detector.StateCandidate), stragglerVerdict(testJob, 0, 2, detector.StateOK)})
	if err := facts.Close(); err != nil {
		t.Fatal(err)
	}
	if err := verdicts.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := jsonlKinds(t, facts.path), []string{detector.KindTopology, detector.KindStep}; !reflect.DeepEqual(got, want) {
		t.Errorf("facts: %v, want %v", got, want)
	}
	if got, want := jsonlKinds(t, verdicts.path), []string{detector.KindVerdict, detector.KindVerdict}; !reflect.DeepEqual(got, want) {
		t.Errorf("verdicts: %v, want %v", got, want)
	}
	c := s.Counters()
	want := map[string]int64{
		"jsonl_facts_written": 2, "jsonl_facts_lost": 0, "jsonl_facts_write_failing": 0,
		"jsonl_verdicts_written": 2, "jsonl_verdicts_lost": 0, "jsonl_verdicts_write_failing": 0,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("counters %v, want %v", c, want)
	}
	for k := range c {
		if _, sr, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(sr.Key, "*") {
			t.Errorf("counter %q is not declared in selfmetrics.Table", k)
		}
	}
}

// An output that is off takes nothing and counts nothing.
func TestJSONLSinkWithoutOutputs(t *testing.T) {
	s := &JSONLSink{}
	s.Topology(detector.Topology{Kind: detector.KindTopology, Job: testJob})
	s.Step(stepFact(testJob, 0, 1, 0), 0)
	s.Settled(detector.SettledWindow{Job: testJob}, []detector.Verdict{stragglerVerdict(testJob, 0, 1, detector.StateCandidate)})
	if c := s.Counters(); len(c) != 0 {
		t.Errorf("counters %v", c)
	}
}

// OTelSink is the exporter's policy seen through the sink interface: the
// facts of a window wait for its settlement, a straggler's spans leave.
func TestOTelSink(t *testing.T) {
	h := newHarness(t, Policy{SampleEvery: 1 << 30}, QueueConfig{})
	s := OTelSink{Exporter: h.e}
	s.Topology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1,
		Ranks: []detector.RankInfo{{Rank: 0, Host: "h0"}, {Rank: 1, Host: "h0"}}})
	for step := range int64(stepsPerWindow) {
		s.Step(stepFact(testJob, 0, step, 0), 0)
		s.Step(stepFact(testJob, 1, step, 30), 0)
	}
	h.flush(t)
	if n := len(h.spans.GetSpans()); n != 0 {
		t.Fatalf("%d spans before the window settled", n)
	}
	s.Settled(detector.SettledWindow{Job: testJob, Index: 0}, []detector.Verdict{stragglerVerdict(testJob, 0, 1, detector.StateStraggler)})
	h.flush(t)
	steps := 0
	for _, sp := range h.spans.GetSpans() {
		if sp.Name == SpanStep {
			steps++
		}
	}
	if steps != 2*stepsPerWindow {
		t.Errorf("%d train.step spans, want every step of the straggler and its peers (%d)", steps, 2*stepsPerWindow)
	}
	if got, want := s.Counters(), h.e.Counters(); !reflect.DeepEqual(got, want) {
		t.Errorf("counters %v, want the exporter's %v", got, want)
	}
}
