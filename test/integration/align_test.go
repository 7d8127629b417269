package integration

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/test/testutil"
)

// Issue 16: one cut point per communicator. The fake job loads NCCL with
// dlopen after start (three all-reduces and one stream synchronisation per
// iteration; the ranks end each iteration together), and the agent starts
// at a random offset: before the dlopen, around the communicators'
// creation, or during training, so that each rank's recording begins at
// another call (the library is noticed within a poll of the maps, and
// every process is attached on its own). In every run, step k must end
// together on every rank: median spread of the ranks' ends < 5 ms, and the
// same truth iteration on every rank.
func TestCutPointAlignedWhateverTheAttach(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	runs := 20
	if s := os.Getenv("SLOWRANK_IT_ALIGN_RUNS"); s != "" {
		if _, err := fmt.Sscan(s, &runs); err != nil {
			t.Fatalf("SLOWRANK_IT_ALIGN_RUNS=%q: %v", s, err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SLOWRANK_IT_ALIGN_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("SLOWRANK_IT_ALIGN_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (SLOWRANK_IT_ALIGN_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 16))
	trainer := testutil.SharedFakeTrainer(t)
	start := time.Now()
	retried := 0
	for i := range runs {
		offset := time.Duration(rng.Int64N(int64(900 * time.Millisecond)))
		var r lateRun
		for try := 0; ; try++ {
			r = runLateAgent(t, trainer, i, offset, "--steps", "130", "--step-ms", "4", "--gpu-ms", "5",
				"--buckets", "3", "--dlopen-nccl", "--dlopen-delay-ms", "300", "--seed", fmt.Sprint(i+1))
			if r.counters["attach_errors"] == 0 || try >= 3 {
				break
			}
			// Seen when another agent attaches or detaches on this host at
			// the same time (go test runs packages in parallel; a shared
			// CI machine): creating a uprobe fails with ENOENT and the
			// agent records nothing. Not what this test is about: the
			// same offset once more.
			t.Logf("run %d: %d attach errors, run again:\n%s", i, r.counters["attach_errors"], r.warnings)
			retried++
		}
		checkAligned(t, i, offset, r)
	}
	t.Logf("%d runs (%d again) in %v", runs, retried, time.Since(start).Round(100*time.Millisecond))
}

func checkAligned(t *testing.T, i int, offset time.Duration, r lateRun) {
	t.Helper()
	byRank := truthByRank(r.truth)
	perRank := map[int]int{}
	iteration := map[int64]map[int]int64{}
	for _, f := range r.sink.steps {
		perRank[f.Rank]++
		if ts, ok := testutil.NearestStep(byRank[f.Rank], f.EndNS); ok {
			if iteration[f.Step] == nil {
				iteration[f.Step] = map[int]int64{}
			}
			iteration[f.Step][f.Rank] = ts.Step
		}
	}
	spread := endSpreads(r.sink.steps)
	med := quantile(spread, 0.5)
	t.Logf("run %d: agent %v after the job: steps %v, %d on all ranks, median end spread %.3f ms",
		i, offset.Round(time.Millisecond), perRank, len(spread), med)
	if len(spread) < 20 || !(med < 5) {
		t.Errorf("run %d (agent %v after the job): %d steps on all ranks, median end spread %.3f ms; counters %v\n%s",
			i, offset.Round(time.Millisecond), len(spread), med, r.counters, r.warnings)
	}
	for idx, ranks := range iteration {
		seen := map[int64]bool{}
		for _, k := range ranks {
			seen[k] = true
		}
		if len(seen) > 1 {
			t.Errorf("run %d: step %d is truth iterations %v on the ranks", i, idx, ranks)
			break
		}
	}
}

// lateRun is what one agent of runLateAgent captured.
type lateRun struct {
	sink     *captureSink
	truth    []testutil.TruthRecord // the trainer's steps
	counters map[string]int64
	warnings string
}

// runLateAgent starts a 4-rank fake trainer, then after offset an agent
// (its communicators' first cycle released after 300 ms, the time scale of
// these short jobs), waits for the trainer, stops the agent and returns
// what it captured.
func runLateAgent(t *testing.T, trainer string, run int, offset time.Duration, args ...string) lateRun {
	t.Helper()
	envKey := fmt.Sprintf("SLOWRANK_IT_ALIGN_MARK_%d_%d", run, time.Now().UnixNano()%1e6)
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	cmd := exec.Command(trainer, append([]string{"--ranks", "4", "--truth", truth}, args...)...)
	cmd.Env = append(os.Environ(), envKey+"=1")
	out := &bytes.Buffer{} // one writer for both: exec serialises the writes
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(offset)
	sink := &captureSink{}
	cfg := agent.DefaultConfig()
	cfg.HostName = "it"
	cfg.Detector.Window = time.Second
	cfg.Detector.Lateness = 500 * time.Millisecond
	cfg.Correlate.ConfirmSpan = 300 * time.Millisecond
	cfg.Sinks = []agent.Sink{sink}
	cfg.Selector = agent.Selector{EnvKey: envKey}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dump := dumpPath(t, run)
	if dump != "" {
		cfg.Dump = dumpTo(t, dump)
	}
	a, err := agent.New(cfg)
	if err != nil {
		cmd.Process.Kill()
		_ = cmd.Wait() // reaps the killed trainer: Wait reports the kill
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	if err := cmd.Wait(); err != nil {
		cancel()
		// The trainer's failure is the one to report; the agent's stop and
		// close only release what it holds.
		t.Logf("agent stopped: %v", <-done)
		_ = a.Close()
		t.Fatalf("fake trainer: %v\n%s", err, out.String())
	}
	time.Sleep(300 * time.Millisecond) // in-flight ring buffer records
	cancel()
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop within 20 s")
	}
	if dump != "" {
		if b, err := os.ReadFile(truth); err == nil {
			if err := os.WriteFile(dump+".truth", b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := testutil.ReadTruth(t, truth)["step"]
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].EndNS < steps[j].EndNS })
	return lateRun{sink: sink, truth: steps, counters: a.Counters(), warnings: logs.String()}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
