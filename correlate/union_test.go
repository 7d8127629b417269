package correlate

import (
	"math/rand/v2"
	"testing"
)

// Union arithmetic against a bitmap, and the phase identities on random
// interval streams.
func TestUnionProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n, m := rng.IntN(12), rng.IntN(12)
		var bitA, bitB [200]bool
		var a, b []span
		for range n {
			s := rng.Int64N(190)
			e := s + rng.Int64N(200-s)
			a = append(a, span{s, e})
			for i := s; i < e; i++ {
				bitA[i] = true
			}
		}
		for range m {
			s := rng.Int64N(190)
			e := s + rng.Int64N(200-s)
			b = append(b, span{s, e})
			for i := s; i < e; i++ {
				bitB[i] = true
			}
		}
		var wa, wb, wab int64
		for i := range bitA {
			if bitA[i] {
				wa++
			}
			if bitB[i] {
				wb++
			}
			if bitA[i] || bitB[i] {
				wab++
			}
		}
		if got := unionNS(a); got != wa {
			t.Fatalf("trial %d: union %d, want %d (%v)", trial, got, wa, a)
		}
		if got := unionNS(b); got != wb {
			t.Fatalf("trial %d: union %d, want %d", trial, got, wb)
		}
		if got := unionMergedNS(a, b); got != wab {
			t.Fatalf("trial %d: merged union %d, want %d", trial, got, wab)
		}
	}
}

func TestSpanSetContains(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		var ss spanSet
		var bit [101]bool // bit[i]: point i covered
		for range rng.IntN(6) {
			s := rng.Int64N(100)
			e := s + rng.Int64N(100-s) + 1
			ss.add(s, e)
			for i := s; i <= e; i++ {
				bit[i] = true
			}
		}
		s := rng.Int64N(100)
		e := s + rng.Int64N(100-s) + 1
		// Closed spans: [s,e] is contained when every point and every gap
		// between consecutive points is covered; with integer spans of
		// length ≥ 1 that merge when touching, points suffice except for
		// gaps between two spans that touch at no point — none here since
		// touching spans share their end point.
		want := true
		for i := s; i <= e; i++ {
			want = want && bit[i]
		}
		// A gap can hide between adjacent covered points i and i+1 when
		// one span ends at i and the next starts at i+1.
		if want {
			for i := s; i < e; i++ {
				covered := false
				for _, v := range ss.v {
					if v.s <= i && v.e >= i+1 {
						covered = true
					}
				}
				want = want && covered
			}
		}
		if got := ss.contains(s, e); got != want {
			t.Fatalf("trial %d: contains(%d,%d) = %v, want %v; spans %v", trial, s, e, got, want, ss.v)
		}
	}
}

// Random steps: the phase identities of DESIGN.md section 3 hold.
func TestPhaseIdentities(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: pid(0), StartNS: 0})
	var b batch
	for i := range 200 {
		base := int64(i) * 10 * ms
		for range rng.IntN(4) {
			s := base + rng.Int64N(4*ms)
			b.sync(pid(0), s, s+rng.Int64N(3*ms))
		}
		b.coll(pid(0), 1, "allreduce", 5, base+5*ms, base+5*ms+us)
		for range rng.IntN(3) {
			s := base + 5*ms + rng.Int64N(2*ms)
			b.collWait(pid(0), "", s, s+rng.Int64N(2*ms))
		}
		b.sync(pid(0), base+8*ms, base+10*ms)
		for range rng.IntN(30) {
			s := base - 2*ms + rng.Int64N(12*ms)
			cls := []KernelClass{ClassComm, ClassGEMM, ClassAttention, ClassMoE, ClassOther}[rng.IntN(5)]
			b.kernel(pid(0), cls, "k", s, s+rng.Int64N(3*ms))
		}
	}
	for i := range b.host {
		if b.host[i].Kind == HostCollWait {
			b.host[i].Op = ""
		}
	}
	b.feed(c)
	steps, _ := c.Flush()
	if len(steps) < 190 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		ph := s.Phases
		blocked := ph["step"] - ph["host"]
		if ph["host"] < 0 || blocked < ph["sync_wait"]-1e-9 || blocked < ph["coll_wait"]-1e-9 || blocked > ph["sync_wait"]+ph["coll_wait"]+1e-9 {
			t.Fatalf("host phases %v", ph)
		}
		all := ph["step"] - ph["idle"]
		if ph["idle"] < 0 || ph["compute"] > all+1e-9 || ph["comm"] > all+1e-9 ||
			!near(ph["exposed_comm"], all-ph["compute"]) || ph["exposed_comm"] > ph["comm"]+1e-9 ||
			ph["attention"] > ph["compute"]+1e-9 || ph["moe"] > ph["compute"]+1e-9 {
			t.Fatalf("device phases %v", ph)
		}
	}
}

// A covered step settles as soon as device records passed its end by
// DeviceSlack, without waiting DeviceReorder.
func TestDeviceWatermark(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: pid(0), StartNS: 0})
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 20), 0, 10*ms, nil)
	b.feed(c)
	for i := range 10 {
		c.AddDevice(gemmAt(i, uint32(i+1))) // records up to 95 ms
	}
	c.Advance(400 * ms)
	steps, _ := c.Drain()
	if len(steps) != 3 || steps[2].EndNS != 40*ms {
		t.Fatalf("steps %v", steps)
	}
	for i := 10; i < 20; i++ {
		c.AddDevice(gemmAt(i, uint32(i+1)))
	}
	steps, _ = c.Drain()
	if len(steps) != 10 { // steps ending 50..140 ms: device records reach 195 ms
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		if !s.GPU || !near(s.Phases["compute"], 4) {
			t.Fatalf("step %+v", s)
		}
	}
}
