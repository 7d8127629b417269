package correlate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// glooJob lays out a DDP-like job whose collectives carry no sizes (torch
// c10d probes): per iteration a forward pass, a burst of bucket
// all-reduces, the optimizer, and optionally a timer synchronisation.
type glooJob struct {
	iters   int
	dur     int64          // iteration length
	ops     string         // burst of one iteration: 'a' allreduce, 'b' broadcast
	first   string         // burst of iteration 0 when it differs (before DDP's bucket rebuild)
	odd     map[int]string // burst of iteration i when it differs
	from    int            // iteration from which `later` replaces ops (0: never)
	later   string
	bcast   bool    // a buffer broadcast at a quarter of the iteration (broadcast_buffers)
	timer   bool    // cudaDeviceSynchronize at the end of each iteration
	worker  bool    // a stream sync after each call on another thread (gloo's CUDA path)
	jitter  float64 // relative jitter of every gap
	preempt float64 // probability that a gap is lengthened by up to 8 ms (a loaded host)
	pause   map[int]int64
	stall   map[int]int64 // a host stall inside iteration i's burst
	hold    hostStall     // a host stall inside every burst from an iteration on
	eval    map[int]int   // broadcast calls of an evaluation loop before iteration i
	calib   int           // all-reduces 0.5 ms apart after a barrier, before iteration 0 (an init-time calibration)
}

// hostStall is a host stall of ns before call at of every burst from
// iteration from on (a sleep at a fixed point of the iteration).
type hostStall struct {
	from, at int
	ns       int64
}

func (h hostStall) of(i, k int) int64 {
	if h.ns == 0 || i < h.from || k != h.at {
		return 0
	}
	return h.ns
}

// lay adds the job of one rank to b and returns, per iteration, the end
// a step of that iteration must have (the stable point after its burst).
func (j glooJob) lay(b *batch, p uint32, seed uint64) []int64 {
	rng := rand.New(rand.NewPCG(seed, 99))
	jit := func(v int64) int64 {
		if j.jitter != 0 {
			v = int64(float64(v) * (1 + j.jitter*(2*rng.Float64()-1)))
		}
		if j.preempt > 0 && rng.Float64() < j.preempt {
			v += int64(rng.IntN(8000)) * us
		}
		return v
	}
	call := func(op Op, st int64) int64 {
		b.host = append(b.host, HostCall{PID: p, TID: p, Kind: HostCollective, Op: op, Comm: 0x600d, StartNS: st, EndNS: st + 20*us})
		if j.worker {
			b.host = append(b.host, HostCall{PID: p, TID: p + 1, Kind: HostSyncWait, Op: "cudaStreamSynchronize", StartNS: st, EndNS: st + 50*us})
		}
		return st + 20*us
	}
	ends := make([]int64, j.iters)
	var base int64
	if j.calib > 0 {
		call("barrier", 0)
		for k := range j.calib {
			call(OpAllReduce, 2*ms+int64(k)*500*us)
		}
		base = 2*ms + int64(j.calib)*500*us
	}
	for i := range j.iters {
		base += j.pause[i]
		for range j.eval[i] {
			call("broadcast", base+j.dur/4)
			base += j.dur / 2
		}
		ops := j.ops
		if i == 0 && j.first != "" {
			ops = j.first
		}
		if j.from > 0 && i >= j.from {
			ops = j.later
		}
		if o, ok := j.odd[i]; ok {
			ops = o
		}
		t := base + jit(j.dur/2)
		if j.bcast {
			call("broadcast", base+jit(j.dur/4))
		}
		var last int64
		for k, op := range ops {
			if k > 0 {
				t += jit(3 * j.dur / 10 / int64(len(ops)))
			}
			if k == 1 {
				t += j.stall[i]
			}
			t += j.hold.of(i, k)
			name := map[rune]Op{'a': OpAllReduce, 'b': OpBroadcast}[op]
			last = call(name, t)
			t = last
		}
		end := max(base+j.dur+j.stall[i], last+j.dur/10)
		if j.timer {
			b.sync(p, last+j.dur/20, end)
		}
		switch {
		case j.worker:
			ends[i] = last + 30*us
		case j.timer:
			ends[i] = end
		default:
			ends[i] = last
		}
		base = end
	}
	return ends
}

func run1(t *testing.T, j glooJob) ([]detector.Step, []int64, RankStats) {
	t.Helper()
	c := newTest(Config{}, 0)
	var b batch
	ends := j.lay(&b, pid(0), 1)
	b.feed(c)
	steps, _ := c.Flush()
	return steps, ends, c.Stats()[0]
}

// iterations maps steps to iterations and checks that each step is one
// whole iteration: it ends at an iteration's stable point and starts at
// the previous one's (the first step after a lock may start later).
func iterations(t *testing.T, steps []detector.Step, ends []int64) []int {
	t.Helper()
	var got []int
	for k, s := range steps {
		it := iterOf(ends, s)
		if it < 0 {
			t.Fatalf("step %d [%d, %d] ends inside an iteration", s.Step, s.StartNS, s.EndNS)
		}
		if it == 0 || s.StartNS != ends[it-1] {
			t.Fatalf("step %d (iteration %d) starts at %d, not at the previous iteration's end", s.Step, it, s.StartNS)
		}
		if k > 0 && s.Step <= steps[k-1].Step {
			t.Fatalf("step index %d after %d", s.Step, steps[k-1].Step)
		}
		got = append(got, it)
	}
	return got
}

func TestBurstSteps(t *testing.T) {
	base := glooJob{iters: 40, dur: 20 * ms, ops: "aaaa", timer: true}
	with := func(f func(*glooJob)) glooJob { j := base; f(&j); return j }
	tests := []struct {
		name string
		job  glooJob
		want []int // iterations of the steps; nil: see min
		min  int   // at least this many steps when want is nil
	}{
		{name: "steady", job: base, want: seq(1, 38)},
		{name: "no synchronisation", job: with(func(j *glooJob) { j.timer = false }), want: seq(1, 38)},
		{name: "worker syncs per bucket", job: with(func(j *glooJob) { j.worker = true }), want: seq(1, 38)},
		{name: "fewer buckets before the rebuild", job: with(func(j *glooJob) { j.first = "aaa" }), want: seq(1, 38)},
		{name: "more buckets before the rebuild", job: with(func(j *glooJob) { j.first = "aaaaaaa" }), want: seq(1, 38)},
		{name: "two buckets", job: with(func(j *glooJob) { j.ops = "aa" }), want: seq(1, 38)},
		{name: "forty buckets", job: with(func(j *glooJob) { j.ops = strings.Repeat("a", 40) }), want: seq(1, 38)},
		{name: "jitter", job: with(func(j *glooJob) { j.jitter = 0.3 }), want: seq(1, 38)},
		{name: "evaluation pause without collectives",
			job: with(func(j *glooJob) { j.pause = map[int]int64{20: 3000 * ms} }), want: seq(1, 38)},
		// The loop leaves the cycle: the interrupted iteration is dropped;
		// the known cycle is back one burst later.
		{name: "evaluation loop with broadcasts",
			job:  with(func(j *glooJob) { j.eval = map[int]int{20: 10} }),
			want: append(seq(1, 19), seq(21, 38)...)},
		// A stall inside one backward pass: the confirmed lock cuts by
		// count through it.
		{name: "stall inside a burst",
			job: with(func(j *glooJob) { j.stall = map[int]int64{25: 30 * ms} }), want: seq(1, 38)},
		// ... and the next step's data loading is preempted, too.
		{name: "stall, then a long boundary gap",
			job:  with(func(j *glooJob) { j.stall, j.pause = map[int]int64{25: 30 * ms}, map[int]int64{27: 25 * ms} }),
			want: seq(1, 38)},
		// From iteration 10 on, a host stall at a fixed point of every
		// burst makes a second long gap: 11.5 ms against the boundary's 12
		// (the iteration grows to 28 ms), so that neither dominates the
		// other. The confirmed lock keeps every burst by its count.
		{name: "host stall inside every burst from iteration 10",
			job: with(func(j *glooJob) { j.hold = hostStall{from: 10, at: 1, ns: 10 * ms} }), want: seq(1, 38)},
		{name: "host stall before every burst's last call from iteration 10",
			job: with(func(j *glooJob) { j.hold = hostStall{from: 10, at: 3, ns: 10 * ms} }), want: seq(1, 38)},
		{name: "host stall inside every burst, jitter",
			job: with(func(j *glooJob) { j.hold, j.jitter = hostStall{from: 10, at: 1, ns: 10 * ms}, 0.2 }), want: seq(1, 38)},
		// The boundary gaps before the stall were 44 ms (slow data
		// loading before iterations 7-10): the stall's boundary gaps, 12 ms,
		// are of a bucket's size beside them, but still dominate every
		// gap of their burst but the stall's.
		{name: "host stall inside every burst after longer boundary gaps",
			job: with(func(j *glooJob) {
				j.hold, j.pause = hostStall{from: 10, at: 1, ns: 10 * ms}, map[int]int64{7: 30 * ms, 8: 30 * ms, 9: 30 * ms, 10: 30 * ms}
			}), want: seq(1, 38)},
		{name: "loaded host", job: with(func(j *glooJob) { j.iters, j.preempt, j.jitter = 200, 0.05, 0.2 }), min: 180},
		{name: "buffer broadcast before the buckets",
			job: with(func(j *glooJob) { j.bcast = true }), min: 35},
		// A changed bucket count makes no step of two iterations: the
		// old count's position falls on the new bursts at gaps of a
		// bucket's size (more buckets, one fewer), or at every other
		// boundary (half as many: each burst counted is two equal parts,
		// which keptByCount does not keep). The new period's lock reaches
		// back to its first burst: no iteration is lost (before the
		// reach-back, the one or two where the count changed were).
		{name: "bucket count changes", job: with(func(j *glooJob) { j.iters, j.from, j.later = 80, 30, "aaaaaa" }),
			want: seq(1, 78)},
		{name: "bucket count grows by one", job: with(func(j *glooJob) { j.iters, j.from, j.later, j.jitter = 80, 30, "aaaaa", 0.2 }),
			want: seq(1, 78)},
		{name: "bucket count doubles", job: with(func(j *glooJob) { j.iters, j.from, j.later = 80, 30, "aaaaaaaa" }),
			want: seq(1, 78)},
		{name: "bucket count shrinks by one", job: with(func(j *glooJob) { j.iters, j.from, j.later, j.jitter = 80, 30, "aaa", 0.2 }),
			want: seq(1, 78)},
		{name: "bucket count halves", job: with(func(j *glooJob) { j.iters, j.from, j.later = 80, 30, "aa" }),
			want: seq(1, 78)},
		{name: "bucket count halves, jitter", job: with(func(j *glooJob) { j.iters, j.from, j.later, j.jitter = 80, 30, "aa", 0.2 }),
			want: seq(1, 78)},
		{name: "one bucket", job: with(func(j *glooJob) { j.iters, j.ops = 120, "a" }), min: 110},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			steps, ends, st := run1(t, tc.job)
			got := iterations(t, steps, ends)
			if tc.want != nil && fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("steps are iterations\n got %v\nwant %v", got, tc.want)
			}
			if tc.want == nil && len(got) < tc.min {
				t.Fatalf("%d steps, want at least %d: %v", len(got), tc.min, got)
			}
			// Steps are numbered by call count: where the bucket count
			// changes, the new lock reaching back before the latest
			// numbering's anchor (a relock of the old cycle that broke
			// again) extends it backwards, skipping at most one index.
			for k := 1; k < len(steps) && tc.job.from > 0; k++ {
				if d := (steps[k].Step - steps[k-1].Step) - int64(got[k]-got[k-1]); d < 0 || d > 1 {
					t.Fatalf("step %d (iteration %d) after step %d (iteration %d)", steps[k].Step, got[k], steps[k-1].Step, got[k-1])
				}
			}
			t.Logf("%d steps; irregular %d, relocks %d, retracted %d", len(steps), st.IrregularCalls, st.Relocks, st.Retracted)
		})
	}
}

// A gap lock's first step reaches back over the whole iterations before
// the earliest dominated burst: bursts of the cycle's tokens whose start
// gap dominates every gap inside them. Iteration 0's burst holding the
// first forward pass (the H200 gloo captures: a 372 ms gap before its
// first bucket, 85 ms after its last) is dominated by no gap after it, so
// that the earliest dominated burst is iteration 1's and the lock's first
// step was iteration 3; iteration 0's first call has no gap before it
// unless calls of another signature precede it (the CPU gloo capture's
// barrier): then its step starts at the end of the latest of them.
func TestBurstLockReachesBackOverWholeIterations(t *testing.T) {
	base := glooJob{iters: 40, dur: 20 * ms, ops: "aaaa", timer: true}
	with := func(f func(*glooJob)) glooJob { j := base; f(&j); return j }
	tests := []struct {
		name string
		job  glooJob
		want []int
	}{
		{name: "first forward pass inside iteration 0's burst",
			job: with(func(j *glooJob) { j.stall = map[int]int64{0: 300 * ms} }), want: seq(1, 39)},
		{name: "first forward pass, jitter",
			job: with(func(j *glooJob) { j.stall, j.jitter = map[int]int64{0: 300 * ms}, 0.2 }), want: seq(1, 39)},
		{name: "steady", job: base, want: seq(1, 39)},
		{name: "init broadcasts before iteration 0",
			job: with(func(j *glooJob) { j.eval = map[int]int{0: 3} }), want: seq(0, 39)},
		// ... but not over the calibration's all-reduces before it, a
		// burst of the cycle's length whose start gap dominates the gaps
		// inside it but is of a bucket's size (2 ms against 15.5).
		{name: "init all-reduces before iteration 0",
			job: with(func(j *glooJob) { j.calib = 4 }), want: seq(0, 39)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(Config{}, 0)
			var b batch
			ends := tc.job.lay(&b, pid(0), 1)
			var before []int64 // ends of the collectives up to iteration 0's end
			for _, h := range b.host {
				if h.Kind == HostCollective && h.EndNS <= ends[0] {
					before = append(before, h.EndNS)
				}
			}
			slices.Sort(before)
			var initEnd int64 // the latest call before iteration 0's burst
			if k := len(before) - len(tc.job.ops) - 1; k >= 0 {
				initEnd = before[k]
			}
			b.feed(c)
			c.Forget(pid(0))
			steps, _ := c.Flush()
			var got []int
			for k, s := range steps {
				it := iterOf(ends, s)
				start := initEnd
				if it > 0 {
					start = ends[it-1]
				}
				if it < 0 || s.StartNS != start {
					t.Fatalf("step %d [%d, %d] is not iteration %d [%d, %d]", s.Step, s.StartNS, s.EndNS, it, start, s.EndNS)
				}
				if s.Step != int64(it-tc.want[0])+steps[0].Step || k > 0 && s.Step <= steps[k-1].Step {
					t.Fatalf("step %d is iteration %d: not numbered by count from step %d, iteration %d", s.Step, it, steps[0].Step, tc.want[0])
				}
				got = append(got, it)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("steps are iterations\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// The reach-back stops at a burst that is not verifiably a whole
// iteration of the cycle: one of other tokens (a broadcast in place of a
// bucket's all-reduce), or one whose start gap does not dominate a gap
// inside it (a 30 ms stall in its backward pass, twice the boundary).
// The iterations after it are steps, the iteration itself is none.
func TestBurstLockReachesBackOnlyOverWholeIterations(t *testing.T) {
	base := glooJob{iters: 40, dur: 20 * ms, ops: "aaaa", timer: true}
	with := func(f func(*glooJob)) glooJob { j := base; f(&j); return j }
	tests := []struct {
		name string
		job  glooJob
		want []int
	}{
		{name: "iteration 1's burst of other tokens",
			job: with(func(j *glooJob) { j.odd = map[int]string{1: "abaa"} }), want: seq(2, 38)},
		{name: "iteration 1's start dominates not its stall",
			job: with(func(j *glooJob) { j.stall = map[int]int64{1: 30 * ms} }), want: seq(2, 38)},
		{name: "iteration 1's stall, jitter",
			job: with(func(j *glooJob) { j.stall, j.jitter = map[int]int64{1: 30 * ms}, 0.2 }), want: seq(2, 38)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			steps, ends, _ := run1(t, tc.job)
			if got := iterations(t, steps, ends); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("steps are iterations\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// Phases are measured on burst steps as on token steps: the timer's wait
// is sync_wait, the rest host.
func TestBurstPhases(t *testing.T) {
	steps, ends, _ := run1(t, glooJob{iters: 20, dur: 20 * ms, ops: "aaaa", timer: true})
	iterations(t, steps, ends)
	for _, s := range steps {
		// The timer waits from 1 ms after the last bucket's return (14.58 ms) to 20 ms.
		if sw := s.Phases["sync_wait"]; !near(sw, 4.42) || !near(sw+s.Phases["host"], s.Phases["step"]) {
			t.Fatalf("phases %v", s.Phases)
		}
	}
}

// Ranks number the same iteration alike: their timing differs and one of
// them stalls inside a burst, or inside every burst from some iteration on. (Like the token detector's, the numbering
// counts calls since the attach: ranks attached at different calls of a
// running job are not aligned.)
func TestBurstCrossRank(t *testing.T) {
	for trial := range 20 {
		rng := rand.New(rand.NewPCG(uint64(trial), 3))
		j := glooJob{iters: 60, dur: 20 * ms, ops: strings.Repeat("a", 2+rng.IntN(8)), timer: rng.IntN(2) == 0,
			worker: rng.IntN(2) == 0, jitter: 0.2}
		if rng.IntN(2) == 0 {
			j.first = strings.Repeat("a", 1+rng.IntN(10))
		}
		if rng.IntN(2) == 0 {
			j.eval = map[int]int{30: 1 + rng.IntN(10)}
		}
		if rng.IntN(3) == 0 {
			j.bcast = true
		}
		if rng.IntN(3) == 0 {
			j.preempt = 0.01
		}
		if rng.IntN(3) == 0 {
			j.pause = map[int]int64{40: int64(rng.IntN(3000)) * ms}
		}
		const n = 3
		c := newTest(Config{}, 0, 1, 2)
		var b batch
		var ends [n][]int64
		for r := range n {
			jr := j
			if r == 1 {
				jr.stall = map[int]int64{15 + rng.IntN(20): 40 * ms}
				// In half the trials it also stalls inside every burst
				// from some iteration after the evaluation loop on (a lock
				// lost while every burst stalls is not found again; not at
				// the middle of a burst of two, which a halved bucket count
				// would look like).
				if len(j.ops) >= 3 && rng.IntN(2) == 0 {
					jr.hold = hostStall{from: 32 + rng.IntN(20), at: 1, ns: 10 * ms}
				}
			}
			ends[r] = jr.lay(&b, pid(r), uint64(trial*n+r))
		}
		b.feed(c)
		steps, _ := c.Flush()
		m := byRank(steps)
		for r := range n {
			iterations(t, m[r], ends[r])
		}
		ref := map[int64]int{}
		for _, s := range m[0] {
			ref[s.Step] = iterOf(ends[0], s)
		}
		if len(m[0]) < 45 {
			t.Fatalf("trial %d (%+v): rank 0 has %d steps", trial, j, len(m[0]))
		}
		for r := 1; r < n; r++ {
			if len(m[r]) < 45 {
				t.Fatalf("trial %d: rank %d has %d steps", trial, r, len(m[r]))
			}
			for _, s := range m[r] {
				if it, ok := ref[s.Step]; ok && it != iterOf(ends[r], s) {
					t.Fatalf("trial %d (%+v): rank %d step %d is iteration %d, rank 0's is %d", trial, j, r, s.Step, iterOf(ends[r], s), it)
				}
			}
		}
	}
}

// A communicator whose first call has no size but later ones do is handed
// to the token detector: NCCL behaviour does not change.
func TestBurstHandsOverToTokens(t *testing.T) {
	c := newTest(Config{}, 0)
	var b batch
	b.coll(pid(0), 1, "allreduce", 0, 0, 10*us)
	ends := simulate(&b, []uint32{pid(0)}, 1, repeat("AAB S", 20), ms, 10*ms, nil)
	b.feed(c)
	steps, _ := c.Flush()
	if len(steps) != 19 || iterOf(ends, steps[0]) != 1 {
		t.Fatalf("%d steps", len(steps))
	}
}

// When the process is gone, its last burst is a step too.
func TestBurstLastStepOnForget(t *testing.T) {
	c := newTest(Config{}, 0)
	var b batch
	ends := glooJob{iters: 20, dur: 20 * ms, ops: "aaaa", timer: true}.lay(&b, pid(0), 1)
	b.feed(c)
	c.Forget(pid(0))
	steps, _ := c.Flush()
	if got := iterations(t, steps, ends); fmt.Sprint(got) != fmt.Sprint(seq(1, 19)) {
		t.Fatalf("steps are iterations %v", got)
	}
}
