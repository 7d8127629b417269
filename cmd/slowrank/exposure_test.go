package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// replayFile replays a gzipped facts file of testdata/exposure.
func replayFile(t *testing.T, name string, cfg detector.Config) *replayResult {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "exposure", name))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	res, err := replay(zr, io.Discard, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// alerted lists "rank/phase" of every straggler verdict, once each.
func alerted(res *replayResult) []string {
	var out []string
	for _, v := range res.verdicts {
		if v.State == detector.StateStraggler {
			k := fmt.Sprintf("%d/%s", v.Rank, v.Phase)
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// firstStraggler is the window of the first straggler verdict, -1 if none.
func firstStraggler(res *replayResult) int64 {
	for _, v := range res.verdicts {
		if v.State == detector.StateStraggler {
			return v.Window
		}
	}
	return -1
}

// The committed facts of real runs, replayed at defaults: hidden host jitter
// raises nothing, a slow GPU and an exposed host stall are found as fast as by
// the seed's rule.
func TestExposureOnRealRuns(t *testing.T) {
	tests := []struct {
		name         string
		file         string
		window       time.Duration
		want         []string // alerted rank/phase at defaults
		stragglers   []int    // the summary's stragglers at defaults
		seedAlerts   bool     // whether the seed's rule alone alerts
		wantEvidence string   // the exposure evidence of the host alert, if any
	}{
		{"healthy two-H200 DDP: hidden host jitter raises no alert", "healthy-x2.facts.jsonl.gz", 5 * time.Second, nil, nil, true, ""},
		{"slow GPU on two H200s: rank 1 compute", "ddp-gpu-contend25-x2.facts.jsonl.gz", 5 * time.Second, []string{"1/compute"}, []int{1}, true, ""},
		{"make demo's host stall slows every step: rank 2 host", "demo.facts.jsonl.gz", 2 * time.Second, []string{"2/host"}, []int{2}, true, detector.EvidenceStepTime},
		// One H200 shared by 4 gloo ranks (bench/gpu/host_exposure.sh): rank 1
		// sleeps 15 ms per step from 25 s, the job's step rises about 1 %.
		{"a stall before the forward pass that the shared GPU hides: no alert", "hx-start-s15.facts.jsonl.gz", 5 * time.Second, nil, nil, true, ""},
		{"a stall before the step's end that queued GPU work hides: no alert", "hx-end-s15.facts.jsonl.gz", 5 * time.Second, nil, nil, false, ""},
		{"the same, all ranks' steps kept: no alert", "hx-end-s16.facts.jsonl.gz", 5 * time.Second, nil, nil, true, ""},
		{"the stall before the forward pass, all ranks' steps kept: no alert", "hx-start-s16.facts.jsonl.gz", 5 * time.Second, nil, nil, true, ""},
		// The same with 60 ms: the job's step rises 35 %, the peers wait for it.
		{"a stall that slows the job: rank 1 host by its peers' waits", "hx-start60-s16.facts.jsonl.gz", 5 * time.Second, []string{"1/host"}, []int{1}, true, detector.EvidenceVictimWait},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := detector.DefaultConfig()
			cfg.Window = tc.window
			res := replayFile(t, tc.file, cfg)
			if got := alerted(res); !slices.Equal(got, tc.want) {
				t.Errorf("alerts %v, want %v", got, tc.want)
			}
			sum := res.summaries[0]
			if sum.Alerts != int64(len(tc.want)) {
				t.Errorf("summary alerts %d, want %d", sum.Alerts, len(tc.want))
			}
			if !slices.Equal(sum.Stragglers, tc.stragglers) {
				t.Errorf("summary stragglers %v, want %v", sum.Stragglers, tc.stragglers)
			}
			for _, v := range res.verdicts {
				if v.State == detector.StateStraggler && v.Phase == detector.PhaseHost {
					if v.Exposure == nil || !v.Exposure.Exposed || v.Exposure.Evidence != tc.wantEvidence {
						t.Errorf("window %d host alert exposure %+v, want exposed by %s", v.Window, v.Exposure, tc.wantEvidence)
					}
				}
			}

			seed := cfg
			seed.Exposure = false
			sres := replayFile(t, tc.file, seed)
			if got := sres.summaries[0].Alerts > 0; got != tc.seedAlerts {
				t.Errorf("the seed's rule alerts: %v, want %v", got, tc.seedAlerts)
			}
			if len(tc.want) > 0 {
				if a, b := firstStraggler(res), firstStraggler(sres); a != b {
					t.Errorf("first straggler in window %d, the seed's rule in window %d: exposure must not delay a find", a, b)
				}
			}
		})
	}
}

// The healthy run's host deviations are still counted, as hidden.
func TestHealthyRunDeviationsAreCountedHidden(t *testing.T) {
	res := replayFile(t, "healthy-x2.facts.jsonl.gz", detector.DefaultConfig())
	if n := res.summaries[0].HiddenDeviations; n == 0 {
		t.Fatal("no hidden deviations counted in a run whose host jitter meets the seed's rule")
	}
	var buf bytes.Buffer
	cfg := detector.DefaultConfig()
	cfg.EmitOK = true
	res = replayFile(t, "healthy-x2.facts.jsonl.gz", cfg)
	for _, v := range res.verdicts {
		if v.Exposure != nil && v.Exposure.Exposed {
			buf.WriteString(v.Reason + "\n")
		}
	}
	if buf.Len() > 0 {
		t.Errorf("exposed host deviations in the healthy run:\n%s", buf.String())
	}
}

// In hx-start rank 1's peers waited about 14 ms per step longer than it did in
// the gloo all-reduce, but the GPU they share ran their kernels meanwhile:
// the job's step rose about 1 % (truth 1.03 %). The peers' waits alone raised
// a host straggler; held to the job's step rise, each of rank 1's slow
// windows is hidden, and its verdict says so.
func TestSharedGPUPeersWaitsAreHeldToTheStepRise(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.EmitOK = true
	res := replayFile(t, "hx-start-s15.facts.jsonl.gz", cfg)
	hidden := 0
	for _, v := range res.verdicts {
		if v.Rank != 1 || v.Phase != detector.PhaseHost || v.Window < 5 {
			continue // rank 1's steps are back from window 5, the stall's
		}
		ex := v.Exposure
		if v.State != detector.StateOK || ex == nil || ex.Exposed || ex.Evidence != detector.EvidenceVictimWait || !ex.Capped {
			t.Errorf("window %d: %s, exposure %+v, want ok and hidden by victim_wait held to the step rise", v.Window, v.State, ex)
			continue
		}
		if !strings.Contains(v.Reason, "its peers waited") || !strings.Contains(v.Reason, "but the job's step") {
			t.Errorf("window %d reason %q does not name the peers' waits and the job's step", v.Window, v.Reason)
		}
		hidden++
	}
	if hidden < 8 {
		t.Fatalf("%d of rank 1's stalled windows shown hidden, want the 9 from window 5", hidden)
	}
}
