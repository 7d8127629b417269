package integration

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/test/testutil"
)

// Issue 16: init-time bursts are no steps. The trainer broadcasts its
// parameters (sizes repeating layer by layer, a synchronisation after
// each) and runs a barrier storm before step 0, and an evaluation loop
// after every 120th step (longer apart than ConfirmSpan: see the limits
// in correlate's doc); the agent watches from the start. Every step fact
// is a training iteration, numbered alike on every rank: the first is
// iteration 0, one per iteration, and the init collectives are counted as
// skipped.
func TestInitBurstsAreNoSteps(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	const steps = 250
	sink, a, truth := ncclJob.runAll(t, 2*time.Second, "--steps", fmt.Sprint(steps), "--step-ms", "8", "--gpu-ms", "12",
		"--buckets", "3", "--init-bursts", "--eval-every", "120")

	want := callsMade(append(truth["step"], truth["burst"]...))
	got := a.Counters()
	for _, sym := range []string{"ncclAllReduce", "ncclBroadcast", "cudaStreamSynchronize"} {
		if g := got["probe_"+sym]; g != int64(want[sym]) || g == 0 {
			t.Errorf("%s: agent saw %d calls, trainer made %d", sym, g, want[sym])
		}
	}
	var initColls int64
	for _, b := range truth["burst"] {
		if b.What == "init" {
			initColls += int64(b.Calls["ncclBroadcast"] + b.Calls["ncclAllReduce"])
		}
	}
	if g := got["correlate_init_calls"]; g != initColls || g == 0 {
		t.Errorf("correlate_init_calls %d, want the %d collectives of the init bursts", g, initColls)
	}

	byRank := truthByRank(truth["step"])
	perRank := map[int]int{}
	first := map[int]int64{} // rank -> lowest step index
	iteration := map[int64]map[int]int64{}
	var unmatched []string
	for _, f := range sink.steps {
		perRank[f.Rank]++
		if k, ok := first[f.Rank]; !ok || f.Step < k {
			first[f.Rank] = f.Step
		}
		ts, ok := testutil.NearestStep(byRank[f.Rank], f.EndNS)
		if !ok {
			unmatched = append(unmatched, fmt.Sprintf("rank %d step %d (end %d, %+.3f ms from the nearest truth end)",
				f.Rank, f.Step, f.EndNS, float64(f.EndNS-closest(byRank[f.Rank], f.EndNS))/1e6))
			continue
		}
		if iteration[f.Step] == nil {
			iteration[f.Step] = map[int]int64{}
		}
		iteration[f.Step][f.Rank] = ts.Step
	}
	// A preemption between the trainer's clock read and the uretprobe can
	// move one end past the 1 ms match; a burst cut into steps moves many.
	if len(unmatched) > len(sink.steps)/100 {
		t.Errorf("%d of %d steps end at no step end of the truth: %v", len(unmatched), len(sink.steps), unmatched)
	}
	for r := range 4 {
		if n := perRank[r]; n < steps-1 || n > steps+1 {
			t.Errorf("rank %d: %d steps found, trainer ran %d", r, n, steps)
		}
		if it := iteration[first[r]][r]; it != 0 {
			t.Errorf("rank %d: first step %d is iteration %d, want 0", r, first[r], it)
		}
	}
	for idx, ranks := range iteration {
		for r, k := range ranks {
			if k != idx-first[r] {
				t.Errorf("step %d is iteration %d on rank %d (first step %d)", idx, k, r, first[r])
			}
		}
	}
	spread := endSpreads(sink.steps)
	if p := quantile(spread, 0.5); p > 1 || len(spread) < steps-1 {
		t.Errorf("step ends across ranks: %d steps on all ranks, median spread %.2f ms", len(spread), p)
	}
	t.Logf("steps %v, first %v, init calls %d, median end spread %.3f ms", perRank, first, got["correlate_init_calls"], quantile(spread, 0.5))
}

// Issue 16 item 4: the call cycles of the external training loops run on
// the H200 (bench/gpu/ext_loops.py), reproduced by the fake trainer's
// --loop-shape: several identical synchronisations per iteration and no
// collective (the transformers Trainer), a cycle "B S B S" per iteration
// (Megatron's timers), no synchronisation but one every 100 iterations
// (Lightning), a warm-up on a side stream before a CUDA graph, the model's
// copy to the GPU before DDP's first collective and a long iteration 0
// (torch.compile); the Trainer's end of training (--epilogue: a burst of
// synchronisations, 68 facts after the last iteration on the H200); the
// Trainer's iterations 3x or 10x shorter, or 3x longer, from iteration 100
// on, its logging steps of full length (--speedup-at: a change of pace
// within the first lock's ConfirmSpan, then a grouped lock whose logging
// steps are of the old pace; it stopped making steps, or the logging
// steps' communicator took the clock over, or the confirmation withdrew
// the iterations before the change). Every rank's step facts are its
// iterations: one per iteration (±1 in all), the
// first one in iteration 0 (1 for torch.compile), none before it, none
// after the last but the step up to an epilogue's burst;
// where the ranks are coupled by collectives, step k is the same
// iteration on both.
func TestLoopShapesAreIterations(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	for _, shape := range []string{"trainer", "trainer+epilogue", "trainer+speedup", "trainer+speedup10", "trainer+slowdown", "megatron", "lightning", "lightning+rebuilt", "cudagraph", "compile"} {
		t.Run(shape, func(t *testing.T) {
			steps, extra, firstAt, after := 260, []string(nil), int64(0), 0
			loop := shape
			if shape == "trainer+epilogue" {
				// The burst is merged into no step (correlate/stepdet/pace.go);
				// the step up to it is one fact after the last iteration.
				loop, extra, after = "trainer", []string{"--epilogue"}, 1
			}
			switch shape {
			case "trainer+speedup":
				// 100 iterations of ~14.7 ms, then ~5.2 ms but every 50th
				// (logging steps: 149, 199, 249, ...)
				loop, steps, extra = "trainer", 400, []string{"--speedup-at", "100", "--speedup", "3"}
			case "trainer+speedup10":
				// ~1.3 ms iterations, as short as the model's copy to the GPU
				loop, steps, extra = "trainer", 400, []string{"--speedup-at", "100", "--speedup", "10"}
			case "trainer+slowdown":
				loop, steps, extra = "trainer", 300, []string{"--speedup-at", "100", "--speedup", "0.33"}
			}
			if shape == "compile" {
				// The long iteration 0 follows DDP's broadcasts with no
				// synchronisation before it: no cut point that every rank
				// would choose whatever it saw before its lock (see the
				// "compile" case of correlate's TestExternalLoopShapes).
				firstAt = 1
			}
			if shape == "lightning" || shape == "lightning+rebuilt" {
				// A cycle without synchronisations is locked after ConfirmSpan
				// (2 s) without one: Lightning on the H200 synchronised every
				// 100 iterations of 22 ms. The fake's are ~6 ms.
				loop, steps, extra = "lightning", 500, []string{"--log-every", "400"}
			}
			if shape == "lightning+rebuilt" {
				// Iteration 0 all-reduces 5 buckets, the later ones 3 (DDP
				// rebuilds its buckets after iteration 0). Its last call is
				// outside the cycle, so the first lock starts after it, as
				// after an init-time call: iteration 0 makes no fact (the
				// calls before could be init-time ones; a step from the
				// synchronisation before them would make those a step). The
				// case where iteration 0 ends with the cycle's own last call
				// is correlate's "lightning, buckets rebuilt after iteration 0".
				extra, firstAt = append(extra, "--warmup-buckets", "5"), 1
			}
			sink, a, truth := ncclJob.runAll(t, 2*time.Second, append([]string{"--ranks", "2", "--steps", fmt.Sprint(steps),
				"--step-ms", "8", "--gpu-ms", "12", "--buckets", "3", "--loop-shape", loop}, extra...)...)
			defer logStepCounters(t, a)
			byRank := truthByRank(truth["step"])
			iterOf := map[int64]map[int]int64{} // step index -> rank -> iteration
			job := truth["step"][0].Job         // not another session's fake trainer
			for r := range 2 {
				iters := byRank[r]
				per := map[int64]int{}
				var n, outside, past int
				first := int64(-1)
				for _, f := range sink.steps {
					if f.Rank != r || f.Job != job {
						continue
					}
					n++
					i := sort.Search(len(iters), func(k int) bool { return iters[k].EndNS >= f.EndNS })
					if i == len(iters) && past < after {
						past++
						continue
					}
					if i == len(iters) || f.EndNS <= iters[i].StartNS {
						outside++
						continue
					}
					per[iters[i].Step]++
					if iterOf[f.Step] == nil {
						iterOf[f.Step] = map[int]int64{}
					}
					iterOf[f.Step][r] = iters[i].Step
					if first < 0 || iters[i].Step < first {
						first = iters[i].Step
					}
				}
				dups := 0
				for _, v := range per {
					if v > 1 {
						dups++
					}
				}
				msg := fmt.Sprintf("rank %d: %d facts for %d iterations, first in iteration %d, %d outside the iterations, %d after the last, %d iterations with several",
					r, n, len(iters), first, outside, past, dups)
				if n < len(iters)-1 || n > len(iters)+1 || first != firstAt || outside > 0 || dups > 0 {
					t.Error(msg)
				} else {
					t.Log(msg)
				}
			}
			if loop == "trainer" || loop == "cudagraph" {
				return // no collective per iteration: the ranks are not coupled
			}
			apart := 0
			for _, m := range iterOf {
				if len(m) == 2 && m[0] != m[1] {
					apart++
				}
			}
			if apart > 0 {
				t.Errorf("%d step indices are different iterations on the two ranks", apart)
			}
		})
	}
}

// Issue 16: torch.compile's compile workers and data-loader workers are
// children of a rank that inherit its environment (RANK) and mappings.
// They are not more copies of the rank: the agent counts them apart and
// the job keeps its 4 ranks, one process each, with every step.
func TestRankWorkersAreNotRanks(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	const steps, workers = 120, 2
	sink, a, truth := ncclJob.runAll(t, 2*time.Second, "--steps", fmt.Sprint(steps), "--step-ms", "8", "--gpu-ms", "12",
		"--workers", fmt.Sprint(workers))
	got := a.Counters()
	if n := got["processes_rank_workers"]; n != 4*workers {
		t.Errorf("processes_rank_workers = %d, want %d (%d per rank)", n, 4*workers, workers)
	}
	perRank := map[int]int{}
	for _, f := range sink.steps {
		perRank[f.Rank]++
	}
	trainerPID := map[int]int{}
	for _, r := range truth["rank"] {
		trainerPID[r.Rank] = r.PID
	}
	if len(sink.topos) == 0 {
		t.Fatal("no topology reported")
	}
	pids := map[int][]int{} // rank -> processes the last topology names
	for _, ri := range sink.topos[len(sink.topos)-1].Ranks {
		pids[ri.Rank] = append(pids[ri.Rank], ri.PID)
	}
	for r := range 4 {
		if n := perRank[r]; n < steps-1 || n > steps+1 {
			t.Errorf("rank %d: %d steps, trainer ran %d", r, n, steps)
		}
		if len(pids[r]) != 1 || pids[r][0] != trainerPID[r] {
			t.Errorf("rank %d: the topology names processes %v, want only the trainer's %d", r, pids[r], trainerPID[r])
		}
	}
}

// logStepCounters logs, when t failed, what the agent counted of its step
// detection and of its input (a failure under load is otherwise hard to
// tell from a rule's).
func logStepCounters(t *testing.T, a *agent.Agent) {
	if !t.Failed() {
		return
	}
	c := a.Counters()
	var b strings.Builder
	for _, k := range []string{"events", "ringbuf_lost", "events_lost_queue", "correlate_late", "correlate_retracted_steps",
		"correlate_relocks", "correlate_irregular_calls", "correlate_init_calls", "correlate_burst_steps",
		"correlate_unassigned", "correlate_reordered", "correlate_arrival_timeouts", "correlate_invalid_steps"} {
		fmt.Fprintf(&b, " %s=%d", k, c[k])
	}
	t.Logf("agent counters:%s", b.String())
}
