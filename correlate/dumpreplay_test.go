package correlate

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"os"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// replayDump feeds an agent's event dump (SLOWRANK_IT_DUMP of the
// integration tests, or the agent's --dump-events: one {"type", "record"}
// object per line, in the order the pipeline fed them) to a correlator,
// advancing event time with the host calls, and returns the step facts.
// The pipeline's own records (its plugin-path switch, a process's exit)
// are skipped.
func replayDump(t *testing.T, path string) ([]detector.Step, *Correlator) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	c := New(Config{})
	var steps []detector.Step
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			Type   string          `json:"type"`
			Record json.RawMessage `json:"record"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		var dst any
		switch rec.Type {
		case "correlate.RankInfo":
			dst = new(RankInfo)
		case "correlate.CommInit":
			dst = new(CommInit)
		case "correlate.HostCall":
			dst = new(HostCall)
		case "correlate.CommDestroy":
			dst = new(CommDestroy)
		case "correlate.DeviceInterval":
			dst = new(DeviceInterval)
		case "correlate.CollKernel":
			dst = new(CollKernel)
		case "correlate.Coverage":
			dst = new(Coverage)
		case "correlate.Drop":
			dst = new(Drop)
		case "pipeline.PluginPath", "pipeline.forget":
			continue
		default:
			t.Fatalf("record type %q", rec.Type)
		}
		if err := json.Unmarshal(rec.Record, dst); err != nil {
			t.Fatal(err)
		}
		switch v := dst.(type) {
		case *RankInfo:
			c.SetRank(*v)
		case *CommInit:
			c.AddCommInit(*v)
		case *HostCall:
			c.AddHostCall(*v)
			s, _ := c.Drain()
			steps = append(steps, s...)
		case *CommDestroy:
			c.AddCommDestroy(*v)
		case *DeviceInterval:
			c.AddDevice(*v)
		case *CollKernel:
			c.AddCollKernel(*v)
		case *Coverage:
			c.AddCoverage(*v)
		case *Drop:
			c.AddDrop(*v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	s, _ := c.Flush()
	return append(steps, s...), c
}

// A CUDA-graph loop (the whole step one graph launch and one
// synchronisation: a period of one call) after the model's copy to the GPU,
// whose synchronisations come in pairs: captured from the integration
// test's cudagraph shape on a loaded machine, where rank 0's fallback clock
// locked groups of two copies and, once the graph's iterations came, all
// alike, waited for a dominant instance for the rest of the run: 1 fact
// for 260 iterations (rank 1, whose copies were timed a little
// differently, had 260). Both ranks: one step per iteration.
func TestReplayCUDAGraphAfterPairedCopies(t *testing.T) {
	steps, _ := replayDump(t, "testdata/cudagraph-loaded-2ranks.dump.jsonl.gz")
	first := map[int]detector.Step{}
	n := map[int]int{}
	for _, s := range steps {
		n[s.Rank]++
		if f, ok := first[s.Rank]; !ok || s.Step < f.Step {
			first[s.Rank] = s
		}
	}
	for r := range 2 {
		if n[r] < 259 || n[r] > 261 {
			t.Errorf("rank %d: %d facts for 260 iterations", r, n[r])
		}
	}
	// The ranks started together (0.5 ms apart): their first steps are
	// the same iteration.
	if d := first[0].EndNS - first[1].EndNS; d < -5e6 || d > 5e6 {
		t.Errorf("first steps end %.1f ms apart", float64(d)/1e6)
	}
}

// A job whose cycle moves to a new communicator mid-run: the fake
// trainer's --split-at 200 (4 ranks, 250 iterations of 4 all-reduces; at
// iteration 200 every rank calls ncclCommSplit and its collectives go to
// the new communicator), on the uprobes (TestNCCLCapturePathMatrix's late
// communicator). The old clock went quiet without leaving its lock, and a
// split communicator's ranks are unknown to the uprobes, so the new one
// never took the clock: 200 facts per rank. It takes it once the clock
// made no step for PromoteCycles of its steps.
func TestReplayCycleMovesToASplitCommunicator(t *testing.T) {
	steps, c := replayDump(t, "testdata/split-at-200-4ranks.dump.jsonl.gz")
	n := map[int]int{}
	for _, s := range steps {
		n[s.Rank]++
	}
	lost := 8 + c.cfg.PromoteCycles + 2 // warm-up; the switch
	for r := range 4 {
		if n[r] < 250-lost || n[r] > 250 {
			t.Errorf("rank %d: %d facts for 250 iterations (at least %d)", r, n[r], 250-lost)
		}
	}
}
