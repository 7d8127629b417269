package correlate

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Issue 16: init-time bursts (a parameter broadcast whose sizes repeat
// layer by layer, a barrier storm) are periodic but brief and precede the
// training cycle: they make no steps. The first step is the first
// iteration, one step per iteration, the skipped collectives are counted.
func TestInitBurstsMakeNoSteps(t *testing.T) {
	layers := repeat("XXY S", 40) // per-layer broadcasts: a cycle of 4 calls, 40 times
	barriers := repeat("E S", 60)
	tests := []struct {
		name  string
		init  []string
		train []string
		// wantIters: the iterations that are steps, in order.
		wantIters []int
	}{{
		name:      "broadcast per layer, then barriers",
		init:      concat(layers, barriers),
		train:     repeat("AAB S", 300),
		wantIters: seq(0, 299),
	}, {
		name:      "barrier storm only",
		init:      barriers,
		train:     repeat("AAB S", 300),
		wantIters: seq(0, 299),
	}, {
		name: "periodic evaluation bursts during training",
		init: concat(layers, barriers),
		// Every 250 iterations an 8-batch evaluation loop.
		train: func() []string {
			var it []string
			for range 3 {
				it = append(it, repeat("AAB S", 250)...)
				it = append(it, repeat("E S", 8)...)
			}
			return it
		}(),
		wantIters: func() []int {
			var w []int
			for k := range 3 {
				w = append(w, seq(258*k, 258*k+249)...)
			}
			return w
		}(),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{}) // the default ConfirmSpan
			c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 1, Host: "h0", Job: "j1"})
			c.AddCommInit(CommInit{PID: pid(0), Comm: 1, NRanks: 1, UniqueIDHash: 0x5, AtNS: 0})
			var b batch
			// Init calls 0.2 ms apart, iterations of 10 ms.
			initDur := 200 * us * int64(len(strings.ReplaceAll(tc.init[0], " ", "")))
			simulate(&b, []uint32{pid(0)}, 1, tc.init, ms, initDur, nil)
			t0 := ms + int64(len(tc.init))*initDur
			ends := simulate(&b, []uint32{pid(0)}, 1, tc.train, t0, 10*ms, nil)
			b.feed(c)
			steps, _ := c.Flush()
			var got []int
			for _, s := range steps {
				got = append(got, iterOf(ends, s))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantIters) {
				t.Fatalf("steps end iterations\n got %v\nwant %v", got, tc.wantIters)
			}
			checkContiguous(t, steps)
			if steps[0].Step != 0 || steps[0].StartNS != t0 {
				t.Errorf("first step %d starts at %d, want 0 at %d (the last init synchronisation)", steps[0].Step, steps[0].StartNS, t0)
			}
			var initCalls uint64
			for _, it := range tc.init {
				initCalls += uint64(len(strings.ReplaceAll(strings.ReplaceAll(it, " ", ""), "S", "")))
			}
			if st := c.Stats()[0]; st.InitCalls != initCalls {
				t.Errorf("init calls %d, want %d", st.InitCalls, initCalls)
			}
		})
	}
}

// The default ConfirmSpan holds a first cycle back, but never loses it: a
// job shorter than the span, and buffers filling up during the span.
func TestFirstCycleReleased(t *testing.T) {
	t.Run("job shorter than the span", func(t *testing.T) {
		c := New(Config{})
		c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 1, Host: "h0", Job: "j1"})
		var b batch
		simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 20), 0, 10*ms, nil)
		b.feed(c)
		c.Forget(pid(0))
		if st := c.Stats()[0]; st.Steps != 19 || st.Retracted != 0 {
			t.Fatalf("%d steps, %d retracted; want 19, 0", st.Steps, st.Retracted)
		}
	})
	t.Run("buffers half full", func(t *testing.T) {
		c := New(Config{MaxPending: 64})
		c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 1, Host: "h0", Job: "j1"})
		var b batch
		var n int
		for i := range 150 { // 1.5 s < the span
			simulate(&b, []uint32{pid(0)}, 1, []string{"AB S"}, int64(i)*10*ms, 10*ms, nil)
			b.feed(c)
			steps, _ := c.Drain()
			n += len(steps)
		}
		if st := c.Stats()[0]; n < 100 || st.Evicted != 0 {
			t.Fatalf("%d steps drained before the end, %d evicted", n, st.Evicted)
		}
	})
}

// Issue 16: every member of a communicator cuts its steps at the same call
// of the cycle and numbers them alike, whatever its recording saw: the
// communicator's creation or not (a late dlopen of NCCL, an agent started
// late, not necessarily long enough to count as mid-run), an init prefix
// or not. Coupled ranks end their iterations together, so step k must end
// at the same iteration end on every rank.
func TestCutPointIndependentOfAttach(t *testing.T) {
	cycles := []string{"AAB S", "ACA S B S", "AAAAAAAAB S", "CCCC S", "AS AS AS BS"}
	for trial := range 60 {
		rng := rand.New(rand.NewPCG(uint64(trial), 16))
		cyc := cycles[rng.IntN(len(cycles))]
		const n = 4
		pids := []uint32{pid(0), pid(1), pid(2), pid(3)}
		var all batch
		simulate(&all, pids, 0, repeat("X S", 5), 0, ms, nil) // an init prefix
		ends := simulate(&all, pids, 0, repeat(cyc, 40), 5*ms, 10*ms, func(r, i int) int64 { return -int64(rng.IntN(400)) * us })
		// Rank r sees its communicator's creation (and everything), or its
		// records begin at its skip[r]-th call without the creation.
		perIter := len(strings.ReplaceAll(cyc, " ", ""))
		skip := make(map[uint32]int)
		seesInit := make(map[uint32]bool)
		c := New(Config{ConfirmSpan: testSpan})
		for r, p := range pids {
			c.SetRank(RankInfo{PID: p, Rank: r, LocalRank: r, WorldSize: n, Host: "h0", Job: "j1", MidRun: rng.IntN(3) == 0})
			if seesInit[p] = rng.IntN(2) == 0; seesInit[p] {
				c.AddCommInit(CommInit{PID: p, Comm: uint64(0xc0 + r), NRanks: n, Rank: r, UniqueIDHash: 0xabc})
			} else {
				skip[p] = rng.IntN(10 + 3*perIter)
			}
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
		b.feed(c)
		steps, _ := c.Flush()
		m := byRank(steps)
		ref := map[int64]int{}
		for r := range n {
			if len(m[r]) < 30 {
				t.Fatalf("trial %d (%q): rank %d has %d steps", trial, cyc, r, len(m[r]))
			}
			for _, s := range m[r] {
				it := iterOf(ends, s)
				if it < 0 {
					t.Fatalf("trial %d (%q, creation seen %v, skips %v): rank %d step %d ends at %d, at no iteration end",
						trial, cyc, seesInit, skip, r, s.Step, s.EndNS)
				}
				if want, ok := ref[s.Step]; ok && want != it {
					t.Fatalf("trial %d (%q, creation seen %v, skips %v): rank %d step %d is iteration %d, another rank's is %d",
						trial, cyc, seesInit, skip, r, s.Step, it, want)
				}
				ref[s.Step] = it
			}
		}
	}
}
