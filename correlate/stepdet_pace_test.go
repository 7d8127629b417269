package correlate

import (
	"fmt"
	"sort"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// syncIter: one iteration of d with one long synchronisation at its end
// (loss.item()), and k short ones (a burst) from burstAt, gap apart.
func syncIter(d int64, k int, burstAt, gap int64) []loopCall {
	cs := []loopCall{{sync: true, at: d - 10*ms, dur: 9 * ms}}
	for j := range k {
		cs = append(cs, loopCall{sync: true, at: burstAt + int64(j)*gap, dur: 5 * us})
	}
	return cs
}

func burstSteps(c *Correlator) uint64 {
	var n uint64
	for _, st := range c.Stats() {
		n += st.BurstSteps
	}
	return n
}

// TestBurstsAreNoSteps: boundaries far shorter than the recent steps are
// held and merged into the next step (or dropped at the end), counted as
// BurstSteps; a genuine change of pace becomes the pace, its iterations
// steps after all.
func TestBurstsAreNoSteps(t *testing.T) {
	tests := []struct {
		name   string
		script loopScript
		after  int  // facts allowed after the last iteration
		burst  bool // BurstSteps > 0
	}{{
		name: "a burst after the last iteration (an epilogue)",
		script: loopScript{n: 200, iter: func(int) ([]loopCall, int64) { return syncIter(37*ms, 0, 0, 0), 37 * ms },
			post: syncIter(0, 67, 340*ms, 200*us)[1:]},
		after: 1, burst: true,
	}, {
		name: "a burst inside one iteration (a recompilation)",
		script: loopScript{n: 200, iter: func(i int) ([]loopCall, int64) {
			if i == 100 {
				return syncIter(2000*ms, 150, 2*ms, 3*ms), 2000 * ms
			}
			return syncIter(37*ms, 0, 0, 0), 37 * ms
		}},
		burst: true,
	}, {
		name: "a burst between two iterations (a checkpoint's copies)",
		script: loopScript{n: 200, iter: func(i int) ([]loopCall, int64) {
			if i == 120 {
				return syncIter(37*ms, 80, 30*ms+500*us, 50*us), 37 * ms
			}
			return syncIter(37*ms, 0, 0, 0), 37 * ms
		}},
		burst: true,
	}, {
		name: "speeds up 3x after warm-up",
		script: loopScript{n: 300, iter: func(i int) ([]loopCall, int64) {
			if i < 50 {
				return syncIter(90*ms, 0, 0, 0), 90 * ms
			}
			return syncIter(30*ms, 0, 0, 0), 30 * ms
		}},
	}, {
		// Held for ConfirmSpan (2 s), then reported.
		name: "speeds up 10x after warm-up",
		script: loopScript{n: 400, iter: func(i int) ([]loopCall, int64) {
			if i < 50 {
				return syncIter(300*ms, 0, 0, 0), 300 * ms
			}
			return syncIter(30*ms, 0, 0, 0), 30 * ms
		}},
	}, {
		// Every 50th iteration (a logging step) keeps the old length: the
		// held ones go on after it.
		name: "speeds up 10x after warm-up, logging steps of the old length",
		script: loopScript{n: 700, iter: func(i int) ([]loopCall, int64) {
			if i < 50 || i%50 == 49 {
				return syncIter(300*ms, 0, 0, 0), 300 * ms
			}
			return syncIter(30*ms, 0, 0, 0), 30 * ms
		}},
	}, {
		name: "speeds up 25x after warm-up",
		script: loopScript{n: 700, iter: func(i int) ([]loopCall, int64) {
			if i < 30 {
				return syncIter(500*ms, 0, 0, 0), 500 * ms
			}
			return syncIter(20*ms, 0, 0, 0), 20 * ms
		}},
	}, {
		name: "an evaluation step, short and long, every 50",
		script: loopScript{n: 300, iter: func(i int) ([]loopCall, int64) {
			switch i % 50 {
			case 24:
				return syncIter(12*ms, 0, 0, 0), 12 * ms
			case 49:
				return syncIter(400*ms, 0, 0, 0), 400 * ms
			}
			return syncIter(40*ms, 0, 0, 0), 40 * ms
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{})
			c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 1, Host: "h0", Job: "j1"})
			s := tc.script
			// model.to("cuda"): the synchronisations before the loop
			pre, end := paramCopies(6, 0)
			s.pre, s.preNS = pre, end+1200*ms
			starts, ends := feedLoop(c, pid(0), s)
			checkIterations(t, c, starts, ends, 0, tc.after)
			if n := burstSteps(c); (n > 0) != tc.burst {
				t.Errorf("BurstSteps %d, want > 0: %v", n, tc.burst)
			} else {
				t.Logf("BurstSteps %d", n)
			}
		})
	}
}

// TestBurstIndicesAlikeOnRanks: two ranks of Megatron's cycle ("B S B S"
// per iteration, one communicator), the second one recorded from its
// 30th iteration (an agent attached late to it), and a burst of the same
// cycle between two iterations and after the last (an evaluation's
// barriers, the end of training): no steps of the burst, and step k is
// the same iteration on both ranks, indices without a gap.
func TestBurstIndicesAlikeOnRanks(t *testing.T) {
	const n = 300
	c := New(Config{})
	var calls []HostCall
	iters := map[int][][2]int64{}
	for r := range 2 {
		p := pid(r)
		c.SetRank(RankInfo{PID: p, Rank: r, LocalRank: r, WorldSize: 2, Host: "h0", Job: "j1"})
		if r == 0 {
			c.AddCommInit(CommInit{PID: p, Comm: 1, NRanks: 2, Rank: r, UniqueIDHash: 0x5eed})
		}
		from := int64(0)
		if r == 1 {
			from = 30
		}
		add := func(base int64, lc loopCall) {
			h := HostCall{PID: p, TID: p, StartNS: base + lc.at, EndNS: base + lc.at + lc.dur, Op: lc.op}
			if lc.sync {
				h.Kind = HostSyncWait
			} else {
				h.Kind, h.Count, h.Datatype, h.Comm = HostCollective, lc.count, 7, 1
			}
			calls = append(calls, h)
		}
		burst := func(base int64, k int) {
			for j := range k {
				// pairs 100 µs and 500 µs apart: a boundary every two
				at := int64(j/2)*600*us + int64(j%2)*100*us
				add(base, loopCall{op: "allreduce", count: 1, at: at, dur: 20 * us})
				add(base, loopCall{sync: true, op: "cudaDeviceSynchronize", at: at + 100*us, dur: 20 * us})
			}
		}
		t0 := 5*ms + int64(r)*30*us
		for i := range int64(n) {
			d := 70 * ms
			if i == 0 {
				d = 700 * ms
			}
			e := d - 1*ms
			if i >= from {
				for _, lc := range []loopCall{
					{sync: true, op: "cudaDeviceSynchronize", at: 100 * us, dur: 20 * us},
					{sync: true, op: "cudaDeviceSynchronize", at: e - 31*ms, dur: 30 * ms},
					{op: "allreduce", count: 1, at: e + 50*us, dur: 20 * us},
					{sync: true, op: "cudaDeviceSynchronize", at: e + 100*us, dur: 20 * us},
					{op: "allreduce", count: 1, at: e + 150*us, dur: 20 * us},
					{sync: true, op: "cudaDeviceSynchronize", at: e + 200*us, dur: 20 * us},
				} {
					add(t0, lc)
				}
			}
			iters[r] = append(iters[r], [2]int64{t0, t0 + d})
			t0 += d
			if i == 200 {
				// an evaluation's barriers between two iterations
				burst(t0, 40)
				iters[r][i][1] += 25 * ms
				t0 += 25 * ms
			}
		}
		burst(t0+300*ms, 60) // the end of training
	}
	sort.SliceStable(calls, func(a, b int) bool { return calls[a].EndNS < calls[b].EndNS })
	var steps []detector.Step
	for k, h := range calls {
		c.AddHostCall(h)
		if k%64 == 0 {
			c.Advance(h.EndNS)
			s, _ := c.Drain()
			steps = append(steps, s...)
		}
	}
	c.Advance(calls[len(calls)-1].EndNS + int64(10e9))
	s, _ := c.Flush()
	steps = append(steps, s...)
	iterOf := map[int64]map[int]int{}
	for r := range 2 {
		its := iters[r]
		var mine []detector.Step
		outside, after := 0, 0
		per := map[int]int{}
		for _, s := range steps {
			if s.Rank != r {
				continue
			}
			mine = append(mine, s)
			i := sort.Search(len(its), func(k int) bool { return its[k][1] >= s.EndNS })
			if i == len(its) {
				after++
				continue
			}
			if s.EndNS <= its[i][0] {
				outside++
				continue
			}
			per[i]++
			if iterOf[s.Step] == nil {
				iterOf[s.Step] = map[int]int{}
			}
			iterOf[s.Step][r] = i
		}
		want := n
		if r == 1 {
			want = n - 30
		}
		msg := fmt.Sprintf("rank %d: %d facts for %d iterations, %d outside, %d after the last", r, len(mine), want, outside, after)
		if d := len(mine) - want; d < -1 || d > 1 || outside > 0 || after > 1 || len(per) < want-1 {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
		checkContiguous(t, mine)
	}
	checkSameIterations(t, iterOf)
	var per []uint64
	for _, st := range c.Stats() {
		per = append(per, st.BurstSteps)
	}
	t.Logf("BurstSteps per rank %v", per)
	if len(per) != 2 || per[0] == 0 || per[0] != per[1] {
		t.Errorf("BurstSteps per rank %v, want the same burst on both", per)
	}
}
