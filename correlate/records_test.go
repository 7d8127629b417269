package correlate

import (
	"testing"
)

func gemmAt(i int, corr uint32) DeviceInterval {
	base := int64(i) * 10 * ms
	return DeviceInterval{PID: pid(0), Kind: DeviceKernel, Class: ClassGEMM, Name: "gemm", StartNS: base + 1*ms, EndNS: base + 5*ms, Corr: corr}
}

// Device records out of order within the allowance are placed by their
// end; duplicates and records after their step was settled are counted and
// do not change any step.
func TestDuplicateLateReordered(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: pid(0), StartNS: 0})
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 20), 0, 10*ms, nil)
	b.feed(c)
	for i := 19; i >= 0; i-- { // reversed delivery
		c.AddDevice(gemmAt(i, uint32(i+1)))
	}
	c.AddDevice(gemmAt(3, 4)) // duplicate
	c.AddDevice(gemmAt(4, 5)) // duplicate
	c.Advance(200*ms + 4000*ms)
	steps, _ := c.Drain()
	if len(steps) != 19 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		if !s.GPU || !near(s.Phases["compute"], 4) || !near(s.Phases["idle"], 6) {
			t.Fatalf("step %d: gpu %v phases %v", s.Step, s.GPU, s.Phases)
		}
	}
	c.AddDevice(gemmAt(5, 999)) // late: its step is settled
	c.AddDevice(gemmAt(7, 8))   // duplicate of a settled record
	st := c.Stats()[0]
	if st.Duplicate != 3 || st.Late != 1 || st.Reordered != 19 {
		t.Fatalf("stats %+v", st)
	}
	if more, _ := c.Flush(); len(more) != 0 {
		t.Fatalf("late records produced steps: %v", more)
	}
}

// Records lost by capture are never a normal sample: a device loss turns
// the step gpu:false, a host loss drops the step.
func TestCaptureLoss(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: pid(0), StartNS: 0})
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 20), 0, 10*ms, nil)
	b.feed(c)
	for i := range 20 {
		c.AddDevice(gemmAt(i, uint32(i+1)))
	}
	c.AddDrop(Drop{PID: pid(0), Device: 3, FromNS: 55 * ms, ToNS: 56 * ms})
	c.AddDrop(Drop{Host: 1, FromNS: 125 * ms, ToNS: 125 * ms})
	steps, _ := c.Flush()
	if len(steps) != 18 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, s := range steps {
		if s.StartNS < 125*ms && s.EndNS >= 125*ms {
			t.Fatalf("step %d overlaps a host loss", s.Step)
		}
		wantGPU := !(s.StartNS < 56*ms && s.EndNS >= 55*ms)
		if s.GPU != wantGPU {
			t.Fatalf("step %d gpu %v", s.Step, s.GPU)
		}
		if _, ok := s.Phases["compute"]; ok != wantGPU {
			t.Fatalf("step %d phases %v", s.Step, s.Phases)
		}
	}
	st := c.Stats()[0]
	if st.DroppedDevice != 3 || st.DroppedHost != 1 || st.InvalidSteps != 1 || st.DegradedSteps != 1 {
		t.Fatalf("stats %+v", st)
	}
}
