package reliability

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProfilerGetsCompleteTraceWhileAgentCollects runs a training process
// with the injection library, the fake libcupti (CUPTI's contract) and a
// second CUPTI client that drives CUPTI as torch.profiler's Kineto does
// (cupti/test_stress.c, external mode), in front of the real agent with
// device collection pinned on: the agent's uprobes on libcupti see the
// other client's calls and the library yields to it. Every activity that
// ran inside a profiling session reaches the profiler (within the reaction
// time of the agent, at most 1 % in all), the library collects again after
// each session, and the agent counts the yields.
func TestProfilerGetsCompleteTraceWhileAgentCollects(t *testing.T) {
	tl := needTools(t)
	if tl.cuptiLib == "" {
		t.Skipf("injection library not built: %v", tl.cuptiErr)
	}
	bin := plainFakeCUPTI(t)
	stress := filepath.Join(bin, "test_stress")
	dir := t.TempDir()
	// Collect all the time: the worst case for another client.
	ag := startCollectingAgent(t, tl, dir)
	out := filepath.Join(dir, "stress.out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(stress, filepath.Join(bin, "libslowrank_cupti.so"), filepath.Join(bin, "libcupti.so"), "12", "external")
	cmd.Env = append(cleanEnv(), markOf(t)+"=1", "RANK=0", "WORLD_SIZE=1")
	cmd.Stdout, cmd.Stderr = f, f
	start := time.Now()
	err = cmd.Run()
	if cerr := f.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	text, _ := os.ReadFile(out)
	t.Logf("after %s:\n%s", time.Since(start).Round(time.Millisecond), text)
	if err != nil {
		t.Fatalf("training process with a profiler failed: %v", err)
	}
	if !strings.Contains(string(text), "test_stress: ok") {
		t.Fatal("no ok line")
	}
	st, err := ag.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters["cupti_foreign_calls"] == 0 || st.Counters["cupti_yields"] == 0 || st.Counters["cupti_resumes"] == 0 {
		t.Fatalf("agent did not see the other client or did not yield and resume: %v", st.Counters)
	}
	if !ag.alive() {
		t.Fatal("agent died")
	}
}
