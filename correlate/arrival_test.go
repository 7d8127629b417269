package correlate

import (
	"testing"
)

func twoRanks(t *testing.T) *Correlator {
	t.Helper()
	c := newTest(Config{}, 0, 1)
	for r := range 2 {
		c.AddCommInit(CommInit{PID: pid(r), Comm: uint64(0x10 + r), NRanks: 2, Rank: r, UniqueIDHash: 0xfeed})
	}
	return c
}

func commOf(b *batch) {
	for i := range b.host {
		if b.host[i].Kind == HostCollective {
			b.host[i].Comm = uint64(0x10 + b.host[i].PID - 100)
		}
	}
}

func TestArrivalOrder(t *testing.T) {
	tests := []struct {
		name     string
		skew     func(r, i int) int64
		commMS   [2]int64 // device communication time per rank; 0: no device records
		wantLast [2]*bool
		wantLag  [2]float64
	}{{
		name:     "rank 1 arrives 2 ms late",
		skew:     func(r, _ int) int64 { return map[int]int64{0: -2 * ms, 1: 0}[r] },
		wantLast: [2]*bool{ptr(false), ptr(true)},
		wantLag:  [2]float64{0, 2},
	}, {
		name:     "rank 0 arrives 1 ms late",
		skew:     func(r, _ int) int64 { return map[int]int64{0: 0, 1: -1 * ms}[r] },
		wantLast: [2]*bool{ptr(true), ptr(false)},
		wantLag:  [2]float64{1, 0},
	}, {
		name:     "tie broken by device: the last waits least",
		skew:     func(r, _ int) int64 { return map[int]int64{0: -5 * us, 1: 0}[r] },
		commMS:   [2]int64{5, 3},
		wantLast: [2]*bool{ptr(false), ptr(true)},
		wantLag:  [2]float64{0, 0.005},
	}, {
		name:     "tie without device evidence: no verdict",
		skew:     func(int, int) int64 { return 0 },
		wantLast: [2]*bool{nil, nil},
		wantLag:  [2]float64{0, 0},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := twoRanks(t)
			var b batch
			simulate(&b, []uint32{pid(0), pid(1)}, 0, repeat("AB S", 20), 0, 10*ms, tc.skew)
			commOf(&b)
			if tc.commMS[0] > 0 {
				for r := range 2 {
					c.AddCoverage(Coverage{PID: pid(r), StartNS: 0})
					for i := range 20 {
						base := int64(i) * 10 * ms
						b.kernel(pid(r), ClassComm, "nccl", base+4*ms, base+4*ms+tc.commMS[r]*ms)
					}
				}
			}
			b.feed(c)
			steps, _ := c.Flush()
			m := byRank(steps)
			for r := range 2 {
				if len(m[r]) != 20 { // iteration 0 starts at the creation
					t.Fatalf("rank %d: %d steps", r, len(m[r]))
				}
				for _, s := range m[r] {
					if (s.LastArrival == nil) != (tc.wantLast[r] == nil) ||
						s.LastArrival != nil && *s.LastArrival != *tc.wantLast[r] {
						t.Fatalf("rank %d step %d last %v, want %v", r, s.Step, deref(s.LastArrival), deref(tc.wantLast[r]))
					}
					if s.ArrivalLagMS == nil || !near(*s.ArrivalLagMS, tc.wantLag[r]) {
						t.Fatalf("rank %d step %d lag %v, want %v", r, s.Step, deref(s.ArrivalLagMS), tc.wantLag[r])
					}
				}
			}
		})
	}
}

// A rank whose peer on this host stops reporting is not held forever.
func TestArrivalBoundedWait(t *testing.T) {
	c := twoRanks(t)
	var b batch
	simulate(&b, []uint32{pid(0)}, 0, repeat("AB S", 20), 0, 10*ms, func(int, int) int64 { return -ms })
	simulate(&b, []uint32{pid(1)}, 0, repeat("AB S", 8), 0, 10*ms, nil)
	commOf(&b)
	b.feed(c)
	c.Advance(1500 * ms)
	steps, _ := c.Drain()
	m := byRank(steps)
	if len(m[0]) != 20 || len(m[1]) != 8 { // iteration 0 starts at the creation
		t.Fatalf("rank 0: %d steps, rank 1: %d", len(m[0]), len(m[1]))
	}
	for _, s := range m[0] {
		if s.Step < 8 && (s.LastArrival == nil || *s.LastArrival || s.ArrivalLagMS == nil || *s.ArrivalLagMS != 0) {
			t.Fatalf("step %d arrival evidence %v %v", s.Step, deref(s.LastArrival), deref(s.ArrivalLagMS))
		}
		if s.Step >= 8 && (s.LastArrival != nil || s.ArrivalLagMS != nil) {
			t.Fatalf("step %d without a peer has arrival evidence", s.Step)
		}
	}
	for _, s := range m[1] {
		if s.LastArrival == nil || !*s.LastArrival || s.ArrivalLagMS == nil || !near(*s.ArrivalLagMS, 1) {
			t.Fatalf("rank 1 step %d arrival evidence %v %v", s.Step, deref(s.LastArrival), deref(s.ArrivalLagMS))
		}
	}
	if c.Stats()[0].ArrivalTimeout == 0 {
		t.Errorf("no arrival timeout counted")
	}
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
