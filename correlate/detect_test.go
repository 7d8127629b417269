package correlate

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// tokens of the iteration scripts
var script = map[byte]struct {
	op    Op
	count uint64
}{
	'A': {"allreduce", 1000},
	'B': {"allreduce", 10},
	'C': {"allgather", 64},
	'E': {"allreduce", 1},
	'X': {"broadcast", 99},
	'Y': {"broadcast", 98},
}

// simulate lays out iterations (scripts such as "AAB S") for every pid on
// communicator comm. Iteration i lasts dur; its tokens are evenly spaced
// and the last one ends at the iteration's end; a sync spans from the
// previous token to its slot. skew shifts a rank's host calls. It returns
// the end time of every iteration.
func simulate(b *batch, pids []uint32, comm uint64, iters []string, t0, dur int64, skew func(r, i int) int64) []int64 {
	ends := make([]int64, len(iters))
	base := t0
	for i, it := range iters {
		toks := strings.ReplaceAll(it, " ", "")
		for r, p := range pids {
			var off int64
			if skew != nil {
				off = skew(r, i)
			}
			prev := base
			for k := 0; k < len(toks); k++ {
				slot := base + int64(k+1)*dur/int64(len(toks))
				if toks[k] == 'S' {
					b.sync(p, prev, slot)
				} else {
					s := script[toks[k]]
					st := min(slot-20*us+off, slot-us)
					b.coll(p, comm, s.op, s.count, st, st+10*us)
				}
				prev = slot
			}
		}
		base += dur
		ends[i] = base
	}
	return ends
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// iterOf maps a step to the iteration whose end equals the step's end.
func iterOf(ends []int64, s detector.Step) int {
	for i, e := range ends {
		if e == s.EndNS {
			return i
		}
	}
	return -1
}

func TestStepDetection(t *testing.T) {
	warm := []string{"X S", "Y", "X X E S"}
	eval := repeat("E S", 10)
	tests := []struct {
		name  string
		iters []string
		// want: iteration number of each emitted step, in order
		want      func(n int) []int
		retracted bool
	}{{
		name:  "steady cycle",
		iters: repeat("AAB S", 20),
		want:  func(int) []int { return seq(1, 19) },
	}, {
		name:  "warm-up then lock",
		iters: concat(warm, repeat("AAB S", 20)),
		want:  func(int) []int { return seq(3, 22) }, // the warm-up's sync is a stable start
	}, {
		name:  "period change mid-run",
		iters: concat(repeat("A S", 20), repeat("A B S", 30)),
		want:  func(int) []int { return seq(1, 49) },
	}, {
		name:      "evaluation loop in between",
		iters:     concat(repeat("AAB S", 20), eval, repeat("AAB S", 20)),
		want:      func(int) []int { return append(seq(1, 19), seq(30, 49)...) },
		retracted: true,
	}, {
		name:  "checkpoint iteration",
		iters: concat(repeat("AAB S", 20), []string{"AACB S"}, repeat("AAB S", 20)),
		want:  func(int) []int { return append(seq(1, 19), seq(21, 40)...) },
	}, {
		name:  "two syncs per iteration",
		iters: repeat("AA S B S", 20),
		want:  func(int) []int { return seq(1, 19) },
	}, {
		name: "homogeneous buckets in the first iteration",
		// DDP-like: 200 equal bucket all-reduces, then the loss sync.
		iters: repeat(strings.Repeat("A", 200)+"B S", 12),
		want:  func(int) []int { return seq(1, 11) },
	}, {
		name:      "false sub-cycle in the first iteration",
		iters:     repeat("AS AS AS BS", 12),
		want:      func(int) []int { return seq(1, 11) },
		retracted: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(Config{}, 0)
			var b batch
			ends := simulate(&b, []uint32{pid(0)}, 1, tc.iters, 0, 10*ms, nil)
			b.feed(c)
			steps, _ := c.Flush()
			want := tc.want(len(tc.iters))
			var got []int
			for _, s := range steps {
				got = append(got, iterOf(ends, s))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("steps end iterations\n got %v\nwant %v", got, want)
			}
			checkContiguous(t, steps)
			if len(steps) > 0 && steps[0].Step != 0 {
				t.Errorf("first index %d", steps[0].Step)
			}
			for _, s := range steps {
				i := iterOf(ends, s)
				if i > 0 && s.StartNS != ends[i-1] {
					t.Errorf("step %d starts at %d, want %d", s.Step, s.StartNS, ends[i-1])
				}
			}
			st := c.Stats()[0]
			if (st.Retracted > 0) != tc.retracted {
				t.Errorf("retracted %d", st.Retracted)
			}
		})
	}
}

func seq(a, b int) []int {
	var out []int
	for i := a; i <= b; i++ {
		out = append(out, i)
	}
	return out
}

// Ranks of one communicator number the same iteration alike, whatever the
// timing, warm-up and excursions.
func TestCrossRankConsistency(t *testing.T) {
	cycles := []string{"AAB S", "A S", "ACA S B S", "AAAAAAAAB S", "CCCC S"}
	for trial := range 30 {
		rng := rand.New(rand.NewPCG(uint64(trial), 7))
		cyc := cycles[rng.IntN(len(cycles))]
		var iters []string
		iters = append(iters, "X S", "Y Y S")
		for range 3 {
			iters = append(iters, repeat(cyc, 5+rng.IntN(30))...)
			switch rng.IntN(3) {
			case 0:
				iters = append(iters, repeat("E S", 1+rng.IntN(20))...)
			case 1:
				iters = append(iters, "X "+cyc)
			}
		}
		const n = 4
		c := newTest(Config{}, 0, 1, 2, 3)
		for r := range n {
			c.AddCommInit(CommInit{PID: pid(r), Comm: uint64(0xc0 + r), NRanks: n, Rank: r, UniqueIDHash: 0xabc})
		}
		var b batch
		pids := []uint32{pid(0), pid(1), pid(2), pid(3)}
		jit := make([][]int64, n)
		for r := range jit {
			jit[r] = make([]int64, len(iters))
			for i := range jit[r] {
				jit[r][i] = -int64(rng.IntN(400)) * us // less than half a token slot: program order is kept
			}
		}
		// Each rank has its own clock offset of its iteration ends, too.
		ends := simulate(&b, pids, 0, iters, 0, 10*ms, func(r, i int) int64 { return jit[r][i] })
		for i := range b.host {
			b.host[i].Comm = uint64(0xc0 + b.host[i].PID - 100)
		}
		b.feed(c)
		steps, _ := c.Flush()
		m := byRank(steps)
		ref := map[int64]int{}
		for _, s := range m[0] {
			ref[s.Step] = iterOf(ends, s)
		}
		if len(m[0]) < 10 {
			t.Fatalf("trial %d: only %d steps", trial, len(m[0]))
		}
		for r := 1; r < n; r++ {
			if len(m[r]) != len(m[0]) {
				t.Fatalf("trial %d: rank %d has %d steps, rank 0 %d", trial, r, len(m[r]), len(m[0]))
			}
			for _, s := range m[r] {
				if it, ok := ref[s.Step]; !ok || it != iterOf(ends, s) {
					t.Fatalf("trial %d: rank %d step %d is iteration %d, rank 0's is %d", trial, r, s.Step, iterOf(ends, s), it)
				}
			}
		}
	}
}

// A single-GPU job without collectives: the synchronisation sequence is
// the clock once enough synchronisations showed that no collective comes.
func TestSyncFallback(t *testing.T) {
	c := newTest(Config{}, 0)
	for i := range 200 {
		base := int64(i) * 10 * ms
		c.AddHostCall(HostCall{PID: pid(0), Kind: HostSyncWait, Op: "cudaStreamSynchronize", Stream: 7, StartNS: base + 2*ms, EndNS: base + 3*ms})
		c.AddHostCall(HostCall{PID: pid(0), Kind: HostSyncWait, Op: "cudaDeviceSynchronize", StartNS: base + 8*ms, EndNS: base + 10*ms})
	}
	steps, _ := c.Flush()
	if len(steps) < 150 {
		t.Fatalf("%d steps", len(steps))
	}
	checkContiguous(t, steps)
	for _, s := range steps {
		if s.EndNS-s.StartNS != 10*ms || s.EndNS%(10*ms) != 0 {
			t.Fatalf("step %+v", s)
		}
		if !near(s.Phases["sync_wait"], 3) || !near(s.Phases["host"], 7) {
			t.Fatalf("phases %v", s.Phases)
		}
	}
}

// A configured marker overrides the collective clock; an explicit count is
// the step index.
func TestMarker(t *testing.T) {
	c := newTest(Config{}, 0)
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 10), 0, 10*ms, nil)
	b.feed(c)
	for i := range 10 {
		base := 100*ms + int64(i)*10*ms
		c.AddHostCall(HostCall{PID: pid(0), Kind: HostCollective, Op: "allreduce", Count: 1000, Comm: 1, StartNS: base + ms, EndNS: base + ms + 1})
		c.AddHostCall(HostCall{PID: pid(0), Kind: HostMarker, Count: uint64(500 + i), StartNS: base + 5*ms, EndNS: base + 5*ms})
	}
	steps, _ := c.Flush()
	var marks []detector.Step
	for _, s := range steps {
		if s.StartNS >= 100*ms {
			marks = append(marks, s)
		}
	}
	if len(marks) != 9 || marks[0].Step != 501 || marks[8].Step != 509 {
		t.Fatalf("marker steps %v", marks)
	}
	for _, s := range marks {
		if s.EndNS-s.StartNS != 10*ms {
			t.Fatalf("marker step %+v", s)
		}
	}
}

// A process in a small (TP) and a larger (DP) communicator: the larger one
// becomes the clock without losing steps; indices stay contiguous.
func TestClockTakeover(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCommInit(CommInit{PID: pid(0), Comm: 1, NRanks: 2, UniqueIDHash: 0x71})
	c.AddCommInit(CommInit{PID: pid(0), Comm: 2, NRanks: 4, UniqueIDHash: 0xd4})
	var b batch
	var ends []int64
	for i := range 30 {
		base := int64(i) * 10 * ms
		b.coll(pid(0), 1, "allreduce", 4096, base+1*ms, base+1*ms+us)
		b.coll(pid(0), 1, "allreduce", 4096, base+2*ms, base+2*ms+us)
		if i >= 10 { // the DP communicator carries traffic from iteration 10 on
			b.coll(pid(0), 2, "allreduce", 1<<20, base+5*ms, base+5*ms+us)
		}
		b.sync(pid(0), base+8*ms, base+10*ms)
		ends = append(ends, base+10*ms)
	}
	b.feed(c)
	steps, _ := c.Flush()
	checkContiguous(t, steps)
	var got []int
	for _, s := range steps {
		got = append(got, iterOf(ends, s))
	}
	// The TP clock runs from iteration 0 (started by the creation); the DP
	// communicator confirms at iteration 14 and takes over at the same
	// boundary.
	if fmt.Sprint(got) != fmt.Sprint(seq(0, 29)) || steps[0].Step != 0 {
		t.Fatalf("steps end iterations %v", got)
	}
}

// TestClockTakenByMoreRanks: a process's step clock is the first of its
// communicators to lock, and one with more ranks takes it over (more ranks
// agree on its numbering): at once while the clock is tentative, else once
// confirmed. The TP communicator's steps end at the synchronisation after
// its collective (3 ms into each 10 ms iteration), the DP communicator's
// at the one after its own (the iteration's end), so the clock shows in
// where the steps end.
func TestClockTakenByMoreRanks(t *testing.T) {
	tests := []struct {
		name   string
		dp     int   // the second communicator's ranks
		dpFrom int   // the iteration of its first collective
		end    int64 // where the steps end in their iteration
		latest int   // of the latest steps only (0: every step)
	}{
		{name: "more ranks while the clock is tentative", dp: 4, dpFrom: 0, end: 10 * ms},
		{name: "more ranks after the clock confirmed", dp: 4, dpFrom: 15, end: 10 * ms, latest: 10},
		{name: "as many ranks", dp: 2, dpFrom: 0, end: 3 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(Config{}, 0)
			c.AddCommInit(CommInit{PID: pid(0), Comm: 1, NRanks: 2, UniqueIDHash: 0x71})
			c.AddCommInit(CommInit{PID: pid(0), Comm: 2, NRanks: tc.dp, UniqueIDHash: 0xd4})
			var b batch
			for i := range 40 {
				base := int64(i) * 10 * ms
				b.coll(pid(0), 1, "allgather", 4096, base+1*ms, base+1*ms+us)
				b.sync(pid(0), base+2*ms, base+3*ms)
				if i >= tc.dpFrom {
					b.coll(pid(0), 2, "allreduce", 1<<20, base+4*ms, base+4*ms+us)
					b.coll(pid(0), 2, "allreduce", 1<<19, base+5*ms, base+5*ms+us)
				}
				b.sync(pid(0), base+8*ms, base+10*ms)
			}
			b.feed(c)
			steps, _ := c.Flush()
			checkContiguous(t, steps)
			if len(steps) < 20 {
				t.Fatalf("%d steps", len(steps))
			}
			from := 0
			if tc.latest > 0 {
				from = len(steps) - tc.latest
			}
			for _, s := range steps[from:] {
				if e := (s.EndNS-1)%(10*ms) + 1; e != tc.end {
					t.Fatalf("step %d ends %v into its iteration, want %v", s.Step, time.Duration(e), time.Duration(tc.end))
				}
			}
		})
	}
}

// TestSyncClockKeptAgainstCoarserCommunicator: a communicator whose steps
// are more than twice as long as the steps of a confirmed or steady
// synchronisation clock does not take that clock over (the Trainer's
// logging all-gather every N iterations), also where each of its steps
// holds no more of the clock's steps than an iteration may hold instances
// of a cycle (stepdet.MaxGroup), so that spansIterations keeps nothing.
func TestSyncClockKeptAgainstCoarserCommunicator(t *testing.T) {
	for _, every := range []int{3, 8} {
		t.Run(fmt.Sprintf("a collective every %d iterations", every), func(t *testing.T) {
			c := newTest(Config{}, 0)
			c.AddCommInit(CommInit{PID: pid(0), Comm: 1, NRanks: 2, UniqueIDHash: 0x71})
			var b batch
			const iters = 200
			for i := range iters {
				base := int64(i) * 10 * ms
				if i >= 100 && i%every == 0 { // after the synchronisation clock confirmed
					b.coll(pid(0), 1, "allgather", 4096, base+5*ms, base+5*ms+us)
				}
				b.sync(pid(0), base+8*ms, base+10*ms)
			}
			b.feed(c)
			steps, _ := c.Flush()
			checkContiguous(t, steps)
			if len(steps) < iters-80 {
				t.Fatalf("%d steps for %d iterations", len(steps), iters)
			}
			for _, s := range steps {
				if s.EndNS-s.StartNS != 10*ms {
					t.Fatalf("step %d lasts %v: not one iteration", s.Step, time.Duration(s.EndNS-s.StartNS))
				}
			}
		})
	}
}

// Without any synchronisation a cycle is accepted after NoSyncMinCalls
// calls; steps end at the return of the cycle's last collective.
func TestNoSync(t *testing.T) {
	c := newTest(Config{NoSyncMinCalls: 64}, 0)
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AAB", 100), 0, 10*ms, nil)
	b.feed(c)
	steps, _ := c.Flush()
	checkContiguous(t, steps)
	if len(steps) < 70 || len(steps) > 99 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		if s.EndNS%(10*ms) != 10*ms-10*us || s.EndNS-s.StartNS != 10*ms { // B returns 10 µs before the slot
			t.Fatalf("step %+v", s)
		}
	}
}

// TestMidRunAttachAligned: an agent (re)started during training sees
// neither the communicators' creation nor the start of the sequence, and
// each rank's records begin at another call of the iteration. Counted from
// there, ranks could number one iteration apart; the first step of each is
// aligned to a peer's step ending at the same time, so that step k is the
// same iteration on every rank.
func TestMidRunAttachAligned(t *testing.T) {
	cycles := []string{"AAB S", "ACA S B S", "AAAAAAAAB S", "CCCC S"}
	misaligned := 0
	for trial := range 40 {
		rng := rand.New(rand.NewPCG(uint64(trial), 11))
		cyc := cycles[rng.IntN(len(cycles))]
		iters := repeat(cyc, 30)
		const n = 4
		pids := []uint32{pid(0), pid(1), pid(2), pid(3)}
		var all batch
		ends := simulate(&all, pids, 0, iters, 0, 10*ms, func(r, i int) int64 { return -int64(rng.IntN(400)) * us })
		// Rank r's first record is its skip[r]-th call (within the first two iterations).
		perIter := len(strings.ReplaceAll(cyc, " ", ""))
		skip := make(map[uint32]int)
		for _, p := range pids {
			skip[p] = rng.IntN(2 * perIter)
		}
		seen := make(map[uint32]int)
		var b batch
		for _, h := range all.host {
			seen[h.PID]++
			if seen[h.PID] > skip[h.PID] {
				h.Comm = uint64(0xc0 + h.PID - 100)
				b.host = append(b.host, h)
			}
		}
		c := New(Config{ConfirmSpan: testSpan})
		for r := range n {
			c.SetRank(RankInfo{PID: pid(r), Rank: r, LocalRank: r, WorldSize: n, Host: "h0", Job: "j1", MidRun: true})
		}
		b.feed(c)
		steps, _ := c.Flush()
		m := byRank(steps)
		ref := map[int64]int{}
		for r := range n {
			for _, s := range m[r] {
				it := iterOf(ends, s)
				if want, ok := ref[s.Step]; ok && want != it {
					misaligned++
					t.Errorf("trial %d (%q, skips %v): rank %d step %d is iteration %d, another rank's is %d", trial, cyc, skip, r, s.Step, it, want)
					break
				}
				ref[s.Step] = it
			}
			if len(m[r]) < 20 {
				t.Fatalf("trial %d: rank %d has %d steps", trial, r, len(m[r]))
			}
		}
	}
	if misaligned > 0 {
		t.Fatalf("%d ranks numbered apart", misaligned)
	}
}
