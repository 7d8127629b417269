package correlate

import (
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// Every case runs 12 iterations of 10 ms; iteration i spans
// [i·10ms, (i+1)·10ms] and ends with the return of a synchronisation, so
// step k (k ≥ 0) is iteration k+1 (the first only opens the first step).
func TestPhases(t *testing.T) {
	const p = 100
	tests := []struct {
		name string
		iter func(b *batch, base int64)
		want map[string]float64
		gpu  bool
	}{{
		name: "overlapping compute and communication",
		iter: func(b *batch, base int64) {
			b.coll(p, 1, "allreduce", 1000, base+1*ms, base+1*ms+10*us)
			b.sync(p, base+8*ms, base+10*ms)
			b.kernel(p, ClassGEMM, "gemm", base+ms/2, base+5*ms+ms/2)
			b.kernel(p, ClassComm, "nccl", base+4*ms+ms/2, base+7*ms)
			b.copyRec(p, base+7*ms+ms/2, base+8*ms)
		},
		gpu: true,
		want: map[string]float64{"step": 10, "host": 8, "sync_wait": 2,
			"compute": 5.5, "comm": 2.5, "exposed_comm": 1.5, "idle": 3},
	}, {
		name: "communication hidden under compute; attention and moe",
		iter: func(b *batch, base int64) {
			b.coll(p, 1, "allreduce", 1000, base+1*ms, base+1*ms+10*us)
			b.sync(p, base+9*ms, base+10*ms)
			b.kernel(p, ClassAttention, "flash_fwd", base+1*ms, base+3*ms)
			b.kernel(p, ClassMoE, "grouped_gemm", base+3*ms, base+4*ms)
			b.kernel(p, ClassMoE, "grouped_gemm", base+3*ms+ms/2, base+5*ms)
			b.kernel(p, ClassComm, "nccl", base+2*ms, base+4*ms)
		},
		gpu: true,
		want: map[string]float64{"step": 10, "host": 9, "sync_wait": 1,
			"compute": 4, "comm": 2, "exposed_comm": 0, "idle": 6, "attention": 2, "moe": 2},
	}, {
		name: "nested and repeated synchronisation",
		iter: func(b *batch, base int64) {
			b.sync(p, base+1*ms, base+2*ms)
			b.sync(p, base+1*ms+ms/2, base+2*ms+ms/2) // another thread, overlapping
			b.sync(p, base+3*ms, base+3*ms+ms/2)
			b.coll(p, 1, "allreduce", 1000, base+4*ms, base+4*ms+10*us)
			b.sync(p, base+8*ms, base+10*ms)
		},
		want: map[string]float64{"step": 10, "host": 6, "sync_wait": 4},
	}, {
		name: "blocking collective waits",
		iter: func(b *batch, base int64) {
			b.collWait(p, "allreduce", base+2*ms, base+5*ms)
			b.host = append(b.host, HostCall{PID: p, Kind: HostCollWait, StartNS: base + 4*ms, EndNS: base + 6*ms}) // Work::wait
			b.sync(p, base+9*ms, base+10*ms)
		},
		want: map[string]float64{"step": 10, "host": 5, "sync_wait": 1, "coll_wait": 4},
	}, {
		name: "kernel straddling the boundary is clipped",
		iter: func(b *batch, base int64) {
			b.coll(p, 1, "allreduce", 1000, base+1*ms, base+1*ms+10*us)
			b.sync(p, base+8*ms, base+10*ms)
			b.kernel(p, ClassGEMM, "gemm", base-1*ms, base+1*ms) // ends in this step
		},
		gpu:  true,
		want: map[string]float64{"step": 10, "host": 8, "sync_wait": 2, "compute": 1, "comm": 0, "exposed_comm": 0, "idle": 9},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(Config{}, 0)
			if tc.gpu {
				c.AddCoverage(Coverage{PID: p, StartNS: 0})
			}
			var b batch
			for i := range 12 {
				tc.iter(&b, int64(i)*10*ms)
			}
			b.feed(c)
			steps, topos := c.Flush()
			if len(steps) != 11 {
				t.Fatalf("got %d steps, want 11; stats %+v", len(steps), c.Stats())
			}
			if len(topos) != 1 {
				t.Errorf("got %d topology facts, want 1", len(topos))
			}
			checkContiguous(t, steps)
			for k, s := range steps {
				if s.Step != int64(k) || s.StartNS != int64(k+1)*10*ms || s.EndNS != int64(k+2)*10*ms {
					t.Fatalf("step %d: index %d, span %d..%d", k, s.Step, s.StartNS, s.EndNS)
				}
				if s.GPU != tc.gpu || s.Kind != detector.KindStep || s.Job != "j1" || s.Host != "h0" || s.Topo != 1 {
					t.Fatalf("step %d: %+v", k, s)
				}
				if len(s.Phases) != len(tc.want) {
					t.Fatalf("step %d phases %v, want %v", k, s.Phases, tc.want)
				}
				for ph, v := range tc.want {
					got, ok := s.Phases[ph]
					if !ok || !near(got, v) {
						t.Fatalf("step %d phase %s = %v (present %v), want %v; all %v", k, ph, got, ok, v, s.Phases)
					}
				}
				if tc.gpu != (s.Workload != nil) {
					t.Fatalf("step %d workload %+v", k, s.Workload)
				}
				if s.Workload != nil && s.Workload.FP != steps[0].Workload.FP {
					t.Fatalf("fingerprint changed: %s vs %s", s.Workload.FP, steps[0].Workload.FP)
				}
			}
		})
	}
}

// Device collection on only for part of the run: steps fully inside the
// on-period have device phases; others have none (absent, not 0).
func TestCoverageDutyCycle(t *testing.T) {
	const p = 100
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: p, StartNS: 25 * ms, EndNS: 65 * ms})
	c.AddCoverage(Coverage{PID: p, StartNS: 90 * ms})                  // open
	c.AddCoverage(Coverage{PID: p, StartNS: 90 * ms, EndNS: 120 * ms}) // closes it
	var b batch
	for i := range 14 {
		base := int64(i) * 10 * ms
		b.coll(p, 1, "allreduce", 1000, base+1*ms, base+1*ms+10*us)
		b.sync(p, base+8*ms, base+10*ms)
		if base >= 20*ms && base < 70*ms || base >= 90*ms && base < 120*ms { // records only while on (roughly)
			b.kernel(p, ClassGEMM, "gemm", base+2*ms, base+6*ms)
		}
	}
	b.feed(c)
	steps, _ := c.Flush()
	for _, s := range steps {
		wantGPU := s.StartNS >= 25*ms && s.EndNS <= 65*ms || s.StartNS >= 90*ms && s.EndNS <= 120*ms
		if s.GPU != wantGPU {
			t.Errorf("step %d [%d,%d] gpu %v, want %v", s.Step, s.StartNS/ms, s.EndNS/ms, s.GPU, wantGPU)
		}
		for _, ph := range []string{"compute", "comm", "exposed_comm", "idle"} {
			if _, ok := s.Phases[ph]; ok != wantGPU {
				t.Errorf("step %d phase %s present %v", s.Step, ph, ok)
			}
		}
		if wantGPU && !near(s.Phases["compute"], 4) {
			t.Errorf("step %d compute %v", s.Step, s.Phases["compute"])
		}
		if (s.Workload != nil) != wantGPU {
			t.Errorf("step %d workload %v", s.Step, s.Workload)
		}
		if _, ok := s.Phases["host"]; !ok {
			t.Errorf("step %d lacks host", s.Step)
		}
	}
	if len(steps) != 13 {
		t.Fatalf("got %d steps", len(steps))
	}
}

// Without a synchronisation probe seen and without Probes, host phases are
// absent; with Probes set they are present even when zero.
func TestHostPhasePresence(t *testing.T) {
	for _, probes := range []Probes{0, ProbeSync | ProbeCollWait} {
		c := New(Config{ConfirmSpan: testSpan})
		c.SetRank(RankInfo{PID: 1, Rank: 0, Job: "j", Probes: probes})
		for i := range 40 {
			base := int64(i) * 10 * ms
			c.AddHostCall(HostCall{PID: 1, Kind: HostMarker, StartNS: base, EndNS: base + 1})
		}
		steps, _ := c.Flush()
		if len(steps) != 39 {
			t.Fatalf("probes %v: %d steps", probes, len(steps))
		}
		_, host := steps[0].Phases["host"]
		_, sw := steps[0].Phases["sync_wait"]
		_, cw := steps[0].Phases["coll_wait"]
		want := probes != 0
		if host != want || sw != want || cw != want {
			t.Errorf("probes %v: phases %v", probes, steps[0].Phases)
		}
		if want && (steps[0].Phases["host"] != 10 || steps[0].Phases["sync_wait"] != 0) {
			t.Errorf("probes %v: phases %v", probes, steps[0].Phases)
		}
	}
}
