package pipeline

import (
	"errors"
	"testing"
	"time"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

// settleSink records what the pipeline hands to sinks.
type settleSink struct {
	windows  []detector.SettledWindow
	verdicts []detector.Verdict
	steps    int
	stepWins map[int64]int
}

func (s *settleSink) Topology(detector.Topology) {}
func (s *settleSink) Step(_ detector.Step, win int64) {
	s.steps++
	if s.stepWins == nil {
		s.stepWins = map[int64]int{}
	}
	s.stepWins[win]++
}
func (s *settleSink) Settled(w detector.SettledWindow, vs []detector.Verdict) {
	s.windows = append(s.windows, w)
	s.verdicts = append(s.verdicts, vs...)
}

// TestSwapKeepsWindowsContiguousAndLosesNoStep changes the window from 1 s to 2 s in the middle
// of a job: windows stay contiguous with increasing indices, the old
// detector settles its last window and retires, the new settings judge
// what follows, and no step is lost.
func TestSwapKeepsWindowsContiguousAndLosesNoStep(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Window = time.Second
	cfg.Lateness = 200 * time.Millisecond
	cfg.Consecutive = 2
	det, err := detector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sink := &settleSink{}
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det, Sinks: []Sink{sink}})
	p.deliver(nil, []detector.Topology{{Kind: detector.KindTopology, Job: "j", Version: 1,
		Groups: []detector.Group{{ID: "dp0", Type: "dp", Ranks: []int{0, 1, 2, 3}}}}})

	const (
		base   = int64(1_000_000_000_000)
		stepNS = int64(100 * time.Millisecond)
		steps  = 120 // 12 s
	)
	delivered := 0
	var swapAt int64
	for i := int64(1); i <= steps; i++ {
		end := base + i*stepNS
		var batch []detector.Step
		for r := 0; r < 4; r++ {
			host := 20.0
			if r == 3 {
				host = 26 // +30 %
			}
			// Rank 3's extra host time is exposed: its peers wait for it in
			// a blocking collective.
			batch = append(batch, detector.Step{Kind: detector.KindStep, Job: "j", Rank: r, Step: i, Host: "h",
				StartNS: end - stepNS, EndNS: end, Phases: map[string]float64{"step": 106, "host": host, "coll_wait": 26 - host}})
		}
		p.deliver(batch, nil)
		delivered += len(batch)
		p.Tick(end)
		if i == 35 { // 3.5 s after t0 - 0.1 s: in window 3 of the old detector
			nc := cfg
			nc.Window = 2 * time.Second
			nc.Threshold = 0.1
			if err := p.SwapDetector(nc, end); err != nil {
				t.Fatal(err)
			}
			swapAt = end
			if err := p.SwapDetector(nc, end); !errors.Is(err, ErrSwapInProgress) {
				t.Fatalf("second swap while settling: %v, want ErrSwapInProgress", err)
			}
		}
	}
	p.Flush(base + (steps+50)*stepNS)

	if p.swap.old != nil {
		t.Fatal("old detector not retired")
	}
	if p.swap.swaps != 1 || p.det.Config().Window != 2*time.Second {
		t.Fatalf("swaps %d, window %s", p.swap.swaps, p.det.Config().Window)
	}
	t0 := base + stepNS // the first step's end
	boundary := t0 + 4*int64(time.Second)
	if got := p.swap.bound["j"]; got != boundary || boundary <= swapAt {
		t.Fatalf("boundary %d, want %d (after the request at %d)", got, boundary, swapAt)
	}
	// Windows: 0..3 of 1 s, then 4, 5, ... of 2 s from the boundary, in order.
	for i, w := range sink.windows {
		if i > 0 && w.Index <= sink.windows[i-1].Index {
			t.Fatalf("window %d settled after %d: %+v", w.Index, sink.windows[i-1].Index, sink.windows)
		}
		want := time.Second
		if w.Index >= 4 {
			want = 2 * time.Second
			if w.StartNS != boundary+(w.Index-4)*int64(2*time.Second) {
				t.Errorf("window %d starts at %d, want %d", w.Index, w.StartNS, boundary+(w.Index-4)*int64(2*time.Second))
			}
		}
		if d := time.Duration(w.EndNS - w.StartNS); d != want {
			t.Errorf("window %d lasts %s, want %s", w.Index, d, want)
		}
	}
	if n := len(sink.windows); n < 8 || sink.windows[3].Index != 3 || sink.windows[4].Index != 4 {
		t.Fatalf("settled windows %+v", sink.windows)
	}
	// Steps: every one judged once, by one detector.
	var facts int64
	for _, s := range p.Summaries() {
		facts += s.Facts
	}
	if facts != int64(delivered) || sink.steps != delivered || p.swap.lateAfterSwap != 0 {
		t.Fatalf("facts %d, sink steps %d, late after swap %d; delivered %d", facts, sink.steps, p.swap.lateAfterSwap, delivered)
	}
	// The new detector raises the alert again under its own settings.
	var after bool
	for _, v := range sink.verdicts {
		if v.Rank == 3 && v.State == detector.StateStraggler && v.Window >= 4 {
			after = true
		}
		if v.Rank != 3 {
			t.Errorf("unexpected verdict %+v", v)
		}
	}
	if !after {
		t.Fatalf("no straggler verdict for rank 3 after the change: %+v", sink.verdicts)
	}
	sums := p.Summaries()
	if len(sums) != 1 || len(sums[0].Stragglers) != 1 || sums[0].Stragglers[0] != 3 {
		t.Fatalf("summaries %+v", sums)
	}
}

// A change before any step has nothing to drain: it takes effect at once.
func TestSwapBeforeAnyStepTakesEffectAtOnce(t *testing.T) {
	det, _ := detector.New(detector.DefaultConfig())
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det})
	nc := detector.DefaultConfig()
	nc.Consecutive = 5
	if err := p.SwapDetector(nc, 1e12); err != nil {
		t.Fatal(err)
	}
	if p.swap.old != nil || p.det.Config().Consecutive != 5 {
		t.Fatalf("old %v, consecutive %d", p.swap.old, p.det.Config().Consecutive)
	}
	bad := nc
	bad.Threshold = -1
	if err := p.SwapDetector(bad, 1e12); err == nil || errors.Is(err, ErrSwapInProgress) {
		t.Fatalf("invalid config: %v, want the detector's error", err)
	}
	if p.det.Config().Consecutive != 5 {
		t.Fatal("a refused change replaced the detector")
	}
}

func TestNextWindowStartIsTheFirstInstantOfTheNextWindow(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Window = 3 * time.Second
	d, _ := detector.New(cfg)
	d.SetOrigin("j", 1_000)
	for _, now := range []int64{1_000, 1_001, 3_000_000_999, 3_000_001_000, 3_000_001_001, 500} {
		k, _ := d.WindowOf("j", now)
		b := nextWindowStart(d, "j", now, k)
		if w, _ := d.WindowOf("j", b); w != k+1 {
			t.Errorf("now %d: boundary %d is in window %d, want %d", now, b, w, k+1)
		}
		if w, _ := d.WindowOf("j", b-1); w != k {
			t.Errorf("now %d: boundary %d is not the first of window %d", now, b, k+1)
		}
	}
}

// The detector_* counters are counters: a detector change (the old
// detector retiring after its last window) never takes a count back.
// Before, they counted the current detector only and fell to 0 at a swap.
func TestDetectorCountersNeverGoBackAcrossASwap(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Window = time.Second
	cfg.Lateness = 200 * time.Millisecond
	det, err := detector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det, Sinks: []Sink{&settleSink{}}})
	const base, stepNS = int64(1_000_000_000_000), int64(100 * time.Millisecond)
	last := map[string]int64{}
	for i := int64(1); i <= 60; i++ {
		end := base + i*stepNS
		s := detector.Step{Kind: detector.KindStep, Job: "j", Rank: 0, Step: i, Host: "h",
			StartNS: end - stepNS, EndNS: end, Phases: map[string]float64{"step": 100, "host": 20}}
		p.deliver([]detector.Step{s, s}, nil) // every step twice: a duplicate each
		p.Tick(end)
		if i == 20 {
			nc := cfg
			nc.Window = 2 * time.Second
			if err := p.SwapDetector(nc, end); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range p.Counters() {
			if v < last[k] {
				t.Fatalf("step %d: %s went from %d to %d", i, k, last[k], v)
			}
			last[k] = v
		}
	}
	if last["detector_duplicates"] != 60 {
		t.Errorf("detector_duplicates = %d, want 60 (one per step)", last["detector_duplicates"])
	}
}
