package faketrainer_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSlowPhasesSchedule: --slow-phases gives the slow rank its own host
// stall in each step range and none between them (the sensitivity
// schedule of test/sensitivity), and its peers wait for it there.
func TestSlowPhasesSchedule(t *testing.T) {
	const ranks, steps, slowRank = 4, 40, 1
	phases := []struct {
		from, to int
		stallMs  float64
	}{{5, 15, 10}, {25, 35, 20}}
	r := trainer(t, nil, "--ranks", "4", "--steps", "40", "--step-ms", "10", "--gpu-ms", "10", "--jitter", "0.02",
		"--slow-rank", "1", "--slow-phases", "5-15:10,25-35:20")
	by := checkComplete(t, r, ranks, steps)
	phaseOf := func(k int) int {
		for i, p := range phases {
			if k >= p.from && k < p.to {
				return i
			}
		}
		return -1
	}
	for rank := 0; rank < ranks; rank++ {
		for k := 0; k < steps; k++ {
			if want := rank == slowRank && phaseOf(k) >= 0; by[rank][k].Slowed != want {
				t.Fatalf("rank %d step %d slowed=%v, want %v", rank, k, by[rank][k].Slowed, want)
			}
		}
	}
	for _, p := range phases {
		// The phase's first step is skipped: its peers' previous step ends skewed.
		d := median(collect(by, slowRank, p.from+1, p.to, hostMs)) - median(collect(by, 0, p.from+1, p.to, hostMs))
		if d < p.stallMs-4 || d > p.stallMs+4 {
			t.Errorf("steps %d-%d: the slow rank's host time exceeds rank 0's by %.2f ms, want about %.0f", p.from, p.to, d, p.stallMs)
		}
		if w := median(collect(by, 0, p.from+1, p.to, syncMs)) - median(collect(by, 0, 16, 25, syncMs)); w < p.stallMs-4 {
			t.Errorf("steps %d-%d: rank 0 waits %.2f ms more than between the phases, want about %.0f", p.from, p.to, w, p.stallMs)
		}
	}
}

// TestSlowPhasesRejectsBadSpecs: a malformed schedule is a usage error.
func TestSlowPhasesRejectsBadSpecs(t *testing.T) {
	if binDir == "" {
		t.Skip(skip)
	}
	for _, spec := range []string{"", "5", "5-3:1", "5-10", "5-10:x", "5-10:1,", "-1-3:2", "1-2:-3"} {
		cmd := exec.Command(filepath.Join(binDir, "faketrainer"), "--ranks", "1", "--steps", "1", "--slow-rank", "0",
			"--slow-phases", spec)
		cmd.Env = cleanEnv()
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 || !strings.Contains(string(out), "--slow-phases") {
			t.Errorf("--slow-phases %q: %v, output %q; want exit status 2 and the flag named", spec, err, out)
		}
	}
}
