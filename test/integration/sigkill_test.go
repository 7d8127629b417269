package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

// TestSIGKILLedAgentExitsQuickly: a SIGKILLed agent leaves the kernel to
// release its BPF links, one after another (about 50 ms each, a few RCU
// grace periods), before the process is gone; until then its status socket
// and its uprobes are still there. With one uprobe_multi link per library,
// probe class and direction, the agent on the 4-rank fake job holds a few
// links and is gone within a fraction of a second, and the ranks' steps
// while the kernel tears its links down take as long as before.
func TestSIGKILLedAgentExitsQuickly(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	agentBin := testutil.BuildAgent(t, t.TempDir())
	trainer := testutil.SharedFakeTrainer(t)
	for _, tc := range []struct {
		name     string
		args     []string // the agent's, after its defaults here
		maxLinks int
		maxGone  time.Duration // SIGKILL to process reaped
		maxStep  float64       // relative change of the ranks' median step during the teardown
	}{
		{"uprobe_multi links: one per class and direction, gone within 1.5 s", nil, 12, 1500 * time.Millisecond, 0.10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			key := runKey("SLOWRANK_IT_KILL_MARK")
			args := append([]string{"--log-level", "info", "agent", "--env-key", key, "--otel", "off",
				"--status-socket", filepath.Join(dir, "agent.sock"), "--state-dir", "", "--window", "1s"}, tc.args...)
			ag := exec.Command(agentBin, args...)
			var agentOut testutil.LockedBuffer
			ag.Stdout, ag.Stderr = &agentOut, &agentOut
			if err := ag.Start(); err != nil {
				t.Fatal(err)
			}
			agentDone := make(chan struct{})
			go func() { _ = ag.Wait(); close(agentDone) }() // killed by the test: its status is the kill
			t.Cleanup(func() {
				ag.Process.Kill()
				<-agentDone
				if t.Failed() {
					t.Logf("agent output:\n%s", testutil.Tail(agentOut.String(), 4000))
				}
			})

			truth := filepath.Join(dir, "truth.jsonl")
			tr := exec.Command(trainer, "--ranks", "4", "--duration", "10", "--step-ms", "20", "--gpu-ms", "30",
				"--sleep-before-start", "1000", "--truth", truth)
			tr.Env = append(os.Environ(), key+"=1")
			var trOut bytes.Buffer
			tr.Stdout, tr.Stderr = &trOut, &trOut
			trDone := testutil.StartCmd(t, tr)

			// Attached: the agent's links stay the same for 1.5 s once the
			// ranks have stepped.
			links, stable := 0, time.Now()
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent's links never settled (%d)", links)
				}
				n := bpfLinks(ag.Process.Pid)
				if n != links {
					links, stable = n, time.Now()
					continue
				}
				if n > 0 && time.Since(stable) > 1500*time.Millisecond && countSteps(truth) >= 4*20 {
					break
				}
			}
			fds := openFDs(ag.Process.Pid)
			time.Sleep(time.Second) // steps with the agent attached, before the kill

			killed := testutil.MonoNow()
			start := time.Now()
			if err := ag.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-agentDone:
			case <-time.After(30 * time.Second):
				t.Fatal("the SIGKILLed agent still exists after 30 s")
			}
			gone, goneNS := time.Since(start), testutil.MonoNow()
			time.Sleep(500 * time.Millisecond) // steps after the teardown, for the record

			if err := <-trDone; err != nil {
				t.Fatalf("fake trainer: %v\n%s", err, trOut.String())
			}
			steps := testutil.ReadTruth(t, truth)["step"]
			// Before: the second of steps up to the kill; during: the steps
			// that overlap the teardown, plus a step on either side.
			const step = int64(60 * time.Millisecond)
			before := stepMedian(steps, func(s testutil.TruthRecord) bool {
				return s.EndNS <= killed && s.EndNS > killed-int64(time.Second)
			})
			during := stepMedian(steps, func(s testutil.TruthRecord) bool {
				return s.EndNS > killed-step && s.StartNS < goneNS+step
			})
			t.Logf("agent: %d BPF links, %d open fds; SIGKILL -> reaped in %v; ranks' median step %.2f ms before, %.2f ms during the teardown",
				links, fds, gone.Round(time.Millisecond), before, during)
			if links > tc.maxLinks {
				t.Errorf("the agent held %d BPF links, want at most %d", links, tc.maxLinks)
			}
			if gone > tc.maxGone {
				t.Errorf("the SIGKILLed agent took %v to be gone, want at most %v", gone, tc.maxGone)
			}
			if before == 0 || during == 0 {
				t.Fatalf("no steps to compare: %.2f ms before, %.2f ms during", before, during)
			}
			if d := during/before - 1; d > tc.maxStep || d < -tc.maxStep {
				t.Errorf("the ranks' median step during the teardown %.2f ms differs from before %.2f ms by %+.1f %%", during, before, 100*d)
			}
		})
	}
}

// bpfLinks is how many BPF links process pid holds (fdinfo with a link_id).
func bpfLinks(pid int) int {
	dir := "/proc/" + strconv.Itoa(pid) + "/fdinfo"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && bytes.Contains(b, []byte("\nlink_id:")) {
			n++
		}
	}
	return n
}

// openFDs is how many files process pid has open.
func openFDs(pid int) int {
	entries, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return len(entries)
}

// countSteps is how many step records the trainer's truth file holds so far.
func countSteps(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), `"kind":"step"`)
}

// stepMedian is the median step time (ms) of the steps that keep holds.
func stepMedian(steps []testutil.TruthRecord, keep func(testutil.TruthRecord) bool) float64 {
	var v []float64
	for _, s := range steps {
		if keep(s) {
			v = append(v, s.StepMS)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}
